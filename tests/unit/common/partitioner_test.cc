#include "common/partitioner.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>

namespace hydra {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

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
  // The footprint, less the activations autograd frees before the last gradients appear.
  EXPECT_EQ(p->peak_device_bytes,
            EstimateTrialFootprint(t).total_bytes() - p->shards[0].backward_freed_bytes);
  PartitionOptions o;
  o.device_budget = EstimateTrialFootprint(t).total_bytes();
  EXPECT_EQ(PlanShards(t, o)->shards.size(), 1u);
}

TEST(PartitionerTest, OneMicroBatchsBackwardCountsOnlyTheActivationsAndGradientsThatCoexist) {
  // The backward runs from the last layer to the first, and autograd frees what a layer saved
  // once its backward has run: while layer j's runs, layers 0..j hold their activations and
  // layers j..n their gradients. The allocator of an H200 training GPT-2 medium in bf16
  // unsharded peaked 1.17 GiB under activations + gradients (its gradients: 1.32 GiB).
  Trial t = Gpt2(12, 256);
  const int64_t full = EstimateTrialFootprint(t).total_bytes();
  auto one = PlanShards(t, {});
  ASSERT_TRUE(one.ok()) << one.status();
  const ShardPlan& whole = one->shards[0];
  EXPECT_GT(whole.backward_freed_bytes, 0);
  EXPECT_LT(whole.backward_freed_bytes, std::min(whole.activation_bytes, whole.gradient_bytes));
  EXPECT_EQ(one->peak_device_bytes, full - whole.backward_freed_bytes);
  PartitionOptions o;
  o.device_budget = one->peak_device_bytes;  // under the footprint: still unsharded
  ASSERT_LT(o.device_budget, full);
  EXPECT_EQ(PlanShards(t, o)->shards.size(), 1u);
  o.device_budget -= 1;
  EXPECT_GT(PlanShards(t, o)->shards.size(), 1u);

  // Sharded: a shard's peak is its own layers' coexisting activations and gradients too.
  o.device_budget = full / 2;
  auto half = PlanShards(t, o);
  ASSERT_TRUE(half.ok()) << half.status();
  ASSERT_GT(half->shards.size(), 1u);
  EXPECT_LE(half->peak_device_bytes, o.device_budget);
  for (const ShardPlan& s : half->shards) {
    if (s.first_layer == s.last_layer) continue;  // one layer: nothing before or after it
    EXPECT_GT(s.backward_freed_bytes, 0) << ShardLayers(s);
  }

  // With two micro-batches every gradient exists (from the first one's backward) while the
  // second recomputes all its activations: both count whole.
  t.training.gradient_accumulation_steps = 2;
  auto two = PlanShards(t, PartitionOptionsFor(t));
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(two->shards[0].backward_freed_bytes, 0);
  EXPECT_EQ(two->peak_device_bytes, EstimateTrialFootprint(t).total_bytes());
}

TEST(PartitionerTest, ALastShardCountsNoLogitsTheFusedLmHeadNeverHolds) {
  // GPT-2's head yields the loss (LayersLoss: the fused head and loss, in blocks of the
  // logits); a shard ending with it held 1.53 GiB of [8192, 50257] fp32 logits in its need.
  Trial t = Gpt2(2, 64);
  t.model.vocab_size = 50257;
  t.model.context_length = 1024;
  t.training.batch_size = 8;
  PartitionOptions o;
  o.explicit_boundaries = {3};  // embed..block1, head
  auto p = PlanShards(t, o);
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->shards.back().first_name, "head");
  const int64_t logits = int64_t{8} * 1024 * 50257 * 4;
  EXPECT_LT(p->peak_device_bytes, logits / 2) << FormatPlan(t, *p);
}

