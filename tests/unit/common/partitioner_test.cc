#include "common/partitioner.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace hydra {
namespace {

using ::testing::HasSubstr;

Trial Gpt2(int64_t layers, int64_t width) {
  Trial t;
  t.name = "t";
  t.model.n_layer = layers;
  t.model.n_embd = width;
  t.model.n_head = 4;
  t.model.context_length = 128;
  t.training.batch_size = 4;
  return t;
}

void ExpectContiguousCover(const PartitionPlan& p, int layers) {
  ASSERT_FALSE(p.shards.empty());
  EXPECT_EQ(p.shards.front().first_layer, 0);
  EXPECT_EQ(p.shards.back().last_layer, layers - 1);
  for (size_t i = 1; i < p.shards.size(); ++i) {
    EXPECT_EQ(p.shards[i].first_layer, p.shards[i - 1].last_layer + 1);
  }
}

TEST(PartitionerTest, UnlimitedOrFittingBudgetGivesOneShard) {
  Trial t = Gpt2(4, 128);
  auto p = PlanShards(t, {});
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->shards.size(), 1u);
  EXPECT_EQ(p->pinned_bytes, 0);
  EXPECT_EQ(p->peak_device_bytes, EstimateTrialFootprint(t).total_bytes());
  PartitionOptions o;
  o.device_budget = EstimateTrialFootprint(t).total_bytes();
  EXPECT_EQ(PlanShards(t, o)->shards.size(), 1u);
}

TEST(PartitionerTest, SmallerBudgetsGiveMoreShardsThatFit) {
  Trial t = Gpt2(12, 256);
  const int64_t full = EstimateTrialFootprint(t).total_bytes();
  size_t prev = 1;
  for (double frac : {0.9, 0.5, 0.3, 0.2}) {
    PartitionOptions o;
    o.device_budget = static_cast<int64_t>(full * frac);
    auto p = PlanShards(t, o);
    ASSERT_TRUE(p.ok()) << frac << ": " << p.status();
    ExpectContiguousCover(*p, 14);
    EXPECT_GE(p->shards.size(), prev) << frac;
    EXPECT_GT(p->shards.size(), 1u);
    EXPECT_LE(p->peak_device_bytes, o.device_budget) << frac;
    prev = p->shards.size();
  }
  EXPECT_GE(prev, 4u);
  PartitionOptions tiny;
  tiny.device_budget = full / 10;  // every layer fits alone, but not beside its neighbours
  auto p = PlanShards(t, tiny);
  EXPECT_EQ(p.status().code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(p.status().message(), HasSubstr("prefetch"));
}

TEST(PartitionerTest, LayerThatCannotFitIsNamedWithItsBytes) {
  Trial t = Gpt2(2, 512);
  PartitionOptions o;
  o.device_budget = 4 << 20;
  auto p = PlanShards(t, o);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(p.status().message(), HasSubstr("layer "));
  EXPECT_THAT(p.status().message(), HasSubstr("needs"));
  EXPECT_THAT(p.status().message(), HasSubstr("device budget of 4.00 MiB"));
}

TEST(PartitionerTest, ExplicitBoundariesOverride) {
  Trial t = Gpt2(4, 64);
  PartitionOptions o;
  o.explicit_boundaries = {1, 2, 3, 4, 5};
  auto p = PlanShards(t, o);
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->shards.size(), 6u);
  EXPECT_EQ(p->shards[0].first_name, "embed");
  EXPECT_EQ(p->shards[5].first_name, "head");
  EXPECT_GT(p->pinned_bytes, 0);  // the tied embedding stays on the device
  o.explicit_boundaries = {3, 2};
  EXPECT_EQ(PlanShards(t, o).status().code(), StatusCode::kInvalidArgument);
}

TEST(PartitionerTest, SlowHostLinkChoosesRecompute) {
  Trial t = Gpt2(6, 128);
  PartitionOptions o;
  o.explicit_boundaries = {2, 4, 6};
  auto fast = PlanShards(t, o);
  ASSERT_TRUE(fast.ok());
  for (const auto& s : fast->shards) EXPECT_EQ(s.policy, ActivationPolicy::kStash);
  o.host_link_bytes_per_second = 1e6;  // 1 MB/s: moving activations costs more than compute
  auto slow = PlanShards(t, o);
  ASSERT_TRUE(slow.ok());
  for (size_t i = 0; i + 1 < slow->shards.size(); ++i) {
    EXPECT_EQ(slow->shards[i].policy, ActivationPolicy::kRecompute);
    EXPECT_GT(slow->shards[i].estimated_seconds, fast->shards[i].estimated_seconds);
  }
  EXPECT_EQ(slow->shards.back().policy, ActivationPolicy::kStash);  // runs fwd+bwd at once
}

TEST(PartitionerTest, HostActivationBudgetLimitsTheStash) {
  Trial t = Gpt2(6, 128);
  PartitionOptions o;
  o.explicit_boundaries = {2, 4, 6};
  o.host_activation_budget = 0;
  auto p = PlanShards(t, o);
  ASSERT_TRUE(p.ok());
  for (size_t i = 0; i + 1 < p->shards.size(); ++i) {
    EXPECT_EQ(p->shards[i].policy, ActivationPolicy::kRecompute);
  }
  EXPECT_THAT(FormatPlan(t, *p), HasSubstr("recompute"));
}

}  // namespace
}  // namespace hydra
