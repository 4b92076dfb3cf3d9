#include "agent/executor/optimizer.h"

#include <gtest/gtest.h>

namespace hydra::executor {
namespace {

// Our optimizer against LibTorch's own torch::optim on the same gradients.
void Compare(const std::string& optimizer) {
  torch::manual_seed(0);
  auto w1 = torch::randn({4, 3}).requires_grad_(true);
  auto b1 = torch::randn({3}).requires_grad_(true);
  auto w2 = w1.detach().clone().requires_grad_(true);
  auto b2 = b1.detach().clone().requires_grad_(true);
  TrainingSpec t;
  t.optimizer = *ParseName<OptimizerKind>(optimizer);
  t.weight_decay = 0.1;
  t.momentum = 0.9;
  Optimizer ours({{"w", w1}, {"b", b1}}, t);
  std::unique_ptr<torch::optim::Optimizer> ref;
  const double lr = 0.01;
  // Weight decay applies to matrices only: two parameter groups for the reference.
  std::vector<torch::optim::OptimizerParamGroup> groups;
  if (optimizer == "adamw") {
    groups.emplace_back(std::vector<torch::Tensor>{w2},
                        std::make_unique<torch::optim::AdamWOptions>(
                            torch::optim::AdamWOptions(lr).weight_decay(0.1)));
    groups.emplace_back(std::vector<torch::Tensor>{b2},
                        std::make_unique<torch::optim::AdamWOptions>(
                            torch::optim::AdamWOptions(lr).weight_decay(0.0)));
    ref = std::make_unique<torch::optim::AdamW>(std::move(groups));
  } else {
    groups.emplace_back(std::vector<torch::Tensor>{w2},
                        std::make_unique<torch::optim::SGDOptions>(
                            torch::optim::SGDOptions(lr).momentum(0.9).weight_decay(0.1)));
    groups.emplace_back(std::vector<torch::Tensor>{b2},
                        std::make_unique<torch::optim::SGDOptions>(
                            torch::optim::SGDOptions(lr).momentum(0.9).weight_decay(0.0)));
    ref = std::make_unique<torch::optim::SGD>(std::move(groups), torch::optim::SGDOptions(lr));
  }
  auto x = torch::randn({5, 4});
  for (int step = 1; step <= 5; ++step) {
    (torch::matmul(x, w1) + b1).pow(2).sum().backward();
    (torch::matmul(x, w2) + b2).pow(2).sum().backward();
    ours.Step(lr, step);
    ref->step();
    ours.ZeroGrad();
    ref->zero_grad();
    EXPECT_TRUE(torch::allclose(w1, w2, 1e-6, 1e-7)) << optimizer << " step " << step;
    EXPECT_TRUE(torch::allclose(b1, b2, 1e-6, 1e-7)) << optimizer << " step " << step;
  }
}

TEST(OptimizerTest, AdamWMatchesTorchOptim) { Compare("adamw"); }
TEST(OptimizerTest, SgdMomentumMatchesTorchOptim) { Compare("sgd"); }

/// A matrix (decayed) and a vector (not) after 5 AdamW steps through `kernel` on `device`, from
/// the same start and with the same gradients (drawn, not computed from the weights, so that
/// rounding does not feed back into them), then their optimizer state; on the CPU.
std::vector<torch::Tensor> AdamWSteps(AdamWKernel kernel, const torch::Device& device) {
  torch::manual_seed(0);
  auto w = torch::randn({64, 33}).to(device).requires_grad_(true);
  auto b = torch::randn({33}).to(device).requires_grad_(true);
  TrainingSpec t;
  t.weight_decay = 0.1;
  Optimizer opt({{"w", w}, {"b", b}}, t);
  opt.set_adamw_kernel(kernel);
  for (int step = 1; step <= 5; ++step) {
    w.mutable_grad() = torch::randn({64, 33}).to(device);
    b.mutable_grad() = torch::randn({33}).to(device);
    opt.Step(0.01, step);
  }
  std::vector<torch::Tensor> out = {w.detach().cpu(), b.detach().cpu()};
  for (const auto& [name, s] : opt.NamedState()) out.push_back(s.cpu());
  return out;
}

TEST(OptimizerTest, LibTorchsFusedAdamWMatchesTheUpdateParameterByParameter) {
  // On a GPU Step runs LibTorch's fused multi-tensor kernel (a few launches a shard, not nine
  // per parameter): the same update as the per-parameter one, on the CPU here and on a GPU
  // where one is visible (scripts/gpu-check.sh).
  if (!TorchFusedAdamW()) GTEST_SKIP() << "LibTorch before 2.4 has no _fused_adamw_";
  std::vector<torch::Device> devices = {torch::kCPU};
  if (torch::cuda::is_available()) devices.emplace_back(torch::kCUDA, 0);
  for (const auto& device : devices) {
    SCOPED_TRACE(device.str());
    const auto each = AdamWSteps(AdamWKernel::kPerTensor, device);
    for (const AdamWKernel k : {AdamWKernel::kTorchFused, AdamWKernel::kAuto}) {
      const auto fused = AdamWSteps(k, device);
      ASSERT_EQ(fused.size(), each.size());
      for (size_t i = 0; i < each.size(); ++i) {
        EXPECT_TRUE(torch::allclose(fused[i], each[i], 1e-5, 1e-6)) << "tensor " << i;
      }
    }
  }
}

TEST(OptimizerTest, ClipScalesGradientsToTheGlobalNorm) {
  auto a = torch::zeros({2}).requires_grad_(true);
  auto b = torch::zeros({1}).requires_grad_(true);
  a.mutable_grad() = torch::tensor({3.0f, 0.0f});
  b.mutable_grad() = torch::tensor({4.0f});
  TrainingSpec t;
  Optimizer opt({{"a", a}, {"b", b}}, t);
  EXPECT_NEAR(opt.ClipGradNorm(1.0), 5.0, 1e-6);
  EXPECT_NEAR(a.grad()[0].item<double>(), 0.6, 1e-5);
  EXPECT_NEAR(b.grad()[0].item<double>(), 0.8, 1e-5);
  EXPECT_NEAR(opt.ClipGradNorm(0), 1.0, 1e-5);  // 0: measure only
}

TEST(OptimizerTest, StateIsNamedPerParameter) {
  auto a = torch::zeros({2, 2}).requires_grad_(true);
  TrainingSpec t;
  Optimizer adam({{"a", a}}, t);
  ASSERT_EQ(adam.NamedState().size(), 2u);
  EXPECT_EQ(adam.NamedState()[0].first, "a.exp_avg");
  EXPECT_EQ(adam.StateBytes(), 2 * 4 * 4);
  t.optimizer = OptimizerKind::kSgd;
  Optimizer sgd({{"a", a}}, t);
  ASSERT_EQ(sgd.NamedState().size(), 1u);
  EXPECT_EQ(sgd.NamedState()[0].first, "a.momentum_buffer");
}

TEST(OptimizerTest, StateLivesWhereItsAllocatorPutsIt) {
  // A discrete device's executor makes the state in its host tier: every slot's memory comes
  // from the allocator, and the update runs there.
  auto a = torch::ones({2, 3}).requires_grad_(true);
  auto b = torch::ones({3}).requires_grad_(true);
  std::vector<torch::Tensor> made;
  auto allocate = [&](const torch::Tensor& p) {
    made.push_back(torch::full_like(p, 0.0));
    return made.back();
  };
  TrainingSpec t;
  Optimizer opt({{"a", a}, {"b", b}}, t, allocate);
  const auto state = opt.NamedState();
  ASSERT_EQ(made.size(), 4u);  // exp_avg and exp_avg_sq of both
  ASSERT_EQ(state.size(), made.size());
  for (size_t i = 0; i < state.size(); ++i) {
    EXPECT_EQ(state[i].second.data_ptr(), made[i].data_ptr()) << state[i].first;
  }
  a.mutable_grad() = torch::ones({2, 3});
  b.mutable_grad() = torch::ones({3});
  opt.Step(0.1, 1);
  EXPECT_GT(made[0].abs().sum().item<double>(), 0);  // the update wrote the allocated memory
}

}  // namespace
}  // namespace hydra::executor
