#include "agent/executor/pilot.h"

#include <gtest/gtest.h>

#include "agent/executor/torchscript.h"
#include "common/cost_model.h"
#include "tests/unit/executor/executor_testing.h"

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

TEST(PilotTest, ThePilotsLayerRunsItsAttentionAsTheExecutorsDo) {
  // The rate the planner divides a shard's FLOPs by must be the one its attention reaches: the
  // executors run it fused where LibTorch has it (the CUDA build), and a block timed with the
  // T x T scores kept ran at 0.6 of the model's rate on an H200 in bf16 (the fifth GPU run).
  Trial t = testing::GptTrial("pilot", "adamw", 2, 64, 4, 32, 4, 3e-4);
  auto pilot = RunPilot(t);
  ASSERT_TRUE(pilot.ok()) << pilot.status();
  EXPECT_EQ(pilot->layer, "block0");
  EXPECT_EQ(pilot->attention, ExecutorAttention(/*fused_attention=*/true));
  EXPECT_EQ(pilot->attention,
            FusedAttentionAvailable() ? AttentionMemory::kFused : AttentionMemory::kKept);
  EXPECT_GT(pilot->flops_per_second, 0);
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
