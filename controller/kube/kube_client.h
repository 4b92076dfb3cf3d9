#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "common/status.h"
#include "controller/kube/kube_client_interface.h"
#include "controller/kube/kube_config.h"

namespace hydra::kube {

/// Retries of 429 and 5xx answers (and refused connections): exponential backoff from
/// `initial` doubling to `max`, or the server's Retry-After when it sends one.
struct RetryPolicy {
  int attempts = 5;
  std::chrono::milliseconds initial{200};
  std::chrono::milliseconds max{5000};
};

/// A Kubernetes REST client on cpprestsdk (KubeClientInterface's methods say what each call
/// does). Objects are JSON (nlohmann). Thread-safe.
class KubeClient : public KubeClientInterface {
 public:
  /// Checks the configuration (server URL, PEM blocks) and prepares the HTTP client.
  static StatusOr<std::unique_ptr<KubeClient>> Create(const KubeConfig& config,
                                                      RetryPolicy retry = {});
  ~KubeClient() override;

  const KubeConfig& config() const;
  int64_t requests() const override;

  /// The collection path: /api/v1/namespaces/NS/configmaps, /apis/G/V/PLURAL, ...
  static std::string Path(const ResourceKind& kind, const std::string& ns,
                          const std::string& name = "", const std::string& subresource = "");

  StatusOr<Json> Get(const ResourceKind& kind, const std::string& ns,
                     const std::string& name) override;
  /// Pages of `page_size` (following metadata.continue); the resourceVersion is the first
  /// page's snapshot.
  StatusOr<Json> List(const ResourceKind& kind, const std::string& ns,
                      const std::string& label_selector = "", int64_t page_size = 500) override;
  StatusOr<Json> Create(const ResourceKind& kind, const std::string& ns,
                        const Json& object) override;
  StatusOr<Json> Update(const ResourceKind& kind, const std::string& ns,
                        const Json& object) override;
  StatusOr<Json> UpdateStatus(const ResourceKind& kind, const std::string& ns,
                              const Json& object) override;
  Status Delete(const ResourceKind& kind, const std::string& ns, const std::string& name) override;
  StatusOr<Json> Patch(const ResourceKind& kind, const std::string& ns, const std::string& name,
                       PatchType type, const Json& patch,
                       const std::string& subresource = "") override;
  StatusOr<Json> Apply(const ResourceKind& kind, const std::string& ns, const Json& object,
                       const std::string& field_manager, bool force = true,
                       const std::string& subresource = "") override;
  Status WatchOnce(const ResourceKind& kind, const std::string& ns,
                   const std::string& resource_version, int timeout_seconds,
                   const std::function<bool(const WatchEvent&)>& on_event,
                   const std::atomic<bool>* stop = nullptr) override;

  /// Any request: `path_and_query` from the server root, a JSON body (null: none).
  StatusOr<Json> Request(const std::string& method, const std::string& path_and_query,
                         const Json& body = nullptr,
                         const std::string& content_type = "application/json");

 private:
  struct Impl;
  explicit KubeClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace hydra::kube
