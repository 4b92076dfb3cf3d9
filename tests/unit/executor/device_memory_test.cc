// What training allocates, counted by LibTorch's CPU allocator, against what the cost model and
// the executor's ledger count: a GPT-2 block's forward and backward, and spilled plans' steps on
// the CPU as a discrete device (whose host tier is the slab pool's, outside that allocator).
// On a GPU the caching allocator's peak is checked the same way (cuda_executor_test); these
// run on every CPU.
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <gtest/gtest.h>
#include <torch/version.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "agent/executor/attention.h"
#include "agent/executor/gpt2.h"
#include "agent/executor/precision.h"
#include "agent/executor/spilling_executor.h"
#include "common/cost_model.h"
#include "common/partitioner.h"
#include "tests/unit/executor/executor_testing.h"

namespace hydra::executor {
namespace {

/// LibTorch's CPU allocator with the bytes it has handed out counted: now, and the most since
/// ResetPeak. Installed for the whole process on first use (tensors allocated before keep
/// their own deleter and are not counted).
class CountingCpuAllocator final : public at::Allocator {
 public:
  static CountingCpuAllocator& Installed() {
    static CountingCpuAllocator* a = [] {
      auto* made = new CountingCpuAllocator();
      c10::SetCPUAllocator(made, /*priority=*/100);
      return made;
    }();
    return *a;
  }

#if TORCH_VERSION_MAJOR >= 2
  at::DataPtr allocate(size_t n) override { return Make(n); }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
#else
  at::DataPtr allocate(size_t n) const override { return Make(n); }
#endif

  int64_t Current() const { return current_.load(); }
  int64_t Peak() const { return peak_.load(); }
  void ResetPeak() { peak_ = current_.load(); }

 private:
  struct Block {
    const CountingCpuAllocator* owner;
    void* data;
    int64_t bytes;
  };

  static void Release(void* ctx) {
    auto* b = static_cast<Block*>(ctx);
    b->owner->current_ -= b->bytes;
    c10::free_cpu(b->data);
    delete b;
  }

  // const: LibTorch 1.13's allocate() is.
  at::DataPtr Make(size_t n) const {
    void* data = c10::alloc_cpu(n);
    const int64_t now = current_ += static_cast<int64_t>(n);
    int64_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
    return {data, new Block{this, data, static_cast<int64_t>(n)}, &Release,
            at::Device(at::DeviceType::CPU)};
  }

