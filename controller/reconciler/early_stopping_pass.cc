#include "controller/reconciler/early_stopping_pass.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "common/early_stopper.h"
#include "common/trial_result.h"

namespace hydra::controller {
namespace {

using kube::Json;
using Phase = EarlyStopper::Phase;

Phase PhaseOf(const Json& e) {
  const std::string state = e.value("state", "");
  if (state == kTrialEarlyStopped || e.contains("stopEarly")) return Phase::kStopped;
  return IsFinalTrialState(state) ? Phase::kEnded : Phase::kActive;
}

/// The stored decision, or the agent's if it is further along (a pass that told the agent but
/// could not store it).
int64_t StoredLimit(const EarlyStoppingTrial& t) {
  int64_t limit = t.entry->value("stepLimit", int64_t{0});
  const auto* r = t.report;
  if (r != nullptr && (r->state() == agent::v1::RUNNING || r->state() == agent::v1::PENDING)) {
    limit = std::max(limit, r->step_limit() == 0 ? t.steps : r->step_limit());
  }
  return limit;
}

void RecordEvidence(const EarlyStoppingTrial& t, int index, MetricBoard* board) {
  for (const auto& p : t.entry->value("evaluations", Json::array())) {
    if (p.is_array() && p.size() == 2 && p[0].is_number_integer() && p[1].is_number()) {
      board->Record(index, p[0].get<int64_t>(), p[1].get<double>());
    }
  }
  if (t.report == nullptr) return;
  for (const auto& p : t.report->evaluations()) board->Record(index, p.step(), p.loss());
}

/// What the entry keeps of the trial's losses: ASHA's rung results (the newest), median
/// stopping's best and latest evaluation.
Json EvidenceToStore(const EarlyStoppingSpec& spec, const MetricBoard& board, int index,
                     int64_t steps) {
  Json out = Json::array();
  auto it = board.losses().find(index);
  if (it == board.losses().end()) return out;
  const auto& history = it->second;
  std::vector<std::pair<int64_t, double>> kept;
  if (spec.algorithm == EarlyStoppingAlgorithm::kAsha) {
    for (int64_t rung : AshaRungs(spec, steps)) {
      if (auto h = history.find(rung); h != history.end()) kept.emplace_back(*h);
    }
    if (kept.size() > kMaxStoredEvaluations) {
      kept.erase(kept.begin(), kept.end() - kMaxStoredEvaluations);
    }
  } else if (!history.empty()) {
    auto best = std::min_element(history.begin(), history.end(),
                                 [](const auto& a, const auto& b) { return a.second < b.second; });
    kept.emplace_back(*best);
    if (best->first != history.rbegin()->first) kept.emplace_back(*history.rbegin());
  }
  for (const auto& [step, loss] : kept) {
    // 6 significant digits keep the status small (the agents report every digit while they
    // hold the trial); +infinity (a diverged trial) is not JSON: the largest double, still the
    // worst.
    char text[32];
    std::snprintf(text, sizeof text, "%.6g", loss);
    out.push_back(Json::array(
        {step, std::isfinite(loss) ? std::strtod(text, nullptr) : 1.7976931348623157e308}));
  }
  return out;
}

}  // namespace

std::string EarlyStopReason(const EarlyStoppingSpec& spec, int64_t step) {
  return std::string(EarlyStoppingAlgorithmName(spec.algorithm)) + ": stopped at step " +
         std::to_string(step) + ", its validation loss " +
         (spec.algorithm == EarlyStoppingAlgorithm::kAsha
              ? "not in the top 1/" + std::to_string(spec.reduction_factor) + " of its rung"
              : "worse than the median of the other trials'");
}

int64_t WantedStepLimit(const Json& entry) {
  const int64_t limit = entry.value("stepLimit", int64_t{0});
  return limit >= entry.value("steps", int64_t{0}) ? 0 : limit;
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
    limits.push_back(StoredLimit(trials[i]));
    phases.push_back(PhaseOf(*trials[i].entry));
    RecordEvidence(trials[i], static_cast<int>(i), &board);
  }
  auto stopper = EarlyStopper::FromState(spec, steps, board, limits, phases);
  for (const auto& d : stopper.Decide()) {
    Json& e = *trials[d.trial].entry;
    if (d.kind == StopDecision::Kind::kLimit) continue;  // stored below with every limit
    const std::string why = EarlyStopReason(spec, d.step);
    out.push_back({e.value("name", ""), why});
    if (e.value("agentEndpoint", "").empty()) {
      e["state"] = kTrialEarlyStopped;  // on no agent: nothing to stop
      e["message"] = why;
    } else {
      e["stopEarly"] = d.step;
    }
  }
  for (size_t i = 0; i < trials.size(); ++i) {
    Json& e = *trials[i].entry;
    if (spec.algorithm == EarlyStoppingAlgorithm::kAsha && phases[i] == Phase::kActive &&
        !stopper.Stopped(static_cast<int>(i))) {
      e["stepLimit"] = stopper.Limit(static_cast<int>(i));
    }
    Json kept = EvidenceToStore(spec, stopper.board(), static_cast<int>(i), steps[i]);
    if (kept.empty()) {
      e.erase("evaluations");
    } else {
      e["evaluations"] = std::move(kept);
    }
  }
  return out;
}

}  // namespace hydra::controller
