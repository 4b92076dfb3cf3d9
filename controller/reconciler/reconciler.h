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

/// Prometheus-backed inventory of the agents' own scrape job (`agent_scrape_job`, "" for
/// any), re-queried at most every `max_age`.
class CachedPrometheusInventory : public InventorySourceInterface {
 public:
  CachedPrometheusInventory(std::string prometheus_url, std::string agent_scrape_job,
                            std::chrono::milliseconds max_age);
  StatusOr<std::vector<AgentInventory>> Inventory() override;

 private:
  PrometheusClient prometheus_;
  std::string agent_scrape_job_;
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

/// Most shards a trial's status entry lists (the plan's totals are always there): the job's
/// status stays small whatever the plans (docs/manifest.md: status size).
inline constexpr int kMaxStatusShards = 8;
/// Longest message a status entry or condition keeps, in bytes.
inline constexpr size_t kMaxStatusMessageBytes = 256;

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
  struct Pass;  // one pass's state (reconciler.cc)
  Status Finalize(kube::Json& job);
  /// The spec through `hydra run`'s parser; false (with the InvalidSpec status written) when
  /// it is invalid.
  StatusOr<bool> LoadTrials(Pass& pass);
  /// The inventory and every relevant agent's latest report.
  void ReadAgents(Pass& pass);
  /// Each placed trial's entry from its agent's report; lost, drained and forgotten trials go
  /// back to placement.
  void FollowTrials(Pass& pass);
  /// Adopts copies an earlier pass assigned but could not record; cancels stale copies.
  void AdoptOrCancelStale(Pass& pass);
  /// Early stopping (spec.search.earlyStopping): decides over the stored evaluations and the
  /// agents' reports, into the status entries.
  void StopEarly(Pass& pass);
  /// After the status write: tells each agent what its trials' entries say and its report does
  /// not yet show: a step limit or a stop (LimitTrial), or with spec.suspend a suspension
  /// (FollowTrials then records the trial Interrupted; PlaceWaiting places nothing).
  void TellAgents(Pass& pass);
  /// The inventory's agents whose own GetStatus confirms the node and devices they claim.
  std::vector<AgentInventory> ConfirmedAgents(const Pass& pass);
  /// Places waiting trials, each with a fresh attempt number reserved in the stored status
  /// before any agent is called. False when the reservation lost a write conflict.
  StatusOr<bool> PlaceWaiting(Pass& pass);
  /// Counts, best trial, conditions and the Events of this pass's transitions.
  void Summarize(Pass& pass);
  /// Writes `pass.status` (with the entries in grid order) if it changed. False on a conflict.
  StatusOr<bool> WriteStatus(Pass& pass);
  void Requeue(Pass& pass, const std::string& trial, kube::Json& e, const std::string& reason,
               const std::string& why);
  void Event(const kube::Json& job, const std::string& type, const std::string& reason,
             const std::string& message);

  kube::KubeClient* kube_;
  AgentPoolInterface* agents_;
  InventorySourceInterface* inventory_;
  ReconcilerOptions options_;
  std::mutex lost_mu_;
  std::set<std::string> lost_agents_;         ///< endpoints found lost that have not answered since
  std::set<std::string> unconfirmed_logged_;  ///< agents whose claims we logged as unconfirmed
};

/// Sets condition `type` in a status's conditions array; lastTransitionTime changes only when
/// the status flips. Returns true if anything changed.
bool SetCondition(kube::Json& conditions, const std::string& type, bool status,
                  const std::string& reason, const std::string& message, int64_t generation);

/// Whether a trial's status entry says an agent holds it (queued or training there). A suspended
/// trial (Interrupted) is on no agent though its entry names the one it left.
bool OnAgent(const kube::Json& entry);

/// Fills a trial's status entry from its agent's report: state, step, losses, checkpoint, shard
/// plan (at most kMaxStatusShards shards) and message (at most kMaxStatusMessageBytes).
void ApplyTrialReport(const v1::TrialStatus& report, kube::Json& entry);

/// The MultiModelJob object as `hydra run`'s parser reads it (apiVersion, kind, name,
/// namespace, spec), as JSON text (which is YAML).
std::string ManifestText(const kube::Json& job);

}  // namespace hydra::controller