TEST(PartitionerTest, SmallerBudgetsGiveMoreShardsThatFit) {
  Trial t = Gpt2(12, 256);
  const int64_t full = EstimateTrialFootprint(t).total_bytes();
  size_t prev = 1;
  for (double frac : {0.8, 0.5, 0.3, 0.2}) {
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
  tiny.device_budget = full / 9;  // every layer fits alone, but not beside its neighbours
  tiny.optimizer_placement = OptimizerPlacement::kDevice;  // (the host's optimizer would fit)
  auto p = PlanShards(t, tiny);
  EXPECT_EQ(p.status().code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(p.status().message(), HasSubstr("prefetch"));
}

TEST(PartitionerTest, TheLayersBuffersStayOnTheDeviceInEveryPlan) {
  // GPT-2's causal mask ([T, T] fp32, one for every block) is on the device all along:
  // unsharded in the footprint, sharded beside the shards' peak, and named in the plan.
  Trial t = Gpt2(12, 256);
  const int64_t mask = 128 * 128 * 4;
  auto whole = PlanShards(t, {});
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(whole->buffer_bytes, mask);
  EXPECT_EQ(EstimateTrialFootprint(t).buffer_bytes, mask);
  PartitionOptions o;
  o.device_budget = EstimateTrialFootprint(t).total_bytes() / 3;
  auto sharded = PlanShards(t, o);
  ASSERT_TRUE(sharded.ok()) << sharded.status();
  ASSERT_GT(sharded->shards.size(), 1u);
  EXPECT_EQ(sharded->buffer_bytes, mask);
  EXPECT_LE(sharded->peak_device_bytes, o.device_budget);
  EXPECT_THAT(FormatPlan(t, *sharded), HasSubstr("(64.0 KiB of buffers)"));
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

TEST(PartitionerTest, TheOptimizerStepsWhereTheCostModelSaysItIsCheaper) {
  Trial t = Gpt2(6, 128);
  t.training.optimizer = OptimizerKind::kAdamW;  // 8 bytes of state per parameter
  PartitionOptions o;
  EXPECT_EQ(ChooseOptimizerPlacement(t, o), OptimizerPlacement::kDevice);  // a CPU: free link
  o.host_link_bytes_per_second = 25e9;
  EXPECT_EQ(ChooseOptimizerPlacement(t, o), OptimizerPlacement::kDevice);  // host rate unknown
  // Per parameter: 16 bytes of state over the link (0.64 ns at 25 GB/s) against 28 bytes
  // streamed by the host optimizer.
  o.host_optimizer_bytes_per_second = 100e9;  // 0.28 ns
  EXPECT_EQ(ChooseOptimizerPlacement(t, o), OptimizerPlacement::kHost);
  o.host_optimizer_bytes_per_second = 20e9;  // 1.4 ns
  EXPECT_EQ(ChooseOptimizerPlacement(t, o), OptimizerPlacement::kDevice);
  o.host_link_bytes_per_second = 5e9;  // a slow link: 3.2 ns
  EXPECT_EQ(ChooseOptimizerPlacement(t, o), OptimizerPlacement::kHost);
  o.optimizer_placement = OptimizerPlacement::kDevice;  // an override wins
  EXPECT_EQ(ChooseOptimizerPlacement(t, o), OptimizerPlacement::kDevice);
  o.optimizer_placement.reset();
  o.state_tier = StateTier::kDisk;  // host stepping from disk is not built
  EXPECT_EQ(ChooseOptimizerPlacement(t, o), OptimizerPlacement::kDevice);
  o.optimizer_placement = OptimizerPlacement::kHost;
  o.device_budget = EstimateTrialFootprint(t).total_bytes() / 2;
  auto refused = PlanShards(t, o);
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("host tier"));
}

TEST(PartitionerTest, TheOptimizerFlagLeavesAutoToTheCostModelAndNamesItsChoices) {
  EXPECT_EQ(*ParseOptimizerFlag("auto"), std::nullopt);
  EXPECT_EQ(*ParseOptimizerFlag("device"), OptimizerPlacement::kDevice);
  EXPECT_EQ(*ParseOptimizerFlag("host"), OptimizerPlacement::kHost);
  for (const char* bad : {"", "Host", "cpu"}) {
    auto parsed = ParseOptimizerFlag(bad);
    EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(parsed.status().message(), HasSubstr("auto, device or host"));
  }
  PartitionOptions host_tier, disk;
  disk.state_tier = StateTier::kDisk;
  ApplyOptimizerFlag(OptimizerPlacement::kHost, &host_tier);
  ApplyOptimizerFlag(OptimizerPlacement::kHost, &disk);
  EXPECT_EQ(host_tier.optimizer_placement, OptimizerPlacement::kHost);
  EXPECT_EQ(disk.optimizer_placement, std::nullopt) << "state on disk steps on the device";
}

TEST(PartitionerTest, AShardWithEnoughComputeToHideItsStatesCopiesStepsOnTheDevice) {
  Trial t = Gpt2(6, 128);
  t.training.optimizer = OptimizerKind::kAdamW;
  PartitionOptions o;
  o.explicit_boundaries = {1, 7};  // the embedding, the six blocks, the head
  o.host_link_bytes_per_second = 25e9;
  o.host_optimizer_bytes_per_second = 100e9;
  ASSERT_EQ(ChooseOptimizerPlacement(t, o), OptimizerPlacement::kHost);
  // Compute too fast to hide anything: every shard as the trial-wide choice.
  o.flops_per_second = 1e20;
  auto fast = PlanShards(t, o);
  ASSERT_TRUE(fast.ok()) << fast.status();
  ASSERT_EQ(fast->shards.size(), 3u);
  for (const auto& s : fast->shards) EXPECT_EQ(s.optimizer, OptimizerPlacement::kHost);
  // At 100 GFLOP/s compute hides the state's copies on the copy streams, but not the host
  // optimizer's time: the blocks and the head step on the device; the embedding, with about 4
  // FLOPs a parameter to hide them behind (against the blocks' ~3000), on the host.
  o.flops_per_second = 1e11;
  auto slow = PlanShards(t, o);
  ASSERT_TRUE(slow.ok()) << slow.status();
  EXPECT_EQ(slow->shards[0].optimizer, OptimizerPlacement::kHost);
  EXPECT_EQ(slow->shards[1].optimizer, OptimizerPlacement::kDevice);
  EXPECT_EQ(slow->shards[2].optimizer, OptimizerPlacement::kDevice);
  EXPECT_GT(slow->peak_device_bytes, fast->peak_device_bytes) << "their state is on the device";
  EXPECT_THAT(FormatPlan(t, *slow), HasSubstr("device"));
  // A budget that holds the plan with every optimizer on the host and little more: the state
  // comes onto the device only where the plan still fits.
  o.device_budget = fast->peak_device_bytes + 1;
  auto tight = PlanShards(t, o);
  ASSERT_TRUE(tight.ok()) << tight.status();
  EXPECT_LE(tight->peak_device_bytes, o.device_budget);
  EXPECT_EQ(tight->shards[1].optimizer, OptimizerPlacement::kHost) << "the blocks' state is big";
  // An operator's override is not second-guessed.
  o.device_budget = 0;
  o.optimizer_placement = OptimizerPlacement::kHost;
  auto forced = PlanShards(t, o);
  ASSERT_TRUE(forced.ok()) << forced.status();
  for (const auto& s : forced->shards) EXPECT_EQ(s.optimizer, OptimizerPlacement::kHost);
}

TEST(PartitionerTest, AnOptimizerOnTheHostLeavesItsStateOffTheDevice) {
  Trial t = Gpt2(12, 256);
  t.training.optimizer = OptimizerKind::kAdamW;
  const int64_t full = EstimateTrialFootprint(t).total_bytes();
  PartitionOptions o;
  o.device_budget = full * 3 / 10;
  auto device = PlanShards(t, o);
  ASSERT_TRUE(device.ok()) << device.status();
  o.optimizer_placement = OptimizerPlacement::kHost;
  auto host = PlanShards(t, o);
  ASSERT_TRUE(host.ok()) << host.status();
  ExpectContiguousCover(*host, 14);
  EXPECT_LT(host->shards.size(), device->shards.size());
  EXPECT_LE(host->peak_device_bytes, o.device_budget);
  // What moves between the tiers is the same: weights and optimizer state.
  EXPECT_EQ(host->total_state_bytes, device->total_state_bytes);
  for (const auto& s : host->shards) EXPECT_EQ(s.optimizer, OptimizerPlacement::kHost);
  for (const auto& s : device->shards) EXPECT_EQ(s.optimizer, OptimizerPlacement::kDevice);
  EXPECT_THAT(FormatPlan(t, *host), HasSubstr("optimizer"));
  // A budget the whole model fits: plain training, the optimizer on the device.
  o.device_budget = full;
  auto whole = PlanShards(t, o);
  ASSERT_EQ(whole->shards.size(), 1u);
  EXPECT_EQ(whole->shards[0].optimizer, OptimizerPlacement::kDevice);
  // Too small for the whole model with its optimizer state, enough without it: one shard
  // whose optimizer steps on the host.
  o.device_budget = whole->peak_device_bytes - whole->peak_device_bytes / 20;
  auto one = PlanShards(t, o);
  ASSERT_TRUE(one.ok()) << one.status();
  ASSERT_EQ(one->shards.size(), 1u);
  EXPECT_EQ(one->shards[0].optimizer, OptimizerPlacement::kHost);
  EXPECT_LE(one->peak_device_bytes, o.device_budget);
}

TEST(PartitionerTest, LeftToTheCostModelTheOptimizerStepsOnTheHostWhereOnlyThatFits) {
  Trial t = Gpt2(12, 256);
  t.training.optimizer = OptimizerKind::kAdamW;
  PartitionOptions o;  // a CPU device: the cost model's choice is the device
  ASSERT_EQ(ChooseOptimizerPlacement(t, o), OptimizerPlacement::kDevice);
  // The largest budget at which no plan fits with AdamW's state on the device.
  PartitionOptions device = o;
  device.optimizer_placement = OptimizerPlacement::kDevice;
  device.device_budget = EstimateTrialFootprint(t).total_bytes();
  while (PlanShards(t, device).ok()) device.device_budget = device.device_budget * 15 / 16;
  EXPECT_EQ(PlanShards(t, device).status().code(), StatusCode::kResourceExhausted)
      << "an operator's --optimizer=device is not second-guessed";
  o.device_budget = device.device_budget;
  auto chosen = PlanShards(t, o);
  ASSERT_TRUE(chosen.ok()) << chosen.status();
  SCOPED_TRACE(FormatPlan(t, *chosen));
  ExpectContiguousCover(*chosen, 14);
  EXPECT_LE(chosen->peak_device_bytes, o.device_budget);
  for (const auto& s : chosen->shards) EXPECT_EQ(s.optimizer, OptimizerPlacement::kHost);
  PartitionOptions host = o;
  host.optimizer_placement = OptimizerPlacement::kHost;
  auto forced = PlanShards(t, host);
  ASSERT_TRUE(forced.ok()) << forced.status();
  EXPECT_EQ(chosen->shards.size(), forced->shards.size());
  EXPECT_EQ(chosen->peak_device_bytes, forced->peak_device_bytes);
  EXPECT_TRUE(chosen->optimizer_on_host_to_fit);
  EXPECT_FALSE(forced->optimizer_on_host_to_fit) << "an operator's choice";
  EXPECT_THAT(FormatPlan(t, *chosen), HasSubstr("no sharding fits with its state on the device"));
  EXPECT_THAT(FormatPlan(t, *forced), Not(HasSubstr("no sharding fits")));
  // With the state on disk the optimizer steps on the device (host stepping from disk is not
  // built): no fallback.
  PartitionOptions disk = o;
  disk.state_tier = StateTier::kDisk;
  EXPECT_EQ(PlanShards(t, disk).status().code(), StatusCode::kResourceExhausted);
  // Where even the host's optimizer does not make a layer fit, the error counts what the
  // layer needs that way: its weights, without the optimizer's state.
  o.device_budget = 1 << 20;
  auto refused = PlanShards(t, o);
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(), HasSubstr("its optimizer stepping on the host"));
}

TEST(PartitionerTest, WhereOnlyTheHostOptimizerFitsShardsWhoseStateFitsStillStepOnTheDevice) {
  Trial t = Gpt2(12, 256);
  t.training.optimizer = OptimizerKind::kAdamW;
  PartitionOptions o;  // a GPU's rates: the cost model steps on the device
  o.host_link_bytes_per_second = 25e9;
  o.host_optimizer_bytes_per_second = 20e9;
  o.flops_per_second = 1e11;
  ASSERT_EQ(ChooseOptimizerPlacement(t, o), OptimizerPlacement::kDevice);
  // The largest budget at which no plan fits with every shard's state on the device: packed for
  // the host optimizer, most shards' state still fits on the device beside the plan, not all.
  PartitionOptions device = o;
  device.optimizer_placement = OptimizerPlacement::kDevice;
  device.device_budget = EstimateTrialFootprint(t).total_bytes();
  while (PlanShards(t, device).ok()) device.device_budget = device.device_budget * 15 / 16;
  o.device_budget = device.device_budget;
  auto chosen = PlanShards(t, o);
  ASSERT_TRUE(chosen.ok()) << chosen.status();
  SCOPED_TRACE(FormatPlan(t, *chosen));
  ExpectContiguousCover(*chosen, 14);
  EXPECT_TRUE(chosen->optimizer_on_host_to_fit);
  EXPECT_LE(chosen->peak_device_bytes, o.device_budget);
  const auto stepping = [](const PartitionPlan& p, OptimizerPlacement where) {
    return std::count_if(p.shards.begin(), p.shards.end(),
                         [&](const ShardPlan& s) { return s.optimizer == where; });
  };
  EXPECT_GT(stepping(*chosen, OptimizerPlacement::kDevice), 0) << "faster there, and fits";
  EXPECT_GT(stepping(*chosen, OptimizerPlacement::kHost), 0) << "else the device plan fits";
  // An operator's --optimizer=host keeps every shard's state off the device.
  PartitionOptions host = o;
  host.optimizer_placement = OptimizerPlacement::kHost;
  auto forced = PlanShards(t, host);
  ASSERT_TRUE(forced.ok()) << forced.status();
  EXPECT_EQ(stepping(*forced, OptimizerPlacement::kDevice), 0);
  EXPECT_GT(chosen->peak_device_bytes, forced->peak_device_bytes) << "state on the device";
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

/// A GPT-2 whose blocks' activations are mostly attention scores (16 heads at context 512
/// against width 256: 80% of a block's activations, 25% of its forward FLOPs; GPT-2 medium's
/// shape has 67% and 14%).
Trial LongContext() {
  Trial t = Gpt2(6, 256);
  t.model.n_head = 16;
  t.model.context_length = 512;
  t.model.vocab_size = 256;
  return t;
}

/// A discrete device's options (stashed graphs kept in its memory) at `budget`.
PartitionOptions OnAGpu(int64_t budget) {
  PartitionOptions o;
  o.device_budget = budget;
  o.stash_on_device = true;
  o.host_link_bytes_per_second = 25e9;
  return o;
}

TEST(PartitionerTest, OnAGpuRecomputingAttentionScoresLetsATrialTrainUnspilled) {
  const Trial t = LongContext();
  const int64_t full = EstimateTrialFootprint(t).total_bytes();
  PartitionOptions o = OnAGpu(full / 2);
  PartitionOptions keep = o;
  keep.attention_recompute = false;
  auto kept = PlanShards(t, keep);
  auto lean = PlanShards(t, o);
  ASSERT_TRUE(kept.ok()) << kept.status();
  ASSERT_TRUE(lean.ok()) << lean.status();
  EXPECT_EQ(kept->attention, AttentionMemory::kKept);
  EXPECT_GT(kept->shards.size(), 1u);
  EXPECT_EQ(lean->attention, AttentionMemory::kRecomputed);
  EXPECT_EQ(lean->shards.size(), 1u) << FormatPlan(t, *lean);
  EXPECT_LT(EstimatedStepSeconds(*lean), EstimatedStepSeconds(*kept));
  EXPECT_LE(lean->peak_device_bytes, o.device_budget);
  // The activations leave the scores out; the scores of one block (rebuilt in its backward)
  // are the plan's transient.
  int64_t activations = 0, attention = 0, largest = 0;
  double attention_flops = 0, forward_flops = 0;
  for (const auto& c : ModelLayerCosts(t, t.training.batch_size)) {
    activations += c.activation_bytes - c.attention_bytes;
    attention += c.attention_bytes;
    largest = std::max(largest, c.attention_bytes);
    attention_flops += c.attention_flops;
    forward_flops += c.forward_flops;
  }
  EXPECT_EQ(lean->shards[0].activation_bytes, activations);
  EXPECT_EQ(lean->peak_device_bytes, EstimateTrialFootprint(t).total_bytes() - attention + largest -
                                         lean->shards[0].backward_freed_bytes);
  EXPECT_DOUBLE_EQ(lean->shards[0].estimated_seconds,
                   (3 * forward_flops + attention_flops) / o.flops_per_second);
  EXPECT_THAT(FormatPlan(t, *lean), HasSubstr("attention scores recomputed in backward"));
}

TEST(PartitionerTest, WhereActivationsCanBeStashedTheScoresAreKept) {
  // On a CPU device the stash costs nothing to keep: recomputing would only add FLOPs.
  const Trial t = LongContext();
  PartitionOptions o;
  o.device_budget = EstimateTrialFootprint(t).total_bytes() / 2;
  auto p = PlanShards(t, o);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->attention, AttentionMemory::kKept);
  // Nor when the budget fits the trial, or the boundaries are given.
  EXPECT_EQ(PlanShards(t, OnAGpu(EstimateTrialFootprint(t).total_bytes()))->attention,
            AttentionMemory::kKept);
  PartitionOptions cut = OnAGpu(0);
  cut.explicit_boundaries = {2, 4};
  EXPECT_EQ(PlanShards(t, cut)->attention, AttentionMemory::kKept);
}

TEST(PartitionerTest, FusedAttentionKeepsNoScoresInEveryPlanAndRecomputesNothing) {
  const Trial t = LongContext();
  int64_t attention = 0, largest_output = 0;
  double forward_flops = 0;
  for (const auto& c : ModelLayerCosts(t, t.training.batch_size)) {
    attention += c.attention_bytes;
    if (c.attention_bytes > 0) largest_output = std::max(largest_output, c.output_bytes);
    forward_flops += c.forward_flops;
  }
  const int64_t kept = EstimateTrialFootprint(t).total_bytes();
  const int64_t fused = EstimateTrialFootprint(t, AttentionMemory::kFused).total_bytes();
  // The footprint leaves every layer's scores out and counts the most one layer's backward
  // allocates: with kept scores their gradients, fused the kernel's accumulator or the rest of
  // the block's backward.
  int64_t kept_transient = 0, fused_transient = 0;
  for (const auto& c : ModelLayerCosts(t, t.training.batch_size)) {
    kept_transient =
        std::max(kept_transient, BackwardTransientBytes(c, AttentionMemory::kKept, false));
    fused_transient =
        std::max(fused_transient, BackwardTransientBytes(c, AttentionMemory::kFused, false));
  }
  EXPECT_GE(fused_transient, largest_output);
  EXPECT_EQ(fused, kept - attention - kept_transient + fused_transient);
  for (const int64_t budget : {int64_t{0}, fused, kept / 2, kept / 4}) {
    PartitionOptions o = OnAGpu(budget);
    o.fused_attention = true;
    auto p = PlanShards(t, o);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(p->attention, AttentionMemory::kFused) << FormatPlan(t, *p);
    EXPECT_THAT(FormatPlan(t, *p), HasSubstr("attention fused"));
    if (budget > 0) {
      EXPECT_LE(p->peak_device_bytes, budget) << FormatPlan(t, *p);
    }
    for (const auto& s : p->shards) EXPECT_EQ(s.attention_flops, 0) << FormatPlan(t, *p);
  }
  // What fits unsharded with the fused kernel needed shards with the scores kept.
  PartitionOptions o = OnAGpu(fused);
  o.fused_attention = true;
  EXPECT_EQ(PlanShards(t, o)->shards.size(), 1u);
  EXPECT_DOUBLE_EQ(EstimatedStepSeconds(*PlanShards(t, o)), 3 * forward_flops / o.flops_per_second);
  o.fused_attention = false;
  o.attention_recompute = false;
  EXPECT_GT(PlanShards(t, o)->shards.size(), 1u);
}

TEST(PartitionerTest, OnAGpuMoreShardsMustSaveMoreThanTheirOverhead) {
  // GPT-2 XL's shape at half its (fused) footprint, at an H200's rates: a shard a layer would
  // recompute least, but every shard costs kShardOverheadSeconds a step, so the plan cuts
  // fewer shards (two blocks a shard, every graph stashed), and its estimated step is no
  // longer than the one-layer-a-shard plan's.
  Trial t = Gpt2(48, 1600);
  t.model.n_head = 25;
  t.model.context_length = 1024;
  t.model.vocab_size = 50257;
  PartitionOptions o = OnAGpu(EstimateTrialFootprint(t, AttentionMemory::kFused).total_bytes() / 2);
  o.fused_attention = true;
  o.flops_per_second = 40e12;
  o.host_link_bytes_per_second = 55.3e9;
  auto plan = PlanShards(t, o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  PartitionOptions per_layer = o;
  for (int i = 1; i < 50; ++i) per_layer.explicit_boundaries.push_back(i);
  auto finest = PlanShards(t, per_layer);
  ASSERT_TRUE(finest.ok()) << finest.status();
  EXPECT_LT(plan->shards.size(), finest->shards.size()) << FormatPlan(t, *plan);
  EXPECT_LE(EstimatedStepSeconds(*plan), EstimatedStepSeconds(*finest));
  for (const auto& s : plan->shards) EXPECT_GE(s.estimated_seconds, kShardOverheadSeconds);
}

/// The shards of `p` but the last that stash, and their activations (one micro-batch's).
int64_t StashedActivations(const PartitionPlan& p, size_t* stashing) {
  int64_t bytes = 0;
  *stashing = 0;
  for (size_t s = 0; s + 1 < p.shards.size(); ++s) {
    if (p.shards[s].policy != ActivationPolicy::kStash) continue;
    ++*stashing;
    bytes += p.shards[s].activation_bytes;
  }
  return bytes;
}

TEST(PartitionerTest, OnAGpuStashedGraphsCountAgainstTheDeviceBudget) {
  const Trial t = Gpt2(6, 128);
  PartitionOptions host;  // a CPU: the stash lives in the host tier
  host.explicit_boundaries = {2, 4, 6};
  PartitionOptions gpu = OnAGpu(0);
  gpu.explicit_boundaries = host.explicit_boundaries;
  auto in_host = PlanShards(t, host);
  auto on_device = PlanShards(t, gpu);
  ASSERT_TRUE(in_host.ok() && on_device.ok());
  size_t stashing = 0;
  const int64_t stashed = StashedActivations(*on_device, &stashing);
  EXPECT_EQ(stashing, on_device->shards.size() - 1);  // no budget: every shard stashes
  EXPECT_TRUE(on_device->stash_on_device);
  EXPECT_FALSE(in_host->stash_on_device);
  // While the last shard runs, every other shard's graph is on the device beside it.
  const ShardPlan& last = on_device->shards.back();
  EXPECT_GE(on_device->peak_device_bytes,
            stashed + last.state_bytes + last.gradient_bytes + last.workspace_bytes);
  EXPECT_GE(on_device->peak_device_bytes, in_host->peak_device_bytes + stashed / 2);
  EXPECT_THAT(FormatPlan(t, *on_device), HasSubstr("stashed graphs kept in device memory"));
}

/// The shards of `p` whose policy is `policy`, the last one left out.
size_t ShardsThat(const PartitionPlan& p, ActivationPolicy policy) {
  size_t n = 0;
  for (size_t s = 0; s + 1 < p.shards.size(); ++s) n += p.shards[s].policy == policy;
  return n;
}

/// Host-link bytes a step of `p` moves as PartitionPlan::link_seconds counts them: each shard
/// not resident brings its state up and sends it back, those between the first and the last
/// bring their weights up for the forward too, and offloaded graphs go out and back.
double LinkBytes(const PartitionPlan& p) {
  double bytes = 2.0 * static_cast<double>(p.offloaded_bytes);
  for (size_t s = 0; s < p.shards.size(); ++s) {
    const ShardPlan& sh = p.shards[s];
    if (sh.resident) continue;
    bytes += 2.0 * static_cast<double>(sh.state_bytes);
    if (s > 0 && s + 1 < p.shards.size()) bytes += 4.0 * static_cast<double>(sh.parameters);
  }
  return bytes;
}

TEST(PartitionerTest, OnAGpuShardsKeepTheirStateWhereTheLinkCannotCarryIt) {
  const Trial t = Gpt2(12, 256);
  PartitionOptions o = OnAGpu(EstimateTrialFootprint(t).total_bytes() / 2);
  o.flops_per_second = 1e13;           // a fast device behind a slow link: the copies of every
  o.host_link_bytes_per_second = 1e9;  // shard's state would take longer than the compute
  auto moving = PlanShards(t, o);
  o.resident_state = true;
  auto keeping = PlanShards(t, o);
  ASSERT_TRUE(moving.ok()) << moving.status();
  ASSERT_TRUE(keeping.ok()) << keeping.status();
  ASSERT_GT(moving->shards.size(), 1u);
  EXPECT_EQ(moving->resident_bytes, 0);
  EXPECT_EQ(moving->link_seconds, 0) << "the link is weighed only with resident_state";
  for (const auto& sh : moving->shards) EXPECT_FALSE(sh.resident);

  ASSERT_GT(keeping->resident_bytes, 0) << FormatPlan(t, *keeping);
  int64_t resident = 0;
  bool seen = false;
  for (const auto& sh : keeping->shards) {
    EXPECT_TRUE(sh.resident || !seen) << "the resident shards are the last ones";
    seen = seen || sh.resident;
    if (!sh.resident) continue;
    resident += sh.state_bytes;
    EXPECT_EQ(sh.optimizer, OptimizerPlacement::kDevice);
  }
  EXPECT_EQ(keeping->resident_bytes, resident);
  EXPECT_LT(resident, keeping->total_state_bytes) << "half the footprint cannot hold it all";
  EXPECT_LE(keeping->peak_device_bytes, o.device_budget);
  EXPECT_GE(keeping->peak_device_bytes, resident + keeping->pinned_bytes);
  // Its copies, and the step they bound: shorter than moving every shard's state.
  EXPECT_NEAR(keeping->link_seconds, LinkBytes(*keeping) / 1e9, 1e-9);
  PartitionPlan all_moving = *keeping;
  for (auto& sh : all_moving.shards) sh.resident = false;
  EXPECT_LT(keeping->link_seconds, LinkBytes(all_moving) / 1e9);
  EXPECT_LT(EstimatedStepSeconds(*keeping), LinkBytes(*moving) / 1e9);
  EXPECT_GE(EstimatedStepSeconds(*keeping), keeping->link_seconds);
  EXPECT_THAT(FormatPlan(t, *keeping), HasSubstr("resident on the device between steps"));
  EXPECT_THAT(FormatPlan(t, *keeping), HasSubstr(" resident "));
}

TEST(PartitionerTest, ALinkThatKeepsPaceWithTheComputeKeepsNoShardResident) {
  const Trial t = Gpt2(12, 256);
  PartitionOptions o = OnAGpu(EstimateTrialFootprint(t).total_bytes() / 2);
  o.flops_per_second = 1e12;
  o.host_link_bytes_per_second = 1e13;
  auto moving = PlanShards(t, o);
  o.resident_state = true;
  auto keeping = PlanShards(t, o);
  ASSERT_TRUE(moving.ok() && keeping.ok());
  EXPECT_EQ(keeping->resident_bytes, 0) << FormatPlan(t, *keeping);
  ASSERT_EQ(keeping->shards.size(), moving->shards.size());
  for (size_t s = 0; s < keeping->shards.size(); ++s) {
    EXPECT_EQ(keeping->shards[s].first_layer, moving->shards[s].first_layer);
    EXPECT_EQ(keeping->shards[s].policy, moving->shards[s].policy);
  }
  EXPECT_GT(keeping->link_seconds, 0);
  EXPECT_DOUBLE_EQ(EstimatedStepSeconds(*keeping), EstimatedStepSeconds(*moving));
}

TEST(PartitionerTest, OnlyAGpuStateInHostMemorySteppedOnTheDeviceStaysResident) {
  const Trial t = Gpt2(12, 256);
  PartitionOptions gpu = OnAGpu(EstimateTrialFootprint(t).total_bytes() / 2);
  gpu.flops_per_second = 1e13;
  gpu.host_link_bytes_per_second = 1e9;
  gpu.resident_state = true;
  PartitionOptions cpu = gpu;  // a CPU's memory is the host's: nothing to keep
  cpu.stash_on_device = false;
  PartitionOptions disk = gpu;
  disk.state_tier = StateTier::kDisk;
  PartitionOptions host_steps = gpu;
  host_steps.optimizer_placement = OptimizerPlacement::kHost;
  for (const auto* o : {&cpu, &disk, &host_steps}) {
    auto plan = PlanShards(t, *o);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(plan->resident_bytes, 0) << FormatPlan(t, *plan);
    EXPECT_EQ(plan->link_seconds, 0);
    for (const auto& sh : plan->shards) EXPECT_FALSE(sh.resident);
  }
}

TEST(PartitionerTest, OnAGpuRecomputingShardsInputsWaitInHostMemoryWhereOnlyThatFits) {
  // A deep, narrow model with a long context: the inputs that recomputing shards keep for their
  // backward outweigh a layer's state, so at small budgets they are what does not fit. With
  // checkpoint_offload they wait in host memory (copied out after the shard's forward, back
  // beside the next shard's backward): the budget that refused the trial now holds it.
  Trial t = Gpt2(24, 128);
  t.model.context_length = 1024;
  t.model.vocab_size = 256;
  const int64_t full = EstimateTrialFootprint(t).total_bytes();
  bool found = false;
  for (int pct = 60; pct > 2 && !found; --pct) {
    PartitionOptions o = OnAGpu(full * pct / 100);
    o.flops_per_second = 1e12;
    o.host_link_bytes_per_second = 1e11;
    auto kept = PlanShards(t, o);
    o.checkpoint_offload = true;
    auto offloaded = PlanShards(t, o);
    if (kept.ok() || !offloaded.ok()) continue;
    found = true;
    SCOPED_TRACE(FormatPlan(t, *offloaded));
    EXPECT_EQ(kept.status().code(), StatusCode::kResourceExhausted);
    EXPECT_LE(offloaded->peak_device_bytes, o.device_budget);
    int64_t inputs = 0;
    const auto& sh = offloaded->shards;
    for (size_t s = 0; s < sh.size(); ++s) {
      if (!sh[s].input_offloaded) continue;
      EXPECT_GT(s, 0u);
      EXPECT_EQ(sh[s].policy, ActivationPolicy::kRecompute);
      EXPECT_EQ(sh[s - 1].policy, ActivationPolicy::kRecompute) << "no graph holds its input";
      // The shard before the last runs its backward right after the last shard's task, at
      // whose start its input would come straight back: it keeps it.
      EXPECT_LT(s + 2, sh.size()) << "shard " << s << " of " << sh.size();
      inputs += 1;
    }
    EXPECT_GT(inputs, 0);
    EXPECT_GT(offloaded->offloaded_bytes, 0) << "host memory the admission counts";
    EXPECT_THAT(FormatPlan(t, *offloaded), HasSubstr("inputs offloaded to host memory"));
    // Not on a CPU (its memory is the host's), nor with the state on disk.
    PartitionOptions cpu = o;
    cpu.stash_on_device = false;
    PartitionOptions disk = o;
    disk.state_tier = StateTier::kDisk;
    for (const auto* other : {&cpu, &disk}) {
      auto plan = PlanShards(t, *other);
      if (!plan.ok()) continue;
      for (const auto& shard : plan->shards) EXPECT_FALSE(shard.input_offloaded);
    }
  }
  EXPECT_TRUE(found) << "no budget refused the kept inputs and held the offloaded ones";
}

TEST(PartitionerTest, WhereTheKeptInputsFitTheyStayOnTheDeviceUnlessOffloadingIsFaster) {
  // The same trial at a budget that holds it either way, behind a link too slow to carry the
  // inputs within the compute: offloading them would only add the link's time.
  Trial t = Gpt2(24, 128);
  t.model.context_length = 1024;
  t.model.vocab_size = 256;
  PartitionOptions o = OnAGpu(EstimateTrialFootprint(t).total_bytes() * 6 / 10);
  o.flops_per_second = 1e12;
  o.host_link_bytes_per_second = 1e6;
  o.resident_state = true;  // the link's time is weighed
  auto kept = PlanShards(t, o);
  o.checkpoint_offload = true;
  auto offloaded = PlanShards(t, o);
  ASSERT_TRUE(kept.ok() && offloaded.ok());
  for (const auto& sh : offloaded->shards) EXPECT_FALSE(sh.input_offloaded);
  EXPECT_EQ(FormatPlan(t, *offloaded), FormatPlan(t, *kept));
}

TEST(PartitionerTest, OnAGpuShardsOffloadGraphsTheLinkCanCarryInsteadOfRecomputingThem) {
  const Trial t = Gpt2(12, 256);
  const int64_t full = EstimateTrialFootprint(t).total_bytes();
  // A link as fast as the device computes, against none: the budget holds few graphs.
  PartitionOptions o = OnAGpu(full * 3 / 10);
  o.flops_per_second = 1e12;
  o.host_link_bytes_per_second = 1e11;
  auto without = PlanShards(t, o);
  o.activation_offload = true;
  auto with = PlanShards(t, o);
  ASSERT_TRUE(without.ok()) << without.status();
  ASSERT_TRUE(with.ok()) << with.status();
  EXPECT_EQ(ShardsThat(*without, ActivationPolicy::kOffload), 0u);
  EXPECT_GT(ShardsThat(*without, ActivationPolicy::kRecompute), 0u) << FormatPlan(t, *without);
  EXPECT_GT(ShardsThat(*with, ActivationPolicy::kOffload), 0u) << FormatPlan(t, *with);
  EXPECT_LT(ShardsThat(*with, ActivationPolicy::kRecompute),
            ShardsThat(*without, ActivationPolicy::kRecompute));
  EXPECT_LT(EstimatedStepSeconds(*with), EstimatedStepSeconds(*without));
  EXPECT_LE(with->peak_device_bytes, o.device_budget);
  int64_t offloaded = 0;
  for (const auto& sh : with->shards) {
    if (sh.policy == ActivationPolicy::kOffload) offloaded += sh.activation_bytes;
  }
  EXPECT_EQ(with->offloaded_bytes, offloaded);
  EXPECT_THAT(FormatPlan(t, *with), HasSubstr("offloaded to host memory"));
  EXPECT_THAT(FormatPlan(t, *with), HasSubstr("offload "));
  // A link that cannot copy a graph out before the backward begins offloads nothing.
  o.host_link_bytes_per_second = 1e6;
  auto slow = PlanShards(t, o);
  ASSERT_TRUE(slow.ok()) << slow.status();
  EXPECT_EQ(ShardsThat(*slow, ActivationPolicy::kOffload), 0u) << FormatPlan(t, *slow);
  EXPECT_EQ(slow->offloaded_bytes, 0);
  // Nor does a CPU device (no stash on the device) or the disk tier.
  PartitionOptions cpu;
  cpu.device_budget = o.device_budget;
  cpu.activation_offload = true;
  cpu.host_link_bytes_per_second = 1e11;
  EXPECT_EQ(ShardsThat(*PlanShards(t, cpu), ActivationPolicy::kOffload), 0u);
  PartitionOptions disk = o;
  disk.host_link_bytes_per_second = 1e11;
  disk.state_tier = StateTier::kDisk;
  EXPECT_EQ(ShardsThat(*PlanShards(t, disk), ActivationPolicy::kOffload), 0u);
}

TEST(PartitionerTest, AnOffloadedGraphCountsInThePeakBesideTheNextShardsBackward) {
  // Its copy in runs beside the backward of the shard after it, whose own state, gradients and
  // graph are on the device then.
  const Trial t = Gpt2(12, 256);
  PartitionOptions o = OnAGpu(EstimateTrialFootprint(t).total_bytes() * 3 / 10);
  o.flops_per_second = 1e12;
  o.host_link_bytes_per_second = 1e11;
  o.activation_offload = true;
  auto p = PlanShards(t, o);
  ASSERT_TRUE(p.ok()) << p.status();
  size_t checked = 0;
  for (size_t s = 0; s + 1 < p->shards.size(); ++s) {
    if (p->shards[s].policy != ActivationPolicy::kOffload) continue;
    const ShardPlan& next = p->shards[s + 1];
    EXPECT_GE(p->peak_device_bytes, next.state_bytes + next.gradient_bytes + next.workspace_bytes +
                                        p->shards[s].activation_bytes)
        << s << "\n"
        << FormatPlan(t, *p);
    ++checked;
  }
  EXPECT_GT(checked, 0u);
}

TEST(PartitionerTest, OnAGpuSelectiveRecomputeIsChosenWhereItShortensTheStep) {
  const Trial t = Gpt2(12, 256);
  const int64_t full = EstimateTrialFootprint(t, AttentionMemory::kFused).total_bytes();
  size_t chosen = 0;
  for (int percent = 90; percent >= 20; percent -= 5) {
    SCOPED_TRACE(std::to_string(percent) + "% of the footprint");
    PartitionOptions o = OnAGpu(full * percent / 100);
    o.fused_attention = true;
    o.flops_per_second = 1e12;
    auto without = PlanShards(t, o);
    o.selective_recompute = true;
    auto with = PlanShards(t, o);
    ASSERT_TRUE(with.ok()) << with.status();
    if (!without.ok()) {  // it may let a trial fit that would not otherwise
      EXPECT_TRUE(with->selective_recompute);
      continue;
    }
    EXPECT_LE(EstimatedStepSeconds(*with), EstimatedStepSeconds(*without));
    EXPECT_LE(with->peak_device_bytes, o.device_budget) << FormatPlan(t, *with);
    if (!with->selective_recompute) continue;
    ++chosen;
    EXPECT_LT(EstimatedStepSeconds(*with), EstimatedStepSeconds(*without));
    EXPECT_THAT(FormatPlan(t, *with), HasSubstr("LayerNorm and GELU outputs recomputed"));
    // A block keeps 10 values of its width a token instead of 16 (fp32, attention fused).
    const ShardPlan& first = with->shards.front();
    int64_t blocks = 0, tokens = t.training.batch_size * t.model.context_length;
    for (int i = first.first_layer; i <= first.last_layer; ++i) blocks += i > 0;
    EXPECT_LT(first.activation_bytes, tokens * 16 * 256 * 4 * std::max<int64_t>(blocks, 1));
    EXPECT_GT(first.recompute_flops, 0);
  }
  EXPECT_GT(chosen, 0u);
  // Unspilled it would only cost time; with explicit boundaries the plan keeps everything.
  PartitionOptions whole = OnAGpu(full);
  whole.fused_attention = true;
  whole.selective_recompute = true;
  EXPECT_FALSE(PlanShards(t, whole)->selective_recompute);
  PartitionOptions cut = whole;
  cut.explicit_boundaries = {4, 8};
  EXPECT_FALSE(PlanShards(t, cut)->selective_recompute);
}

TEST(PartitionerTest, OnAGpuShardsStashWhatTheBudgetHoldsAndRecomputeTheRest) {
  const Trial t = LongContext();
  const int64_t full = EstimateTrialFootprint(t).total_bytes();
  size_t plans_stashing = 0;
  for (int percent : {35, 30, 25}) {
    SCOPED_TRACE(std::to_string(percent) + "% of the footprint");
    PartitionOptions o = OnAGpu(full * percent / 100);
    PartitionOptions recompute = o;  // as GPUs planned before: every shard but the last
    recompute.stash_on_device = false;
    recompute.host_activation_budget = 0;
    auto p = PlanShards(t, o);
    auto r = PlanShards(t, recompute);
    ASSERT_TRUE(p.ok()) << p.status();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_LE(p->peak_device_bytes, o.device_budget) << FormatPlan(t, *p);
    EXPECT_LE(EstimatedStepSeconds(*p), EstimatedStepSeconds(*r))
        << FormatPlan(t, *p) << FormatPlan(t, *r);
    size_t stashing = 0;
    StashedActivations(*p, &stashing);
    EXPECT_GT(p->shards.size(), 1u);
    if (stashing > 0) ++plans_stashing;
  }
  EXPECT_GT(plans_stashing, 0u);
  // With the state on disk every shard but the last recomputes, as before.
  PartitionOptions disk = OnAGpu(full / 4);
  disk.state_tier = StateTier::kDisk;
  auto d = PlanShards(t, disk);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_FALSE(d->stash_on_device);
  for (size_t s = 0; s + 1 < d->shards.size(); ++s) {
    EXPECT_EQ(d->shards[s].policy, ActivationPolicy::kRecompute) << FormatPlan(t, *d);
  }
}

}  // namespace
}  // namespace hydra
