#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "common/early_stopping.h"

namespace hydra {

/// What early stopping asks of one trial.
struct StopDecision {
  enum class Kind {
    kLimit,  ///< train on to `step` (the next rung, or the trial's last step)
    kStop,   ///< stop now (EarlyStopped)
  };
  int trial = 0;
  Kind kind = Kind::kLimit;
  int64_t step = 0;
};

/// The early-stopping state of one job: fed the validation losses its trials report, in any
/// order, it says which trials go on to which step and which stop. `hydra run` drives it from
/// the scheduler's updates; the controller from the agents' reports (the same decisions for the
/// same reports, see MetricBoard). Not thread-safe.
class EarlyStopper {
 public:
  /// `steps[i]`: trial i's spec.training.steps.
  EarlyStopper(EarlyStoppingSpec spec, std::vector<int64_t> steps);

  /// The step trial `trial` may train to now: before any report its first ASHA rung (the
  /// scheduler evaluates there), else its steps.
  int64_t Limit(int trial) const;
  bool Stopped(int trial) const { return state_.at(trial) == State::kStopped; }
  /// Trial `trial` waits at a rung for other trials' results.
  bool Waiting(int trial) const { return waiting_.count(trial) > 0; }

  /// Trial `trial` reported `loss` at `step`. Returns what follows for it and for trials
  /// waiting at rungs. Reports of ended trials, repeated reports, and steps at or past the
  /// trial's last are recorded but decide nothing for it.
  std::vector<StopDecision> Report(int trial, int64_t step, double loss);

  /// Trial `trial` ended otherwise (it finished, failed or was cancelled) and reports no more;
  /// trials waiting for its results are reconsidered.
  std::vector<StopDecision> Ended(int trial);

  const MetricBoard& board() const { return board_; }

  /// Where a trial stands in the controller's stored status.
  enum class Phase { kActive, kStopped, kEnded };
  /// The controller's level-based pass: the decider as the job's status and the agents' reports
  /// leave it, with no memory of earlier passes. `limits[i]` is trial i's stored step limit (0:
  /// none yet: its first rung), `phases[i]` where it stands, `board` every loss known. Decide()
  /// then answers what follows: stored decisions are never taken back (a limit only rises, a
  /// stopped trial stays stopped).
  static EarlyStopper FromState(EarlyStoppingSpec spec, std::vector<int64_t> steps,
                                MetricBoard board, const std::vector<int64_t>& limits,
                                const std::vector<Phase>& phases);
  /// The decisions the state given to FromState calls for: ASHA reconsiders every active trial
  /// that reported at its limit (or past it: its first evaluation there stands for the rung);
  /// median stopping judges every active trial at its latest evaluation.
  std::vector<StopDecision> Decide();

 private:
  using State = Phase;
  void Stop(int trial, std::vector<StopDecision>* out);
  void Promote(int trial, int64_t rung, std::vector<StopDecision>* out);
  std::vector<StopDecision> Review();  // waiting trials, again, until nothing changes
  /// A trial past its limit without an evaluation there (resumed from a later checkpoint) is
  /// judged at that rung by its first evaluation after it: recorded there. True if it did so.
  bool StandInAtLimit(int trial);

  EarlyStoppingSpec spec_;
  std::vector<int64_t> steps_;
  std::vector<int64_t> limit_;
  std::vector<State> state_;
  std::map<int, int64_t> waiting_;  // trial -> the rung it waits at
  MetricBoard board_;
};

}  // namespace hydra
