#include "common/trial_result.h"

namespace hydra {

bool IsFinalTrialState(const std::string& state) {
  return state == kTrialSucceeded || state == kTrialFailed || state == kTrialCancelled;
}

nlohmann::json CurveJson(const std::vector<CurvePoint>& curve) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& p : curve) out.push_back({p.step, p.loss});
  return out;
}

std::vector<CurvePoint> CurveFromJson(const nlohmann::json& j) {
  std::vector<CurvePoint> out;
  for (const auto& p : j) out.push_back({p.at(0).get<int64_t>(), p.at(1).get<double>()});
  return out;
}

}  // namespace hydra
