#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "common/status.h"
#include "controller/agentclient/agent_client.h"
#include "controller/kube/kube_client.h"
#include "controller/placement/placement.h"

namespace hydra::controller {

inline const kube::ResourceKind kMultiModelJobs{"hydra.dev", "v1alpha1", "multimodeljobs", true};

/// Where the agent inventory comes from; cached, so that many reconciles share one query.
class InventorySourceInterface {
 public:
  virtual ~InventorySourceInterface() = default;
  virtual StatusOr<std::vector<AgentInventory>> Inventory() = 0;
};

/// Prometheus-backed inventory, re-queried at most every `max_age`.
class CachedPrometheusInventory : public InventorySourceInterface {
 public:
  CachedPrometheusInventory(std::string prometheus_url, std::chrono::milliseconds max_age);
  StatusOr<std::vector<AgentInventory>> Inventory() override;

 private:
  PrometheusClient prometheus_;
  std::chrono::milliseconds max_age_;
  std::mutex mu_;
  std::chrono::steady_clock::time_point fetched_at_{};
  StatusOr<std::vector<AgentInventory>> cached_ = UnavailableError("not fetched yet");
};

/// What a reconcile pass did, for metrics.
struct ReconcileResult {
  std::chrono::milliseconds requeue_after{0};  ///< 0: until the next watch event
  int assigned = 0;
  std::map<std::string, int> trials_by_state;
  /// Trials this pass sent back to placement (or failed for spec.maxRestarts), by reason:
  /// agent_lost, agent_drained, agent_forgot, cancelled. Only passes whose status write
  /// landed report them, so a retried pass does not count twice.
  std::map<std::string, int> restarts_by_reason;
  /// Agents this pass found lost (each counted once until it answers again).
  int agents_lost = 0;
};

struct ReconcilerOptions {
  std::string data_root;        ///< relative spec.dataset.path resolves against it
  std::string checkpoint_root;  ///< trials checkpoint to <root>/<namespace>/<job>/<trial>
  std::string component = "hydra-controller";       ///< Event source and field manager
  std::chrono::milliseconds progress_resync{2000};  ///< re-read agents while trials train
  /// An agent is lost (its trials move) once it has not answered for this long and
  /// Prometheus no longer lists it (a blip in one of the two is tolerated).
  std::chrono::milliseconds agent_lost_after{15000};
};

/// Reconciles one MultiModelJob at a time, level-based: it recomputes everything from the
/// object, the agents' reports and the inventory, never assuming it ran before. Thread-safe
/// for different jobs.
class Reconciler {
 public:
  /// All borrowed.
  Reconciler(kube::KubeClient* kube, AgentPoolInterface* agents,
             InventorySourceInterface* inventory, ReconcilerOptions options);

  StatusOr<ReconcileResult> Reconcile(const std::string& ns, const std::string& name);

 private:
  Status Finalize(kube::Json& job);
  void Event(const kube::Json& job, const std::string& type, const std::string& reason,
             const std::string& message);

  kube::KubeClient* kube_;
  AgentPoolInterface* agents_;
  InventorySourceInterface* inventory_;
  ReconcilerOptions options_;
  std::mutex lost_mu_;
  std::set<std::string> lost_agents_;  ///< endpoints found lost that have not answered since
};

/// Sets condition `type` in a status's conditions array; lastTransitionTime changes only when
/// the status flips. Returns true if anything changed.
bool SetCondition(kube::Json& conditions, const std::string& type, bool status,
                  const std::string& reason, const std::string& message, int64_t generation);

/// The MultiModelJob object as `hydra run`'s parser reads it (apiVersion, kind, name,
/// namespace, spec), as JSON text (which is YAML).
std::string ManifestText(const kube::Json& job);

}  // namespace hydra::controller
