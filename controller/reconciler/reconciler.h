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
#include "controller/agents/agent_pods.h"
#include "controller/kube/kube_client_interface.h"
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

/// The shared pool of a controller started without Prometheus: none (only jobs with their own
/// agent pods, spec.agents, run).
class NoSharedPool : public InventorySourceInterface {
 public:
  StatusOr<std::vector<AgentInventory>> Inventory() override {
    return FailedPreconditionError(
        "the shared agent pool needs hydra-controller --prometheus-url; without it only jobs "
        "with spec.agents (their own agent pods) run");
  }
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
  /// What the controller adds to the agent pods of jobs with spec.agents (ports, the roots
  /// inside the pod, the identity their agents require of the controller).
  AgentPodOptions agent_pods;
  /// Set: the agent pods of jobs with spec.agents serve TLS: each job gets a certificate of its
  /// own (AgentServerName) signed by this CA, in the Secret AgentTlsSecretName of its namespace,
  /// and each pod's agent is checked against that name. Unset: plaintext (--insecure).
  std::shared_ptr<const CertificateAuthority> agent_pod_ca;
  std::chrono::hours agent_cert_validity{24 * 365};
  /// A job's certificate is issued again for new pods once it has less than this left.
  std::chrono::hours agent_cert_renew_before{24 * 30};
};

/// Most shards a trial's status entry lists (the plan's totals are always there): the job's
/// status stays small whatever the plans (docs/manifest.md: status size).
inline constexpr int kMaxStatusShards = 8;
/// Longest message a status entry or condition keeps, in bytes.
inline constexpr size_t kMaxStatusMessageBytes = 256;

struct AgentMemory;

/// Reconciles one MultiModelJob at a time, level-based: it recomputes everything from the
/// object, the agents' reports, the job's agent pods and the inventory, never assuming it ran
/// before. One pass runs the phases of phases.h in order. Thread-safe for different jobs.
class Reconciler {
 public:
  /// All borrowed.
  Reconciler(kube::KubeClientInterface* kube, AgentPoolInterface* agents,
             InventorySourceInterface* inventory, ReconcilerOptions options);
  ~Reconciler();

  StatusOr<ReconcileResult> Reconcile(const std::string& ns, const std::string& name);

 private:
  kube::KubeClientInterface* kube_;
  AgentPoolInterface* agents_;
  InventorySourceInterface* inventory_;
  ReconcilerOptions options_;
  std::unique_ptr<AgentMemory> memory_;
};

/// The MultiModelJob object as `hydra run`'s parser reads it (apiVersion, kind, name,
/// namespace, spec), as JSON text (which is YAML).
std::string ManifestText(const kube::Json& job);

}  // namespace hydra::controller
