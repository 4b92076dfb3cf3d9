// bf16 mixed precision (spec.training.precision): what autocast computes in, what stays fp32,
// and that bf16 training tracks fp32 training.
#include "agent/executor/precision.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "agent/executor/cpu_threads.h"
#include "agent/executor/inmemory_executor.h"
#include "tests/unit/executor/executor_testing.h"

namespace hydra::executor {
namespace {

TEST(PrecisionScopeTest, Bf16MatrixProductsInsideFp32OutsideAndNestingRestores) {
  torch::manual_seed(1);
  torch::nn::Linear lin(8, 4);
  const auto x = torch::randn({2, 8});
  {
    PrecisionScope fp32(Precision::kFp32);
    EXPECT_EQ(lin->forward(x).scalar_type(), torch::kFloat) << "fp32 changes nothing";
  }
  {
    PrecisionScope outer(Precision::kBf16);
    EXPECT_EQ(lin->forward(x).scalar_type(), torch::kBFloat16);
    {
      PrecisionScope inner(Precision::kBf16);
      EXPECT_EQ(lin->forward(x).scalar_type(), torch::kBFloat16);
    }
    EXPECT_EQ(lin->forward(x).scalar_type(), torch::kBFloat16) << "inner scope left it on";
    EXPECT_EQ(lin->weight.scalar_type(), torch::kFloat) << "the master weight is not cast";
  }
  EXPECT_EQ(lin->forward(x).scalar_type(), torch::kFloat) << "autocast left on after the scope";
}

TEST(PrecisionScopeTest, NormalisationStatisticsStayFp32) {
  // GPT-2's LayerNorms take the residual stream, fp32 plus a bf16 product: fp32. The ResNet's
  // GroupNorms take a bf16 convolution's output cast to fp32 (vision.cc's Normalize). Both
  // normalise as in fp32, bit for bit, under autocast.
  torch::manual_seed(3);
  torch::nn::Linear lin(64, 64);
  torch::nn::LayerNorm ln(torch::nn::LayerNormOptions({64}));
  torch::nn::Conv2d conv(torch::nn::Conv2dOptions(3, 16, 3).padding(1));
  torch::nn::GroupNorm gn(torch::nn::GroupNormOptions(4, 16));
  const auto x = torch::randn({4, 64}) * 1000 + 3;
  const auto images = torch::randn({2, 3, 4, 4});
  torch::Tensor residual, conv_out, y, g;
  {
    PrecisionScope bf16(Precision::kBf16);
    residual = x + lin->forward(x);
    EXPECT_EQ(residual.scalar_type(), torch::kFloat) << "fp32 plus bf16 is fp32";
    y = ln->forward(residual);
    conv_out = conv->forward(images);
    EXPECT_EQ(conv_out.scalar_type(), torch::kBFloat16);
    g = gn->forward(conv_out.to(torch::kFloat));
  }
  EXPECT_EQ(y.scalar_type(), torch::kFloat);
  // Statistics in bf16 would round values near 1000 to steps of 4 (8 bits of mantissa).
  EXPECT_TRUE(torch::equal(y, ln->forward(residual))) << "LayerNorm under autocast is fp32's";
  EXPECT_EQ(g.scalar_type(), torch::kFloat);
  EXPECT_TRUE(torch::equal(g, gn->forward(conv_out.to(torch::kFloat))));
}

TEST(PrecisionScopeTest, GradientsReachTheFp32MastersAsFp32) {
  torch::manual_seed(2);
  torch::nn::Linear lin(16, 16);
  torch::Tensor y;
  {
    PrecisionScope bf16(Precision::kBf16);
    y = lin->forward(torch::randn({4, 16}));
  }
  y.to(torch::kFloat).pow(2).sum().backward();
  ASSERT_TRUE(lin->weight.grad().defined());
  EXPECT_EQ(lin->weight.grad().scalar_type(), torch::kFloat);
  EXPECT_GT(lin->weight.grad().abs().sum().item<double>(), 0);
}

Trial SmallTrial(Precision precision, const std::string& optimizer) {
  Trial t = testing::GptTrial("bf16", optimizer, 2, 64, 4, 32, 7, 2e-3);
  t.training.steps = 40;
  t.training.grad_clip_norm = 1.0;
  t.training.precision = precision;
  return t;
}

std::unique_ptr<TrialExecutorInterface> Make(ExecutorFactoryInterface* factory, const Trial& t) {
  auto data = TokenDataset::Open(t.dataset, t.model.context_length + 1);
  EXPECT_TRUE(data.ok()) << data.status();
  auto exec = factory->Create(t, *data);
  EXPECT_TRUE(exec.ok()) << exec.status();
  return exec.ok() ? std::move(exec).value() : nullptr;
}

TEST(CpuThreadsTest, Bf16StepsGetEveryThreadAfterTheThreadingIsConfiguredAgain) {
  const std::string how = ConfigureCpuThreads(2);
  if (how.rfind("OpenBLAS", 0) != 0) GTEST_SKIP() << "the BLAS is not OpenBLAS: " << how;
  UseCpuThreadsFor(Precision::kBf16);
  EXPECT_EQ(torch::get_num_threads(), 2);
  UseCpuThreadsFor(Precision::kFp32);
  EXPECT_EQ(torch::get_num_threads(), 1) << "fp32 GEMMs are OpenBLAS's";
  UseCpuThreadsFor(Precision::kBf16);
  ConfigureCpuThreads(2);  // another executor factory on this thread
  EXPECT_EQ(torch::get_num_threads(), 1);
  UseCpuThreadsFor(Precision::kBf16);
  EXPECT_EQ(torch::get_num_threads(), 2) << "a stale per-thread setting kept one thread";
}

TEST(Bf16TrainingTest, MasterWeightsAndOptimizerStateStayFp32) {
  auto factory = MakeInMemoryExecutorFactory({2});
  for (const char* opt : {"adamw", "sgd"}) {
    SCOPED_TRACE(opt);
    auto e = Make(factory.get(), SmallTrial(Precision::kBf16, opt));
    ASSERT_NE(e, nullptr);
    auto before = e->ExportState();
    ASSERT_TRUE(before.ok());
    for (int i = 0; i < 3; ++i) {
      auto m = e->TrainStep();
      ASSERT_TRUE(m.ok()) << m.status();
      EXPECT_TRUE(std::isfinite(m->loss));
      EXPECT_TRUE(std::isfinite(m->grad_norm)) << "clipping saw a finite fp32 norm";
    }
    auto after = e->ExportState();
    ASSERT_TRUE(after.ok());
    ASSERT_EQ(after->size(), before->size());
    int changed = 0, optimizer_state = 0;
    const std::string suffix = std::string(opt) == "adamw" ? ".exp_avg_sq" : ".momentum_buffer";
    for (size_t i = 0; i < after->size(); ++i) {
      const auto& b = (*after)[i];
      EXPECT_EQ(b.dtype, "float32") << b.name;
      changed += b.data != (*before)[i].data;
      const bool is_state =
          b.name.size() > suffix.size() &&
          b.name.compare(b.name.size() - suffix.size(), suffix.size(), suffix) == 0;
      optimizer_state += is_state;
    }
    EXPECT_GT(changed, 0);
    EXPECT_GT(optimizer_state, 0) << "the export holds the optimizer's state (" << suffix << ")";
  }
}

TEST(Bf16TrainingTest, Bf16TracksFp32OnTheExampleGrid) {
  auto job = LoadJobFile(std::string(HYDRA_SOURCE_DIR) + "/examples/tiny-sweep.yaml");
  ASSERT_TRUE(job.ok()) << job.status();
  auto trials = ExpandTrials(*job);
  ASSERT_TRUE(trials.ok()) << trials.status();
  ASSERT_GE(trials->size(), 2u);
  auto factory = MakeInMemoryExecutorFactory({2});
  for (const Trial& fp32 : *trials) {
    SCOPED_TRACE(fp32.name);
    Trial bf16 = fp32;
    bf16.training.precision = Precision::kBf16;
    double val[2] = {0, 0};
    for (int p = 0; p < 2; ++p) {
      auto e = Make(factory.get(), p == 0 ? fp32 : bf16);
      ASSERT_NE(e, nullptr);
      for (int64_t s = 0; s < fp32.training.steps; ++s) ASSERT_TRUE(e->TrainStep().ok());
      auto v = e->Evaluate();
      ASSERT_TRUE(v.ok()) << v.status();
      val[p] = *v;
    }
    EXPECT_LT(val[0], 0.9 * std::log(256.0)) << "the fp32 run learned";
    EXPECT_NEAR(val[1], val[0], 0.02 * val[0]) << "bf16's final validation loss within 2%";
    EXPECT_NE(val[1], val[0]) << "the bf16 run computed in fp32";
    std::printf("%s: validation loss fp32 %.5f, bf16 %.5f (%+.3f%%)\n", fp32.name.c_str(), val[0],
                val[1], 100 * (val[1] - val[0]) / val[0]);
  }
}

}  // namespace
}  // namespace hydra::executor
