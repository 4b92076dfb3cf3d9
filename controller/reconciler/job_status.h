#pragma once
// A MultiModelJob's status as typed structs (the CRD's status schema), and their JSON. The
// reconciler's phases read and write these; JSON exists only where the status is read from and
// written to the API server.

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/job.h"

namespace hydra::controller {

/// A trial's state in status.trials[].state (the CRD's enum).
enum class TrialState {
  kPending,       ///< waiting for an agent, or queued on one
  kRunning,       ///< training on its agent
  kSucceeded,     ///< trained every step
  kFailed,        ///< failed, or restarted past spec.maxRestarts
  kInterrupted,   ///< checkpointed and stopped (spec.suspend); resumes when placed again
  kCancelled,     ///< cancelled on its agent
  kEarlyStopped,  ///< stopped by spec.search.earlyStopping
};

/// "Pending", "Running", ... as status and the agents' reports spell them.
const char* TrialStateName(TrialState state);
/// The state a name spells; Pending for a name that is none (a status edited by hand).
TrialState TrialStateFromName(const std::string& name);
/// Succeeded, Failed, Cancelled or EarlyStopped: nothing will change it.
bool IsFinal(TrialState state);

struct ShardStatus {
  int64_t first_layer = 0;
  int64_t last_layer = 0;
  int64_t state_bytes = 0;
  std::string activations;  ///< stash | recompute | offload
  bool operator==(const ShardStatus& o) const;
};

/// A trial's shard plan as status shows it: the totals and at most kMaxStatusShards shards.
struct ShardPlanStatus {
  std::string state_tier;
  int64_t peak_device_bytes = 0;
  int64_t shard_count = 0;
  int64_t offloaded_bytes = 0;  ///< forward graphs copied to host memory a step
  int64_t resident_bytes = 0;   ///< the resident shards' state, on the device all step
  /// How many of the last shards keep their state on the device between steps (the plan's
  /// resident shards are its last ones). Plan-wide, not per shard: status stays small.
  int64_t resident_shards = 0;
  std::vector<ShardStatus> shards;
  bool operator==(const ShardPlanStatus& o) const;
};

struct CheckpointStatus {
  int64_t step = 0;
  std::string path;
  bool operator==(const CheckpointStatus& o) const;
};

/// One validation loss early stopping decides on.
struct Evaluation {
  int64_t step = 0;
  double loss = 0;
  bool operator==(const Evaluation& o) const;
};

/// status.trials[]: one trial.
struct TrialEntry {
  std::string name;
  nlohmann::json hyperparameters = nlohmann::json::object();
  std::string agent;           ///< the node of its agent; empty while it waits for one
  std::string agent_endpoint;  ///< that agent's gRPC host:port
  TrialState state = TrialState::kPending;
  std::string message;  ///< empty: nothing to say
  int64_t step = 0;
  int64_t steps = 0;
  /// spec.training.precision (or its grid value); in the JSON only when bf16, as fp32 is the
  /// default.
  Precision precision = Precision::kFp32;
  std::optional<double> train_loss;
  std::optional<double> validation_loss;
  std::optional<int64_t> step_limit;  ///< ASHA: the step it may train to now
  std::optional<int64_t> stop_early;  ///< stopped early at this step; its agent not yet told
  std::vector<Evaluation> evaluations;
  int64_t restarts = 0;
  int64_t attempt = 0;  ///< the fencing token of its current assignment
  int64_t notices = 0;  ///< its agent's notices already turned into Events
  std::optional<CheckpointStatus> last_checkpoint;
  std::optional<ShardPlanStatus> shard_plan;

  /// Whether an agent holds it (queued or training there). A suspended trial (Interrupted) is
  /// on no agent though its entry names the one it left.
  bool OnAgent() const;
  bool Final() const { return IsFinal(state); }
  /// Forgets its agent (it waits for another).
  void LeaveAgent();
  bool operator==(const TrialEntry& o) const;
};

/// A metav1.Condition.
struct Condition {
  std::string type;
  bool status = false;
  std::string reason;
  std::string message;
  int64_t observed_generation = 0;
  std::string last_transition_time;
  bool operator==(const Condition& o) const;
};

/// status.agents: the job's own agent pods (spec.agents only).
struct AgentPodsStatus {
  int64_t desired = 0;  ///< pods the job wants now
  int64_t pods = 0;     ///< pods that exist and are not ending
  int64_t ready = 0;    ///< of those, serving (Ready, confirmed over gRPC)
  int64_t gated = 0;    ///< of those, not yet admitted by Kueue (its scheduling gate)
  bool operator==(const AgentPodsStatus& o) const;
};

struct BestTrial {
  std::string name;
  double validation_loss = 0;
  nlohmann::json hyperparameters = nlohmann::json::object();
  bool operator==(const BestTrial& o) const;
};

struct JobStatus {
  int64_t observed_generation = 0;
  std::string start_time;       ///< empty: not yet
  std::string completion_time;  ///< empty: not yet
  int64_t trial_count = 0, pending = 0, running = 0, succeeded = 0, failed = 0;
  std::optional<int64_t> early_stopped;  ///< only with spec.search.earlyStopping
  std::optional<BestTrial> best_trial;
  std::string best_validation_loss;  ///< 4 digits, for the printer column
  std::vector<Condition> conditions;
  std::vector<TrialEntry> trials;         ///< in grid order
  std::optional<AgentPodsStatus> agents;  ///< only with spec.agents
  bool operator==(const JobStatus& o) const;
  bool operator!=(const JobStatus& o) const { return !(*this == o); }
};

/// The typed status of a stored one. Tolerant: a field of the wrong type reads as its default
/// (a status edited by hand must not stop the controller); unknown fields are dropped.
JobStatus JobStatusFromJson(const nlohmann::json& status);
/// The JSON the API server stores; fields at their "absent" value are left out.
nlohmann::json ToJson(const JobStatus& status);
nlohmann::json ToJson(const TrialEntry& entry);
TrialEntry TrialEntryFromJson(const nlohmann::json& entry);

/// Sets condition `type`; lastTransitionTime (`now`) changes only when the status flips.
/// Returns true if anything changed.
bool SetCondition(std::vector<Condition>& conditions, const std::string& type, bool status,
                  const std::string& reason, const std::string& message, int64_t generation,
                  const std::string& now);
/// The condition of `type`, or null.
const Condition* FindCondition(const std::vector<Condition>& conditions, const std::string& type);

}  // namespace hydra::controller
