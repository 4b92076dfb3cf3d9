#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "common/status.h"
#include "controller/kube/kube_config.h"

namespace hydra::kube {

using Json = nlohmann::json;

/// A resource type of the API: where its objects live.
struct ResourceKind {
  std::string group;    ///< "" for the core group
  std::string version;  ///< "v1", "v1alpha1"
  std::string plural;   ///< "configmaps", "multimodeljobs"
  bool namespaced = true;
};

inline const ResourceKind kConfigMaps{"", "v1", "configmaps", true};
inline const ResourceKind kNamespaces{"", "v1", "namespaces", false};
inline const ResourceKind kEvents{"", "v1", "events", true};
inline const ResourceKind kServiceAccounts{"", "v1", "serviceaccounts", true};
inline const ResourceKind kLeases{"coordination.k8s.io", "v1", "leases", true};
inline const ResourceKind kCustomResourceDefinitions{"apiextensions.k8s.io", "v1",
                                                     "customresourcedefinitions", false};

/// API errors become these codes, with the server's message ("403 Forbidden: configmaps is
/// forbidden: User ... cannot list ..."):
///   400, 422 -> INVALID_ARGUMENT; 401, 403 -> PERMISSION_DENIED; 404 -> NOT_FOUND;
///   409 AlreadyExists -> ALREADY_EXISTS, other 409 (a stale resourceVersion) -> ABORTED;
///   410 Gone (an expired resourceVersion) -> OUT_OF_RANGE; 429 -> RESOURCE_EXHAUSTED;
///   504 -> DEADLINE_EXCEEDED; other 5xx and connection failures -> UNAVAILABLE.
bool IsConflict(const Status& s);  ///< ABORTED: re-read and retry the update
bool IsGone(const Status& s);      ///< OUT_OF_RANGE: relist

/// Retries of 429 and 5xx answers (and refused connections): exponential backoff from
/// `initial` doubling to `max`, or the server's Retry-After when it sends one.
struct RetryPolicy {
  int attempts = 5;
  std::chrono::milliseconds initial{200};
  std::chrono::milliseconds max{5000};
};

enum class PatchType { kMerge, kJson, kStrategicMerge };

/// One event of a watch stream.
struct WatchEvent {
  std::string type;  ///< ADDED | MODIFIED | DELETED | BOOKMARK | ERROR
  Json object;
};

/// A Kubernetes REST client on cpprestsdk. Objects are JSON (nlohmann). Thread-safe.
class KubeClient {
 public:
  /// Checks the configuration (server URL, PEM blocks) and prepares the HTTP client.
  static StatusOr<std::unique_ptr<KubeClient>> Create(const KubeConfig& config,
                                                      RetryPolicy retry = {});
  ~KubeClient();

  const KubeConfig& config() const;
  /// HTTP requests sent so far (retries and watch requests included).
  int64_t requests() const;

  /// The collection path: /api/v1/namespaces/NS/configmaps, /apis/G/V/PLURAL, ...
  static std::string Path(const ResourceKind& kind, const std::string& ns,
                          const std::string& name = "", const std::string& subresource = "");

  StatusOr<Json> Get(const ResourceKind& kind, const std::string& ns, const std::string& name);
  /// Every page (limit per request, following metadata.continue); returns the list object
  /// with all items and the resourceVersion of the first page's snapshot.
  StatusOr<Json> List(const ResourceKind& kind, const std::string& ns,
                      const std::string& label_selector = "", int64_t page_size = 500);
  StatusOr<Json> Create(const ResourceKind& kind, const std::string& ns, const Json& object);
  /// PUT: metadata.resourceVersion must be current, else ABORTED (conflict).
  StatusOr<Json> Update(const ResourceKind& kind, const std::string& ns, const Json& object);
  /// PUT to the status subresource.
  StatusOr<Json> UpdateStatus(const ResourceKind& kind, const std::string& ns, const Json& object);
  /// NOT_FOUND if it is already gone.
  Status Delete(const ResourceKind& kind, const std::string& ns, const std::string& name);
  StatusOr<Json> Patch(const ResourceKind& kind, const std::string& ns, const std::string& name,
                       PatchType type, const Json& patch, const std::string& subresource = "");
  /// Server-side apply of `object` (which names itself) as `field_manager`.
  StatusOr<Json> Apply(const ResourceKind& kind, const std::string& ns, const Json& object,
                       const std::string& field_manager, bool force = true,
                       const std::string& subresource = "");

  /// Any request: `path_and_query` from the server root, a JSON body (null: none).
  StatusOr<Json> Request(const std::string& method, const std::string& path_and_query,
                         const Json& body = nullptr,
                         const std::string& content_type = "application/json");

  /// One watch request from `resource_version` (with bookmarks): calls `on_event` for each
  /// event until it returns false, the server ends the stream (after `timeout_seconds`), the
  /// connection drops (UNAVAILABLE) or `stop` reads true. 410 -> OUT_OF_RANGE. Blocks.
  Status WatchOnce(const ResourceKind& kind, const std::string& ns,
                   const std::string& resource_version, int timeout_seconds,
                   const std::function<bool(const WatchEvent&)>& on_event,
                   const std::atomic<bool>* stop = nullptr);

  /// Runs `mutate(object)` on the current object and updates it, re-reading and retrying on
  /// conflicts (at most `attempts` times). `mutate` returns false to skip the update.
  StatusOr<Json> UpdateWithRetry(const ResourceKind& kind, const std::string& ns,
                                 const std::string& name, const std::function<bool(Json&)>& mutate,
                                 int attempts = 10, bool status = false);

 private:
  struct Impl;
  explicit KubeClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace hydra::kube
