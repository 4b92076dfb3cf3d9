#pragma once

#include <string>
#include <vector>

#include "common/early_stopping.h"
#include "controller/kube/kube_client.h"
#include "hydra/agent/v1/agent.pb.h"

namespace hydra::controller {

/// Most evaluations a trial's status entry keeps for early stopping (`evaluations`): ASHA's
/// newest rung results, median stopping's best and latest. The status stays small whatever the
/// rungs (docs/manifest.md: status size).
inline constexpr size_t kMaxStoredEvaluations = 4;

/// One trial as a reconcile pass sees it.
struct EarlyStoppingTrial {
  kube::Json* entry = nullptr;                     ///< its status entry: read and written
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
/// (`stepLimit`, only rising, taken as the higher of the entry's and the agent's; `stopEarly`
/// and the final states) are kept; the decisions common/early_stopper takes from there are
/// written into the entries: `stepLimit` (ASHA), `stopEarly` (the step; the pass asks the
/// agent to stop the trial until it reports EarlyStopped) or, for a trial on no agent, state
/// EarlyStopped at once. Also stores each trial's `evaluations` for the next pass. Nothing for
/// algorithm none.
std::vector<EarlyStop> DecideEarlyStopping(const EarlyStoppingSpec& spec,
                                           std::vector<EarlyStoppingTrial>& trials);

/// Why early stopping stopped a trial at `step`, for its message and Event.
std::string EarlyStopReason(const EarlyStoppingSpec& spec, int64_t step);

/// The step limit an entry asks its agent for: 0 (to the end) without one or at its steps.
int64_t WantedStepLimit(const kube::Json& entry);

}  // namespace hydra::controller
