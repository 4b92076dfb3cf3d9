#pragma once
// One reconcile pass over one MultiModelJob: the state its phases share (typed, from the job's
// spec and status, the agents' reports and the job's agent pods), and what the phases use
// besides it. The phases are declared in phases.h.

#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/job.h"
#include "controller/agentclient/agent_client.h"
#include "controller/agents/agent_pods.h"
#include "controller/agents/pod_state.h"
#include "controller/kube/kube_client_interface.h"
#include "controller/placement/placement.h"
#include "controller/reconciler/job_status.h"
#include "controller/reconciler/reconciler.h"

namespace hydra::controller {

/// What passes remember across jobs and passes: agents found lost (counted once until they
/// answer again) and agents whose claims were logged as unconfirmed (logged once).
struct AgentMemory {
  std::mutex mu;
  std::set<std::string> lost;
  std::set<std::string> unconfirmed_logged;
  /// The endpoints each job with its own pods polled at its last pass (by namespace/name/uid):
  /// those its next pass no longer names are forgotten at once.
  std::map<std::string, std::set<std::string>> own_endpoints;
};

/// What a pass uses besides its own state; all borrowed.
struct ReconcileContext {
  kube::KubeClientInterface* kube = nullptr;
  AgentPoolInterface* agents = nullptr;
  InventorySourceInterface* inventory = nullptr;
  const ReconcilerOptions* options = nullptr;
  AgentMemory* memory = nullptr;
  /// The time conditions and status carry ("2026-11-24T10:00:00Z").
  std::function<std::string()> now;

  /// Records an Event on `job`; best effort (a failure is not the pass's failure).
  void Event(const kube::Json& job, const std::string& type, const std::string& reason,
             const std::string& message) const;
};

/// The job's own agent pods (spec.agents) as this pass saw and changed them.
struct JobPods {
  std::vector<AgentPodView> pods;  ///< listed, then with the pods this pass created
  std::set<std::string> removing;  ///< deleted by this pass (not placed on)
  int desired = 0;
  std::string problem;  ///< why pods could not be listed or created (Degraded)
  /// Pods that exist and are not ending (not failed, not terminating, not removed now).
  std::vector<const AgentPodView*> Live() const;
  /// The live pod whose agent is at `endpoint`, or null.
  const AgentPodView* AtEndpoint(const std::string& endpoint) const;
};

struct Pass {
  // The job.
  std::string ns, name, uid;
  int64_t generation = 1;
  kube::Json job;         ///< as read, then as last written (its resourceVersion)
  JobStatus read_status;  ///< as read: this pass's transitions (Events) are against it
  kube::Json stored;      ///< the status as last stored: a write happens only when it differs
  JobStatus status;       ///< what this pass computes; its trials come from `entries`
  bool wrote = false;     ///< a status write of this pass landed

  // Its spec.
  std::vector<Trial> trials;  ///< grid order
  std::map<std::string, Trial> by_name;
  std::map<std::string, TrialEntry> entries;  ///< status.trials by trial name
  int64_t max_restarts = 10;
  EarlyStoppingSpec early_stopping;
  bool suspend = false;                  ///< spec.suspend
  std::optional<AgentsSpec> own_agents;  ///< spec.agents: the job runs on its own pods

  // Its agents: the shared pool's inventory, or its own pods'.
  StatusOr<std::vector<AgentInventory>> inventory = UnavailableError("not read");
  /// Endpoints known to be alive: in the shared pool's inventory, or the job's live pods.
  std::set<std::string> in_inventory;
  std::vector<std::string> endpoints;  ///< tracked this pass
  std::map<std::string, v1::GetStatusResponse> reports;
  /// Tracked endpoints without a report whose first answer is still to be expected
  /// (AgentPoolInterface::FirstAnswerDue, asked before their reports were read).
  std::set<std::string> first_answer_due;
  std::map<std::string, int> load;  ///< unfinished trials per agent, from the agents
  JobPods pods;                     ///< spec.agents only

  // What the phases found.
  std::map<std::string, v1::TrialStatus> found;  ///< each followed trial's report this pass
  std::vector<std::string> suspended;  ///< trials found checkpointed and stopped (spec.suspend)
  std::string unreachable;
  std::map<std::string, std::string> no_room, rejected;
  std::map<std::string, int> restarts;  ///< by reason
  bool all_final = false;               ///< every trial succeeded, stopped, failed or was cancelled
  ReconcileResult result;

  /// Whether a trial status an agent reports is this job's trial `n` (of attempt `attempt` or
  /// newer; a finished or early-stopped copy of any attempt counts: its results are the
  /// trial's).
  bool Ours(const v1::TrialStatus& t, const std::string& n, int64_t attempt) const;
  /// This job's identity for agents.
  v1::TrialRef Ref(const std::string& trial) const;
};

/// A message cut to kMaxStatusMessageBytes (at a UTF-8 character boundary).
std::string Truncated(const std::string& message);

}  // namespace hydra::controller
