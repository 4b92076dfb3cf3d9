#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace hydra {

/// spec.search.earlyStopping.algorithm.
enum class EarlyStoppingAlgorithm { kNone, kAsha, kMedian };

/// "none" | "asha" | "median".
const char* EarlyStoppingAlgorithmName(EarlyStoppingAlgorithm a);
/// The algorithm named `text`; nullopt for any other text.
std::optional<EarlyStoppingAlgorithm> ParseEarlyStoppingAlgorithm(const std::string& text);

/// spec.search.earlyStopping: which trials stop before spec.training.steps. The metric is the
/// validation loss (lower is better), reported at evaluation steps.
struct EarlyStoppingSpec {
  EarlyStoppingAlgorithm algorithm = EarlyStoppingAlgorithm::kNone;
  int64_t min_steps = 0;         ///< ASHA's first rung; median stopping's grace period
  int64_t reduction_factor = 3;  ///< ASHA: the top 1/reductionFactor of a rung go on
};

/// What a trial does next.
enum class StopVerdict {
  kContinue,  ///< train on (to the next rung, or to the end)
  kWait,      ///< ASHA: paused at a rung until enough results there tell whether it goes on
  kStop,      ///< EarlyStopped
};

/// ASHA's rungs for a trial of `steps` steps: minSteps * reductionFactor^k, every one < steps.
std::vector<int64_t> AshaRungs(const EarlyStoppingSpec& spec, int64_t steps);

/// The validation losses every trial of a job has reported: trial index -> step -> loss. The
/// decisions below read only this, so the controller and `hydra run` decide alike given the
/// same reports; they differ only where the reports arrive in another order (ASHA promotes on
/// the results a rung has when a trial reaches it; median stopping compares with the trials
/// that reached the step).
class MetricBoard {
 public:
  /// A non-finite loss (a diverged trial) is recorded as +infinity: the worst, and sortable.
  void Record(int trial, int64_t step, double loss);
  /// The trial's loss reported at exactly `step`; false if none.
  bool At(int trial, int64_t step, double* loss) const;
  /// The trial's best (lowest) loss at steps <= `step`; false if it reported none there.
  bool BestUpTo(int trial, int64_t step, double* loss) const;
  /// The last step the trial reported at; -1 if none.
  int64_t LastStep(int trial) const;
  const std::map<int, std::map<int64_t, double>>& losses() const { return losses_; }

 private:
  std::map<int, std::map<int64_t, double>> losses_;
};

/// ASHA's verdict for `trial`, which has reported at rung step `rung` (one of AshaRungs):
/// kContinue when its loss there ranks within the top floor(n / reductionFactor) of the n
/// results recorded at that rung (ties: the lower trial index first; once no other trial can
/// report there, at least the best goes on); else kWait while some trial may still report at
/// that rung, and kStop once none can. The caller asks a waiting trial again whenever another
/// trial reports at that rung or stops or fails without reaching it (else it waits forever);
/// rungs must be evaluation steps (the caller evaluates there whatever evalEverySteps says),
/// or no report ever arrives and nothing stops. A reduction factor below 2 stops nothing.
/// `stopped[i]` is true for trials already stopped or failed, which will never report again;
/// `trials` counts them all.
StopVerdict AshaVerdict(const EarlyStoppingSpec& spec, const MetricBoard& board, int trials,
                        const std::vector<bool>& stopped, int trial, int64_t rung);

/// Median stopping's verdict for `trial` at evaluation step `step`: kStop when step >= minSteps
/// and its best loss so far is worse than the median of the best losses so far (at steps <=
/// `step`) of the other trials that have reported at or past `step`; kContinue otherwise, and
/// while no other trial has reached `step` (with two trials the worse one stops at minSteps;
/// callers wanting a quorum check the count first).
StopVerdict MedianVerdict(const EarlyStoppingSpec& spec, const MetricBoard& board, int trial,
                          int64_t step);

/// The step `trial` may currently reach: the next ASHA rung past its last report (or `steps`
/// past the last rung, or for median and none). What the scheduler's remaining-time estimate
/// uses; for a trial waiting at a rung this is still the next rung (the caller counts a waiting
/// trial's remaining time as zero).
int64_t ReachableStep(const EarlyStoppingSpec& spec, const MetricBoard& board, int64_t steps,
                      int trial);

/// For people (`hydra validate`): what `spec` does to trials of up to `steps` steps, e.g.
/// "asha on validationLoss: rungs at steps 10, 30 (of 90); the top 1/3 at each rung go on".
/// Empty for kNone.
std::string DescribeEarlyStopping(const EarlyStoppingSpec& spec, int64_t steps);

/// For `hydra simulate`: the step each of trials with `steps[i]` steps reaches when at every
/// ASHA rung (median: at minSteps only) a fraction `stop_fraction` of the trials still
/// training there stops, spread evenly over them in index order. ASHA's own fraction is
/// 1 - 1/reductionFactor. kNone, or a fraction <= 0: every trial reaches its steps.
std::vector<int64_t> ModelledStopSteps(const EarlyStoppingSpec& spec,
                                       const std::vector<int64_t>& steps, double stop_fraction);

}  // namespace hydra
