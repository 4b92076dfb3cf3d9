#include "common/early_stopper.h"

#include <algorithm>
#include <utility>

namespace hydra {

EarlyStopper::EarlyStopper(EarlyStoppingSpec spec, std::vector<int64_t> steps)
    : spec_(spec), steps_(std::move(steps)), state_(steps_.size(), State::kActive) {
  for (size_t i = 0; i < steps_.size(); ++i) {
    limit_.push_back(ReachableStep(spec_, board_, steps_[i], static_cast<int>(i)));
  }
}

int64_t EarlyStopper::Limit(int trial) const { return limit_.at(trial); }

void EarlyStopper::Stop(int trial, std::vector<StopDecision>* out) {
  state_[trial] = State::kStopped;
  waiting_.erase(trial);
  out->push_back({trial, StopDecision::Kind::kStop, board_.LastStep(trial)});
}

void EarlyStopper::Promote(int trial, int64_t rung, std::vector<StopDecision>* out) {
  waiting_.erase(trial);
  // The next rung past this one (or the end): ReachableStep from the rung's report on.
  int64_t next = steps_[trial];
  for (int64_t r : AshaRungs(spec_, steps_[trial])) {
    if (r > rung) {
      next = r;
      break;
    }
  }
  limit_[trial] = next;
  out->push_back({trial, StopDecision::Kind::kLimit, next});
  // A trial resumed past this rung may have reported at the next one already: it is decided
  // there too (Review goes on), not left waiting for a report that never comes.
  double loss = 0;
  if (next < steps_[trial] && board_.At(trial, next, &loss)) waiting_[trial] = next;
}

std::vector<StopDecision> EarlyStopper::Report(int trial, int64_t step, double loss) {
  std::vector<StopDecision> out;
  if (trial < 0 || trial >= static_cast<int>(steps_.size())) return out;
  double seen = 0;
  const bool repeated = board_.At(trial, step, &seen);
  board_.Record(trial, step, loss);
  if (repeated || state_[trial] != State::kActive || step >= steps_[trial]) return out;
  if (spec_.algorithm == EarlyStoppingAlgorithm::kMedian) {
    if (MedianVerdict(spec_, board_, trial, step) == StopVerdict::kStop) Stop(trial, &out);
    return out;
  }
  if (spec_.algorithm != EarlyStoppingAlgorithm::kAsha) return out;
  const auto rungs = AshaRungs(spec_, steps_[trial]);
  const int64_t limit = limit_[trial];
  if (std::find(rungs.begin(), rungs.end(), step) != rungs.end() && !waiting_.count(trial)) {
    waiting_[trial] = step;  // decided below with the others
  } else if (step > limit && limit < steps_[trial] && !waiting_.count(trial) &&
             StandInAtLimit(trial)) {
    waiting_[trial] = limit;
  }
  auto more = Review();
  out.insert(out.end(), more.begin(), more.end());
  return out;
}

EarlyStopper EarlyStopper::FromState(EarlyStoppingSpec spec, std::vector<int64_t> steps,
                                     MetricBoard board, const std::vector<int64_t>& limits,
                                     const std::vector<Phase>& phases) {
  EarlyStopper s(spec, std::move(steps));
  s.board_ = std::move(board);
  for (size_t i = 0; i < s.steps_.size(); ++i) {
    if (i < limits.size() && limits[i] > 0) s.limit_[i] = std::min(limits[i], s.steps_[i]);
    if (i < phases.size()) s.state_[i] = phases[i];
  }
  return s;
}

std::vector<StopDecision> EarlyStopper::Decide() {
  std::vector<StopDecision> out;
  for (size_t k = 0; k < steps_.size(); ++k) {
    const int i = static_cast<int>(k);
    const int64_t last = board_.LastStep(i);
    if (state_[k] != State::kActive || last < 0) continue;
    if (spec_.algorithm == EarlyStoppingAlgorithm::kMedian) {
      if (last < steps_[k] && MedianVerdict(spec_, board_, i, last) == StopVerdict::kStop) {
        Stop(i, &out);
      }
      continue;
    }
    if (spec_.algorithm != EarlyStoppingAlgorithm::kAsha || limit_[k] >= steps_[k]) continue;
    double loss = 0;
    StandInAtLimit(i);
    if (board_.At(i, limit_[k], &loss)) waiting_[i] = limit_[k];
  }
  auto more = Review();
  out.insert(out.end(), more.begin(), more.end());
  return out;
}

bool EarlyStopper::StandInAtLimit(int trial) {
  const int64_t limit = limit_[trial];
  double loss = 0;
  if (board_.At(trial, limit, &loss)) return false;
  for (const auto& [step, l] : board_.losses().at(trial)) {
    if (step > limit) {
      board_.Record(trial, limit, l);
      return true;
    }
  }
  return false;
}

std::vector<StopDecision> EarlyStopper::Ended(int trial) {
  if (trial < 0 || trial >= static_cast<int>(steps_.size())) return {};
  if (state_[trial] == State::kActive) state_[trial] = State::kEnded;
  waiting_.erase(trial);
  return Review();
}

std::vector<StopDecision> EarlyStopper::Review() {
  std::vector<StopDecision> out;
  std::vector<bool> gone(steps_.size());
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t i = 0; i < state_.size(); ++i) gone[i] = state_[i] != State::kActive;
    for (const auto& [trial, rung] : std::map<int, int64_t>(waiting_)) {
      const StopVerdict v =
          AshaVerdict(spec_, board_, static_cast<int>(steps_.size()), gone, trial, rung);
      if (v == StopVerdict::kWait) continue;
      if (v == StopVerdict::kContinue) {
        Promote(trial, rung, &out);
      } else {
        Stop(trial, &out);
      }
      changed = true;  // a stop can complete a rung others wait at
      break;
    }
  }
  return out;
}

}  // namespace hydra
