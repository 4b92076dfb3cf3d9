#include "common/early_stopping.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace hydra {

const char* EarlyStoppingAlgorithmName(EarlyStoppingAlgorithm a) {
  switch (a) {
    case EarlyStoppingAlgorithm::kAsha: return "asha";
    case EarlyStoppingAlgorithm::kMedian: return "median";
    case EarlyStoppingAlgorithm::kNone: break;
  }
  return "none";
}

std::optional<EarlyStoppingAlgorithm> ParseEarlyStoppingAlgorithm(const std::string& text) {
  for (auto a : {EarlyStoppingAlgorithm::kNone, EarlyStoppingAlgorithm::kAsha,
                 EarlyStoppingAlgorithm::kMedian}) {
    if (text == EarlyStoppingAlgorithmName(a)) return a;
  }
  return std::nullopt;
}

std::vector<int64_t> AshaRungs(const EarlyStoppingSpec& spec, int64_t steps) {
  std::vector<int64_t> rungs;
  if (spec.min_steps <= 0 || spec.reduction_factor < 2) return rungs;
  for (int64_t r = spec.min_steps; r < steps; r *= spec.reduction_factor) {
    rungs.push_back(r);
    if (r > steps / spec.reduction_factor) break;  // the next would pass steps (no overflow)
  }
  return rungs;
}

void MetricBoard::Record(int trial, int64_t step, double loss) {
  losses_[trial][step] = std::isfinite(loss) ? loss : std::numeric_limits<double>::infinity();
}

bool MetricBoard::At(int trial, int64_t step, double* loss) const {
  auto t = losses_.find(trial);
  if (t == losses_.end()) return false;
  auto s = t->second.find(step);
  if (s == t->second.end()) return false;
  *loss = s->second;
  return true;
}

bool MetricBoard::BestUpTo(int trial, int64_t step, double* loss) const {
  auto t = losses_.find(trial);
  if (t == losses_.end()) return false;
  bool any = false;
  for (const auto& [s, l] : t->second) {
    if (s > step) break;
    if (!any || l < *loss) *loss = l;
    any = true;
  }
  return any;
}

int64_t MetricBoard::LastStep(int trial) const {
  auto t = losses_.find(trial);
  if (t == losses_.end() || t->second.empty()) return -1;
  return t->second.rbegin()->first;
}

StopVerdict AshaVerdict(const EarlyStoppingSpec& spec, const MetricBoard& board, int trials,
                        const std::vector<bool>& stopped, int trial, int64_t rung) {
  double mine = 0;
  if (spec.reduction_factor < 2 || !board.At(trial, rung, &mine)) {
    return StopVerdict::kContinue;  // no rungs (factor < 2: AshaRungs is empty), or not at this
                                    // rung
  }
  int64_t n = 0, better = 0, pending = 0;
  for (int i = 0; i < trials; ++i) {
    double loss = 0;
    if (board.At(i, rung, &loss)) {
      ++n;
      if (i != trial && (loss < mine || (loss == mine && i < trial))) ++better;
    } else if (!(i < static_cast<int>(stopped.size()) && stopped[i]) && board.LastStep(i) < rung) {
      ++pending;  // may still report at this rung
    }
  }
  // While results may still arrive, the top floor(n / factor); once the rung is complete, at
  // least one goes on (else the best trial of a small last rung would stop).
  const int64_t promoted =
      pending > 0 ? n / spec.reduction_factor : std::max<int64_t>(1, n / spec.reduction_factor);
  if (better < promoted) return StopVerdict::kContinue;
  return pending > 0 ? StopVerdict::kWait : StopVerdict::kStop;
}

StopVerdict MedianVerdict(const EarlyStoppingSpec& spec, const MetricBoard& board, int trial,
                          int64_t step) {
  double mine = 0;
  if (step < spec.min_steps || !board.BestUpTo(trial, step, &mine)) return StopVerdict::kContinue;
  std::vector<double> others;
  for (const auto& [i, history] : board.losses()) {
    double best = 0;
    if (i != trial && board.LastStep(i) >= step && board.BestUpTo(i, step, &best)) {
      others.push_back(best);
    }
  }
  if (others.empty()) return StopVerdict::kContinue;
  std::sort(others.begin(), others.end());
  const size_t m = others.size();
  const double median = m % 2 ? others[m / 2] : (others[m / 2 - 1] + others[m / 2]) / 2;
  return mine > median ? StopVerdict::kStop : StopVerdict::kContinue;
}

int64_t ReachableStep(const EarlyStoppingSpec& spec, const MetricBoard& board, int64_t steps,
                      int trial) {
  if (spec.algorithm != EarlyStoppingAlgorithm::kAsha) return steps;
  const int64_t last = board.LastStep(trial);
  for (int64_t rung : AshaRungs(spec, steps)) {
    if (rung > last) return rung;
  }
  return steps;
}

std::string DescribeEarlyStopping(const EarlyStoppingSpec& spec, int64_t steps) {
  const std::string name = EarlyStoppingAlgorithmName(spec.algorithm);
  switch (spec.algorithm) {
    case EarlyStoppingAlgorithm::kNone: return "";
    case EarlyStoppingAlgorithm::kMedian:
      return name + " on validationLoss: from step " + std::to_string(spec.min_steps) +
             ", a trial stops at an evaluation when its best validation loss is worse than the "
             "median of the other trials' at that step";
    case EarlyStoppingAlgorithm::kAsha: break;
  }
  std::string rungs;
  for (int64_t r : AshaRungs(spec, steps)) rungs += (rungs.empty() ? "" : ", ") + std::to_string(r);
  return name + " on validationLoss: rungs at steps " + rungs + " (of " + std::to_string(steps) +
         "); the top 1/" + std::to_string(spec.reduction_factor) + " at each rung go on";
}

std::vector<int64_t> ModelledStopSteps(const EarlyStoppingSpec& spec,
                                       const std::vector<int64_t>& steps, double stop_fraction) {
  std::vector<int64_t> reached = steps;
  if (spec.algorithm == EarlyStoppingAlgorithm::kNone || !(stop_fraction > 0)) return reached;
  const double f = std::min(1.0, stop_fraction);
  // Every rung of any trial, in order; a trial takes part in the rungs below its steps.
  std::vector<int64_t> rungs;
  if (spec.algorithm == EarlyStoppingAlgorithm::kMedian) {
    rungs.push_back(spec.min_steps);
  } else {
    for (int64_t s : steps) {
      for (int64_t r : AshaRungs(spec, s)) rungs.push_back(r);
    }
    std::sort(rungs.begin(), rungs.end());
    rungs.erase(std::unique(rungs.begin(), rungs.end()), rungs.end());
  }
  std::vector<bool> going(steps.size(), true);
  for (int64_t rung : rungs) {
    int64_t position = 0;  // among the trials still training at this rung
    for (size_t i = 0; i < steps.size(); ++i) {
      if (!going[i] || rung >= steps[i]) continue;
      // (1e-9: 3 x (2/3) is 2, not 1.999...)
      const auto before =
          static_cast<int64_t>(std::floor(static_cast<double>(position) * f + 1e-9));
      const auto after =
          static_cast<int64_t>(std::floor(static_cast<double>(position + 1) * f + 1e-9));
      ++position;
      if (after > before) {
        going[i] = false;
        reached[i] = rung;
      }
    }
  }
  return reached;
}

}  // namespace hydra
