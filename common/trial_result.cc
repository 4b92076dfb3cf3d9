#include "common/trial_result.h"

namespace hydra {

void AppendBounded(std::vector<CurvePoint>* curve, CurvePoint point, size_t max_points) {
  curve->push_back(point);
  if (curve->size() <= max_points) return;
  const size_t older = curve->size() - max_points / 2;  // the part that is thinned
  size_t kept = 0;
  for (size_t i = 0; i < older; i += 2) (*curve)[kept++] = (*curve)[i];
  for (size_t i = older; i < curve->size(); ++i) (*curve)[kept++] = (*curve)[i];
  curve->resize(kept);
}

double LatestLoss(const std::vector<CurvePoint>& curve) {
  return curve.empty() ? std::numeric_limits<double>::quiet_NaN() : curve.back().loss;
}

bool IsWaitingAtLimit(const TrialResult& r) {
  return r.state == kTrialRunning && r.step_limit > 0 && r.step >= r.step_limit;
}

bool IsSuspendedMessage(const std::string& message) {
  return message.rfind(std::string(kSuspendedReason) + " at step ", 0) == 0;
}

bool IsFinalTrialState(const std::string& state) {
  return state == kTrialSucceeded || state == kTrialFailed || state == kTrialCancelled ||
         state == kTrialEarlyStopped;
}

nlohmann::json CurveJson(const std::vector<CurvePoint>& curve) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& p : curve) out.push_back({p.step, p.loss});
  return out;
}

std::vector<CurvePoint> CurveFromJson(const nlohmann::json& j) {
  std::vector<CurvePoint> out;
  for (const auto& p : j) {
    // JSON has no NaN or infinity: nlohmann writes a diverged loss as null.
    const auto& loss = p.at(1);
    out.push_back({p.at(0).get<int64_t>(),
                   loss.is_null() ? std::numeric_limits<double>::quiet_NaN() : loss.get<double>()});
  }
  return out;
}

}  // namespace hydra
