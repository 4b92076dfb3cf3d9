#include "controller/reconciler/early_stopping_pass.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>

#include "common/early_stopper.h"
#include "common/trial_result.h"

namespace hydra::controller {
namespace {

using Phase = EarlyStopper::Phase;

Phase PhaseOf(const TrialEntry& e) {
  if (e.state == TrialState::kEarlyStopped || e.stop_early) return Phase::kStopped;
  return e.Final() ? Phase::kEnded : Phase::kActive;
}

void RecordEvidence(const EarlyStoppingTrial& t, int index, MetricBoard* board) {
  for (const auto& p : t.entry->evaluations) board->Record(index, p.step, p.loss);
  if (t.report == nullptr) return;
  for (const auto& p : t.report->evaluations()) board->Record(index, p.step(), p.loss());
}

/// ASHA: the trial's results at its rungs (the lowest kMaxStoredEvaluations).
std::vector<std::pair<int64_t, double>> RungResults(const EarlyStoppingSpec& spec,
                                                    const std::map<int64_t, double>& history,
                                                    int64_t steps) {
  std::vector<std::pair<int64_t, double>> kept;
  for (int64_t rung : AshaRungs(spec, steps)) {
    if (kept.size() == kMaxStoredEvaluations) break;
    if (auto h = history.find(rung); h != history.end()) kept.emplace_back(*h);
  }
  return kept;
}

/// Median stopping: the best loss so far at up to kMaxStoredEvaluations of the trial's
/// evaluations, spread evenly over them and always the latest. Best-up-to-a-step read from them
/// is exact at those steps and between them errs towards the trial's earlier, higher best.
std::vector<std::pair<int64_t, double>> BestSoFar(const std::map<int64_t, double>& history) {
  std::vector<std::pair<int64_t, double>> best;
  for (const auto& [step, loss] : history) {
    best.emplace_back(step, best.empty() ? loss : std::min(best.back().second, loss));
  }
  if (best.size() <= kMaxStoredEvaluations) return best;
  std::vector<std::pair<int64_t, double>> kept;
  const size_t n = best.size(), k = kMaxStoredEvaluations;
  for (size_t i = 1; i <= k; ++i) kept.push_back(best[i * (n - 1) / k]);
  return kept;
}

/// What the entry keeps of the trial's losses for later passes.
std::vector<Evaluation> EvidenceToStore(const EarlyStoppingSpec& spec, const MetricBoard& board,
                                        int index, int64_t steps) {
  std::vector<Evaluation> out;
  auto it = board.losses().find(index);
  if (it == board.losses().end()) return out;
  const auto kept = spec.algorithm == EarlyStoppingAlgorithm::kAsha
                        ? RungResults(spec, it->second, steps)
                        : BestSoFar(it->second);
  for (const auto& [step, loss] : kept) {
    // 6 significant digits keep the status small (the agents report every digit while they
    // hold the trial); +infinity (a diverged trial) is not JSON: the largest double, still the
    // worst.
    char text[32];
    std::snprintf(text, sizeof text, "%.6g", loss);
    out.push_back(
        {step, std::isfinite(loss) ? std::strtod(text, nullptr) : 1.7976931348623157e308});
  }
  return out;
}

/// A trial stopped early that is on no agent (any more) has nothing left to stop: it ends.
void EndIfOnNoAgent(const EarlyStoppingSpec& spec, TrialEntry& e) {
  if (!e.stop_early || e.OnAgent() || e.Final()) return;
  e.state = TrialState::kEarlyStopped;
  e.message = EarlyStopReason(spec, *e.stop_early);
  e.stop_early.reset();
}

}  // namespace

std::string EarlyStopReason(const EarlyStoppingSpec& spec, int64_t step) {
  return std::string(EarlyStoppingAlgorithmName(spec.algorithm)) + ": stopped at step " +
         std::to_string(step) + ", its validation loss " +
         (spec.algorithm == EarlyStoppingAlgorithm::kAsha
              ? "not in the top 1/" + std::to_string(spec.reduction_factor) + " of its rung"
              : "worse than the median of the other trials'");
}

int64_t WantedStepLimit(const TrialEntry& entry) {
  const int64_t limit = entry.step_limit.value_or(0);
  return limit >= entry.steps ? 0 : limit;
}

std::vector<EarlyStop> DecideEarlyStopping(const EarlyStoppingSpec& spec,
                                           std::vector<EarlyStoppingTrial>& trials) {
  std::vector<EarlyStop> out;
  if (spec.algorithm == EarlyStoppingAlgorithm::kNone) return out;
  std::vector<int64_t> steps, limits;
  std::vector<Phase> phases;
  MetricBoard board;
  for (size_t i = 0; i < trials.size(); ++i) {
    steps.push_back(trials[i].steps);
    limits.push_back(trials[i].entry->step_limit.value_or(0));
    phases.push_back(PhaseOf(*trials[i].entry));
    RecordEvidence(trials[i], static_cast<int>(i), &board);
  }
  auto stopper = EarlyStopper::FromState(spec, steps, board, limits, phases);
  for (const auto& d : stopper.Decide()) {
    TrialEntry& e = *trials[d.trial].entry;
    if (d.kind == StopDecision::Kind::kLimit) continue;  // stored below with every limit
    const std::string why = EarlyStopReason(spec, d.step);
    out.push_back({e.name, why});
    e.stop_early = d.step;
  }
  for (size_t i = 0; i < trials.size(); ++i) {
    TrialEntry& e = *trials[i].entry;
    EndIfOnNoAgent(spec, e);
    if (spec.algorithm == EarlyStoppingAlgorithm::kAsha && phases[i] == Phase::kActive &&
        !stopper.Stopped(static_cast<int>(i))) {
      e.step_limit = stopper.Limit(static_cast<int>(i));
    }
    e.evaluations = EvidenceToStore(spec, stopper.board(), static_cast<int>(i), steps[i]);
  }
  return out;
}

}  // namespace hydra::controller
