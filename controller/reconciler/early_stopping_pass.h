#pragma once

#include <string>
#include <vector>

#include "common/early_stopping.h"
#include "controller/reconciler/job_status.h"
#include "hydra/agent/v1/agent.pb.h"

namespace hydra::controller {

/// Most evaluations a trial's status entry keeps for early stopping (`evaluations`): ASHA's
/// results at its lowest rungs, median stopping's best loss so far at evaluations spread over
/// its run. The status stays small whatever the steps (docs/manifest.md: status size).
inline constexpr size_t kMaxStoredEvaluations = 8;

/// One trial as a reconcile pass sees it.
struct EarlyStoppingTrial {
  TrialEntry* entry = nullptr;                     ///< its status entry: read and written
  int64_t steps = 0;                               ///< its spec.training.steps
  const agent::v1::TrialStatus* report = nullptr;  ///< its agent's report this pass, if any
};

/// A trial early stopping ended in this pass, for its Event.
struct EarlyStop {
  std::string trial;
  std::string why;
};

/// The controller's early stopping, level-based: the losses stored in the entries
/// (`evaluations`) and the agents' reports this pass form the board; the stored decisions
/// (`stepLimit`, only rising; `stopEarly` and the final states) are kept: the controller tells
/// an agent a decision only after the status holding it is written, so the entries are never
/// behind the agents. The decisions common/early_stopper takes from there are written into the
/// entries: `stepLimit` (ASHA) and `stopEarly` (the step; the controller asks the trial's agent
/// to stop it until it reports EarlyStopped). A trial stopped early that is on no agent (never
/// placed, lost, suspended) ends EarlyStopped at once. Also stores each trial's `evaluations`
/// for the next pass. Nothing for algorithm none. Returns the trials stopped in this pass.
std::vector<EarlyStop> DecideEarlyStopping(const EarlyStoppingSpec& spec,
                                           std::vector<EarlyStoppingTrial>& trials);

/// Why early stopping stopped a trial at `step`, for its message and Event.
std::string EarlyStopReason(const EarlyStoppingSpec& spec, int64_t step);

/// The step limit an entry asks its agent for: 0 (to the end) without one or at its steps.
int64_t WantedStepLimit(const TrialEntry& entry);

}  // namespace hydra::controller
