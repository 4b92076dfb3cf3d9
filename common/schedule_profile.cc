#include "common/schedule_profile.h"

namespace hydra {

TrialProfile ProfileFromPlan(const Trial& trial, const PartitionPlan& plan,
                             double flops_per_second) {
  TrialProfile p;
  p.name = trial.name;
  p.minibatches = trial.training.steps;
  p.batch_size = trial.training.batch_size;
  const double mb = static_cast<double>(trial.training.gradient_accumulation_steps);
  const bool moves = plan.shards.size() > 1 || plan.state_tier == StateTier::kDisk;
  for (size_t k = 0; k < plan.shards.size(); ++k) {
    const auto& s = plan.shards[k];
    p.tasks.push_back({"F" + std::to_string(k), s.forward_flops * mb / flops_per_second,
                       moves ? s.parameters * 4 : 0});
  }
  for (size_t k = plan.shards.size(); k-- > 0;) {
    const auto& s = plan.shards[k];
    const double fwd = s.forward_flops * mb / flops_per_second;
    p.tasks.push_back({"B" + std::to_string(k),
                       2 * fwd + (s.policy == ActivationPolicy::kRecompute ? fwd : 0.0),
                       moves ? s.parameters * 8 : 0});
  }
  return p;
}

}  // namespace hydra