  mutable std::atomic<int64_t> current_{0};
  mutable std::atomic<int64_t> peak_{0};
};

/// What one GPT-2 block's training allocates, measured on its second forward and backward (the
/// first made its parameters' gradients).
struct BlockBytes {
  int64_t saved = 0;      ///< alive after the forward, less its output
  int64_t transient = 0;  ///< the backward's peak above what was alive when it began
};

BlockBytes MeasureBlock(const Trial& t, AttentionMemory how, bool selective) {
  auto& counting = CountingCpuAllocator::Installed();
  torch::manual_seed(0);
  auto model = BuildGpt2(t.model, 1);
  model.SetAttention(how);
  model.SetSelectiveRecompute(selective);
  const auto& block = model.layers[1];
  const auto x0 = torch::randn({t.training.batch_size, t.model.context_length, t.model.n_embd});
  BlockBytes bytes;
  for (int pass = 0; pass < 2; ++pass) {
    auto x = x0.clone().requires_grad_(true);
    const int64_t before = counting.Current();
    torch::Tensor y;
    {
      PrecisionScope precision(t.training.precision);
      y = block->forward(x);
    }
    bytes.saved = counting.Current() - before - static_cast<int64_t>(y.nbytes());
    const auto g = torch::ones_like(y);
    counting.ResetPeak();
    const int64_t begun = counting.Current();
    y.backward(g);
    bytes.transient = counting.Peak() - begun;
  }
  return bytes;
}

TEST(DeviceMemoryTest, ABlocksTrainingAllocatesNoMoreThanTheCostModelCounts) {
  // What a block keeps for its backward and what its backward allocates while it runs (the
  // scores' gradients, the MLP's, the values selective recompute computes again) against
  // KeptActivationBytes + BackwardTransientBytes: attention-heavy (context 256 against width
  // 64), MLP-heavy (32 against 256) and between, fp32 and bf16, scores kept and recomputed (and
  // fused, where LibTorch has the kernel: the CUDA build's, here on the CPU), with and without
  // selective recompute. Before BackwardTransientBytes the fp32 blocks allocated up to 7 MB
  // (30%) more than counted.
  struct Shape {
    int64_t width, context;
  };
  for (const Shape shape : {Shape{128, 128}, Shape{64, 256}, Shape{256, 32}}) {
    for (const Precision precision : {Precision::kFp32, Precision::kBf16}) {
      std::vector<AttentionMemory> modes = {AttentionMemory::kKept, AttentionMemory::kRecomputed};
      if (FusedAttentionAvailable()) modes.push_back(AttentionMemory::kFused);  // LibTorch 2.1+
      for (const AttentionMemory how : modes) {
        for (const bool selective : {false, true}) {
          Trial t = testing::GptTrial("block", "adamw", 1, shape.width, 4, shape.context, 5, 3e-4);
          t.training.precision = precision;
          const LayerCost cost = ModelLayerCosts(t, t.training.batch_size)[1];
          const BlockBytes measured = MeasureBlock(t, how, selective);
          const int64_t counted = KeptActivationBytes(cost, how, selective) +
                                  BackwardTransientBytes(cost, how, selective);
          SCOPED_TRACE("width " + std::to_string(shape.width) + ", context " +
                       std::to_string(shape.context) + ", " + PrecisionName(precision) +
                       ", scores " + AttentionMemoryName(how) +
                       (selective ? ", selective recompute" : ""));
          EXPECT_LE(measured.saved + measured.transient, counted)
              << "kept " << measured.saved << " (counted "
              << KeptActivationBytes(cost, how, selective) << "), backward " << measured.transient
              << " (counted " << BackwardTransientBytes(cost, how, selective) << ")";
        }
      }
    }
  }
}

/// The CPU as a discrete device behind a 25 GB/s link, the optimizer on the device; attention
/// fused where LibTorch has the kernel and `fused`.
ExecutorOptions Discrete(bool fused) {
  ExecutorOptions o;
  o.fused_attention = fused;
  o.threads = 2;
  o.devices.simulate_discrete = true;
  o.host_link_bytes_per_second = 25e9;
  o.optimizer_placement = OptimizerPlacement::kDevice;
  return o;
}

/// For each of `precisions`: `base` at up to two budgets (from 95% of its footprint down, in 2%
/// steps) whose admission is `chosen`, trained for 4 steps (the lookahead's holds begin at the
/// third): the bytes the executor allocates from its build on stay within the budget.
void ExpectChosenPlansAllocateWithinTheirBudget(Trial base,
                                                const std::vector<Precision>& precisions,
                                                const std::function<bool(const Admission&)>& chosen,
                                                const char* what, bool fused = true) {
  auto& counting = CountingCpuAllocator::Installed();
  auto factory = MakeExecutorFactory(Discrete(fused));
  for (const Precision precision : precisions) {
    SCOPED_TRACE(PrecisionName(precision));
    base.training.precision = precision;
    auto data = TokenDataset::Open(base.dataset, base.model.context_length + 1);
    ASSERT_TRUE(data.ok());
    const int tried = testing::ForChosenBudgets(
        factory.get(), base, **data, chosen, 2,
        [&](const Trial& t, int percent, const Admission& admitted) {
          const int64_t budget = *t.resources.device_memory_budget;
          const int64_t before = counting.Current();
          counting.ResetPeak();
          auto exec = factory->Build(t, *data, admitted, 0);
          ASSERT_TRUE(exec.ok()) << exec.status();
          EXPECT_EQ(testing::StepLosses(exec->get(), 4).size(), 4u);
          const int64_t peak = counting.Peak() - before;
          std::printf("%s, %s, %d%%: budget %lld, allocated peak %lld, ledger peak %lld\n", what,
                      PrecisionName(precision), percent, static_cast<long long>(budget),
                      static_cast<long long>(peak),
                      static_cast<long long>((*exec)->stats().peak_device_bytes));
          EXPECT_LE(peak, budget) << "ledger peak " << (*exec)->stats().peak_device_bytes;
        });
    EXPECT_GT(tried, 0) << "no budget made a plan with " << what;
  }
}

TEST(DeviceMemoryTest, PlansWhoseRecomputingShardsOffloadTheirInputsAllocateWithinTheBudget) {
  // A deep, narrow trial whose plans recompute the scores, LayerNorms and GELUs and keep
  // recomputing shards' inputs in host memory. Before BackwardTransientBytes a 17% plan
  // allocated 3.5 MB over its 22 MB budget in fp32 (the recomputed scores' gradients); before
  // the shard before the last kept its input, a bf16 plan at 17% was refused at its first step
  // by the ledger (that input counted copying out and in at once).
  ExpectChosenPlansAllocateWithinTheirBudget(
      testing::GptTrial("inputs", "adamw", 8, 128, 4, 128, 5, 3e-4),
      {Precision::kFp32, Precision::kBf16},
      [](const Admission& a) {
        return std::any_of(a.plan.shards.begin(), a.plan.shards.end(),
                           [](const ShardPlan& s) { return s.input_offloaded; });
      },
      "inputs offloaded");
}

TEST(DeviceMemoryTest, PlansThatRecomputeLayerNormsAndGeluAllocateWithinTheBudget) {
  // fp32: in bf16 no budget of this trial's makes a spilled plan that chooses it.
  ExpectChosenPlansAllocateWithinTheirBudget(
      testing::GptTrial("selective", "adamw", 4, 256, 8, 128, 5, 3e-4), {Precision::kFp32},
      [](const Admission& a) { return a.plan.selective_recompute && a.plan.shards.size() > 1; },
      "LayerNorm and GELU recomputed");
}

TEST(DeviceMemoryTest, PlansThatKeepTheScoresAllocateWithinTheBudget) {
  // fp32: in bf16 the spilled plans of this trial's recompute the scores.
  ExpectChosenPlansAllocateWithinTheirBudget(
      testing::GptTrial("kept", "adamw", 6, 64, 4, 128, 5, 3e-4), {Precision::kFp32},
      [](const Admission& a) {
        return a.plan.attention == AttentionMemory::kKept && a.plan.shards.size() > 1;
      },
      "scores kept", /*fused=*/false);
}

}  // namespace
}  // namespace hydra::executor
