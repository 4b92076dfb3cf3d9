#include "agent/executor/pilot.h"

#include <gtest/gtest.h>

#include "agent/executor/torchscript.h"
#include "common/cost_model.h"

namespace hydra::executor {
namespace {

TEST(PilotTest, TheBlockPilotTimesAGpt2MediumBlockNotItsHead) {
  // What MeasureLinkRates times for the planner's compute rate: RunPilot times the heaviest
  // layer, which must be the block (the trial's vocabulary is small), at GPT-2 medium's shape.
  for (const Precision p : {Precision::kFp32, Precision::kBf16}) {
    const Trial t = BlockPilotTrial(p);
    EXPECT_EQ(t.training.precision, p);
    const auto costs = ModelLayerCosts(t, t.training.batch_size);
    ASSERT_EQ(costs.size(), 3u) << "embedding, one block, head";
    size_t heaviest = 0;
    for (size_t i = 1; i < costs.size(); ++i) {
      if (costs[i].forward_flops > costs[heaviest].forward_flops) heaviest = i;
    }
    EXPECT_EQ(costs[heaviest].name, "block0");
    auto model = BuildModel(t);  // what RunPilot builds and times
    ASSERT_TRUE(model.ok()) << model.status();
    ASSERT_EQ(model->names.size(), costs.size());
    EXPECT_EQ(model->names[heaviest], "block0");
    EXPECT_EQ(t.model.n_embd, 1024);
    EXPECT_EQ(t.model.context_length, 1024);
  }
}

TEST(PilotTest, OnACpuThereIsNoLinkOrBlockRateToMeasure) {
  // A CPU device shares the host's memory: nothing is timed (the GPU's rates are
  // cuda_executor_test's), and the factory's options keep their rates.
  auto rates = MeasureLinkRates(DeviceSpec());
  ASSERT_TRUE(rates.ok()) << rates.status();
  EXPECT_EQ(rates->host_link_bytes_per_second, 0);
  EXPECT_EQ(rates->block_flops_per_second, 0);
  EXPECT_EQ(rates->block_bf16_flops_per_second, 0);
  ExecutorOptions o;
  o.flops_per_second = 123e9;
  EXPECT_EQ(UseMeasuredLinkRates(&o), "");
  EXPECT_EQ(o.flops_per_second, 123e9);
  EXPECT_EQ(o.host_link_bytes_per_second, 0);
}

}  // namespace
}  // namespace hydra::executor
