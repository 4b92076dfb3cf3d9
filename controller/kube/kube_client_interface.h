#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "common/status.h"

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
inline const ResourceKind kPods{"", "v1", "pods", true};
inline const ResourceKind kSecrets{"", "v1", "secrets", true};
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

enum class PatchType { kMerge, kJson, kStrategicMerge };

/// One event of a watch stream.
struct WatchEvent {
  std::string type;  ///< ADDED | MODIFIED | DELETED | BOOKMARK | ERROR
  Json object;
};

/// The Kubernetes API as the controller uses it: objects are JSON. `KubeClient` talks to a real
/// API server; tests of one component use `fakes::FakeKubeClient`. Implementations are
/// thread-safe.
class KubeClientInterface {
 public:
  virtual ~KubeClientInterface() = default;

  virtual StatusOr<Json> Get(const ResourceKind& kind, const std::string& ns,
                             const std::string& name) = 0;
  /// Every page; returns the list object with all items and the resourceVersion of the
  /// snapshot. `label_selector`: equality terms joined by commas ("a=b,c=d").
  virtual StatusOr<Json> List(const ResourceKind& kind, const std::string& ns,
                              const std::string& label_selector = "", int64_t page_size = 500) = 0;
  virtual StatusOr<Json> Create(const ResourceKind& kind, const std::string& ns,
                                const Json& object) = 0;
  /// PUT: metadata.resourceVersion must be current, else ABORTED (conflict).
  virtual StatusOr<Json> Update(const ResourceKind& kind, const std::string& ns,
                                const Json& object) = 0;
  /// PUT to the status subresource.
  virtual StatusOr<Json> UpdateStatus(const ResourceKind& kind, const std::string& ns,
                                      const Json& object) = 0;
  /// NOT_FOUND if it is already gone. A graceful delete: an object with finalizers, or a pod
  /// on a node, stays (with a deletionTimestamp) until they are done.
  virtual Status Delete(const ResourceKind& kind, const std::string& ns,
                        const std::string& name) = 0;
  virtual StatusOr<Json> Patch(const ResourceKind& kind, const std::string& ns,
                               const std::string& name, PatchType type, const Json& patch,
                               const std::string& subresource = "") = 0;
  /// Server-side apply of `object` (which names itself) as `field_manager`.
  virtual StatusOr<Json> Apply(const ResourceKind& kind, const std::string& ns, const Json& object,
                               const std::string& field_manager, bool force = true,
                               const std::string& subresource = "") = 0;
  /// One watch request from `resource_version` (with bookmarks): calls `on_event` for each
  /// event until it returns false, the server ends the stream (after `timeout_seconds`), the
  /// connection drops (UNAVAILABLE) or `stop` reads true. 410 -> OUT_OF_RANGE. Blocks.
  virtual Status WatchOnce(const ResourceKind& kind, const std::string& ns,
                           const std::string& resource_version, int timeout_seconds,
                           const std::function<bool(const WatchEvent&)>& on_event,
                           const std::atomic<bool>* stop = nullptr) = 0;
  /// Requests sent so far (retries and watch requests included).
  virtual int64_t requests() const = 0;

  /// Runs `mutate(object)` on the current object and updates it (or its status), re-reading
  /// and retrying on conflicts (at most `attempts` times). `mutate` returns false to skip the
  /// update.
  StatusOr<Json> UpdateWithRetry(const ResourceKind& kind, const std::string& ns,
                                 const std::string& name, const std::function<bool(Json&)>& mutate,
                                 int attempts = 10, bool status = false);
};

}  // namespace hydra::kube
