#include "agent/executor/pilot.h"

#include <chrono>

#include "agent/executor/gpt2.h"
#include "common/cost_model.h"

namespace hydra::executor {

StatusOr<PilotResult> RunPilot(const Trial& trial) {
  ModelSpec one = trial.model;
  one.n_layer = 1;
  const int64_t micro = trial.training.batch_size / trial.training.gradient_accumulation_steps;
  const int64_t T = trial.model.context_length;
  try {
    auto model = BuildGpt2(one, static_cast<uint64_t>(trial.training.seed));
    auto& block = model.layers[1];
    auto x = torch::randn({micro, T, one.n_embd}).requires_grad_(true);
    auto run = [&]() {
      auto y = block->forward(x);
      y.sum().backward();
    };
    run();
    run();
    const int rounds = 3;
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < rounds; ++i) run();
    PilotResult r;
    r.block_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / rounds;
    r.block_flops = 3.0 * ModelLayerCosts(one, micro)[1].forward_flops;
    r.flops_per_second = r.block_flops / r.block_seconds;
    return r;
  } catch (const c10::Error& e) {
    return InternalError("pilot run of " + trial.name + ": " + e.what_without_backtrace());
  }
}

}  // namespace hydra::executor
