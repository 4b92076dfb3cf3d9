#include "agent/executor/spilling_executor.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <thread>

#include "agent/executor/inmemory_executor.h"
#include "common/cost_model.h"
#include "common/partitioner.h"
#include "common/process_memory.h"
#include "common/units.h"
#include "tests/unit/executor/cpu_allocator_testing.h"
#include "tests/unit/executor/executor_testing.h"

namespace hydra::executor {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

Trial Small(const std::string& optimizer) {
  return testing::GptTrial("spill", optimizer, 4, 64, 4, 32, 11, 2e-3);
}

/// Small("adamw") in another shape, batch 2: a model that weighs in resident memory.
Trial Shaped(int64_t layers, int64_t width, int64_t heads, int64_t context) {
  Trial t = Small("adamw");
  t.model.n_layer = layers;
  t.model.n_embd = width;
  t.model.n_head = heads;
  t.model.context_length = context;
  t.training.batch_size = 2;
  return t;
}

/// The largest budget (in 1% steps of the unsharded footprint) whose plan has >= `shards`;
/// `discrete`: planned as on a GPU, where stashed graphs stay in the device's memory and
/// blocks may recompute their LayerNorm and GELU outputs; `disk`:
/// with the state on disk. Attention is fused where the build has it, as the executors run it
/// by default.
int64_t BudgetFor(const Trial& t, size_t shards, bool discrete = false, bool disk = false) {
  const int64_t full = EstimateTrialFootprint(t).total_bytes();
  for (int pct = 100; pct > 1; --pct) {
    PartitionOptions o;
    o.fused_attention = FusedAttentionAvailable();
    o.device_budget = full * pct / 100;
    o.micro_batches = t.training.gradient_accumulation_steps;
    o.stash_on_device = discrete;
    o.selective_recompute = discrete;  // as the factory plans for discrete devices
    if (disk) o.state_tier = StateTier::kDisk;
    auto p = PlanShards(t, o);
    if (p.ok() && p->shards.size() >= shards) return o.device_budget;
  }
  ADD_FAILURE() << "no budget gives " << shards << " shards";
  return 0;
}

struct Variant {
  std::string name;
  size_t min_shards;  // 0: explicit boundaries below
  bool per_layer;     // one layer per shard
  bool disk;
  double link;                  // host link bandwidth; tiny forces recompute
  bool host_optimizer = false;  // the optimizer steps on the host (state never on the device)
  /// The CPU as a discrete device (ExecutorDevices::simulate_discrete): shards are copied to
  /// separate device tensors and back through DeviceStreams, as on a GPU.
  bool discrete = false;
};

/// How close a spilled run must stay to the unsharded one.
struct Tolerance {
  double step;        // relative, per step loss
  double validation;  // relative, final validation loss
  /// Steps from this one on may part by `parted` (bf16's chaotic trajectories); -1: none.
  int parting_step = -1;
  double parted = 0;
};

class SpillingExecutorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    spill_ = fs::temp_directory_path() /
             ("hydra_spill_test_" + std::to_string(::getpid()) + "_" +
              ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(spill_);
  }
  void TearDown() override { fs::remove_all(spill_); }

  std::unique_ptr<ExecutorFactoryInterface> Factory(double link = 0, bool host_optimizer = false,
                                                    bool discrete = false) {
    ExecutorOptions o;
    o.threads = 2;
    o.fused_attention = fused_attention_;
    o.spill_dir = spill_.string();
    o.host_link_bytes_per_second = link;
    if (host_optimizer) o.optimizer_placement = OptimizerPlacement::kHost;
    o.devices.simulate_discrete = discrete;
    return MakeExecutorFactory(o);
  }

  /// The CPU as a discrete device (2 threads) with a host link of `link` bytes/s and compute
  /// at `flops` FLOP/s.
  ExecutorOptions Discrete(double link, double flops) const {
    ExecutorOptions o;
    o.threads = 2;
    o.fused_attention = fused_attention_;
    o.host_link_bytes_per_second = link;
    o.flops_per_second = flops;
    o.devices.simulate_discrete = true;
    return o;
  }

  /// Two CPU devices treated as discrete ones (as two GPUs), 2 threads, spilling to spill_.
  ExecutorOptions TwoDiscreteDevices() const {
    ExecutorOptions o;
    o.threads = 2;
    o.spill_dir = spill_.string();
    o.devices.devices = {CpuDevice(0, 0), CpuDevice(1, 0)};
    o.devices.simulate_discrete = true;
    return o;
  }

  StatusOr<std::unique_ptr<TrialExecutorInterface>> Make(ExecutorFactoryInterface* f,
                                                         const Trial& t) {
    auto data = TokenDataset::Open(t.dataset, t.model.context_length + 1);
    if (!data.ok()) return data.status();
    return f->Create(t, *data);
  }

  std::vector<double> Losses(TrialExecutorInterface* e, int steps) {
    return testing::StepLosses(e, steps);
  }

  /// Trains a small trial for 2 steps and drops it, so that LibTorch's allocator and kernels
  /// are warm and a resident-memory baseline taken next is steady.
  void WarmUp(std::shared_ptr<const TokenDataset> data) {
    auto w = MakeInMemoryExecutorFactory({2})->Create(Small("adamw"), std::move(data));
    ASSERT_TRUE(w.ok()) << w.status();
    Losses(w->get(), 2);
  }

  /// `t`'s step losses over 30 steps, trained unsharded on the CPU (2 threads).
  std::vector<double> UnshardedLosses(const Trial& t) {
    auto data = TokenDataset::Open(t.dataset, t.model.context_length + 1);
    EXPECT_TRUE(data.ok()) << data.status();
    if (!data.ok()) return {};
    InMemoryExecutorOptions io;
    io.threads = 2;
    io.fused_attention = fused_attention_;
    auto plain = MakeInMemoryExecutorFactory(io)->Create(t, *data);
    EXPECT_TRUE(plain.ok()) << plain.status();
    return plain.ok() ? Losses(plain->get(), 30) : std::vector<double>{};
  }

  void ExpectVariantsTrackUnsharded(const Trial& base, const std::vector<Variant>& variants,
                                    Tolerance tol);

  /// `base` at up to two budgets (from 95% of its footprint down, in `step`% steps) whose
  /// admission by `factory` is `chosen`, trained for 30 steps: its losses track `expected`
  /// within 1e-5 and the ledger's peak stays within the budget; `also` checks more of each
  /// run. Returns how many budgets ran.
  using RunCheck = std::function<void(const Trial&, const Admission&, TrialExecutorInterface*,
                                      const std::vector<double>& losses)>;
  /// OnADiscreteDeviceResidentShardsStayThereAndTrainAsUnsharded for one trial.
  void TrainResidentPlans(const Trial& base);

  size_t TrainChosenPlans(ExecutorFactoryInterface* factory, const Trial& base, int step,
                          const std::vector<double>& expected,
                          const std::function<bool(const Admission&)>& chosen,
                          const RunCheck& also) {
    auto data = TokenDataset::Open(base.dataset, base.model.context_length + 1);
    EXPECT_TRUE(data.ok()) << data.status();
    if (!data.ok()) return 0;
    const int64_t full = EstimateTrialFootprint(base).total_bytes();
    size_t tried = 0;
    for (int percent = 95; percent > 5 && tried < 2; percent -= step) {
      Trial t = base;
      t.resources.device_memory_budget = full * percent / 100;
      auto admitted = factory->Admit(t, **data);
      if (!admitted.ok() || !chosen(*admitted)) continue;
      ++tried;
      SCOPED_TRACE(std::to_string(percent) + "% of the footprint:\n" +
                   FormatPlan(t, admitted->plan));
      auto exec = factory->Build(t, *data, *admitted, 0);
      EXPECT_TRUE(exec.ok()) << exec.status();
      if (!exec.ok()) continue;
      const auto losses = Losses(exec->get(), 30);
      testing::ExpectStepLossesNear(losses, expected, 1e-5);
      EXPECT_LE((*exec)->stats().peak_device_bytes, *t.resources.device_memory_budget);
      also(t, *admitted, exec->get(), losses);
    }
    return tried;
  }

  fs::path spill_;
  /// Factory's and UnshardedLosses' ExecutorOptions::fused_attention (which matters only
  /// where LibTorch has the fused kernel: the CUDA build).
  bool fused_attention_ = true;
};

/// Trains `base` unsharded, then as each variant, for 30 steps; every step loss and the final
/// validation loss must agree within `tol`; spill files must not outlive the trial.
void SpillingExecutorTest::ExpectVariantsTrackUnsharded(const Trial& base,
                                                        const std::vector<Variant>& variants,
                                                        Tolerance tol) {
  auto plain_factory = MakeInMemoryExecutorFactory({2});
  auto data = TokenDataset::Open(base.dataset, base.model.context_length + 1);
  ASSERT_TRUE(data.ok());
  auto plain = plain_factory->Create(base, *data);
  ASSERT_TRUE(plain.ok());
  const auto expected = Losses(plain->get(), 30);
  const double expected_val = *(*plain)->Evaluate();
  for (const auto& v : variants) {
    SCOPED_TRACE(v.name);
    Trial t = base;
    if (v.per_layer) {
      t.resources.shard_boundaries = {1, 2, 3, 4, 5};
    } else if (v.min_shards == 1) {
      t.resources.device_memory_budget = BudgetFor(t, 2);
    } else {
      t.resources.device_memory_budget = BudgetFor(t, v.min_shards, v.discrete, v.disk);
    }
    if (v.disk) t.resources.offload = OffloadTier::kDisk;
    auto factory = Factory(v.link, v.host_optimizer, v.discrete);
    auto exec = Make(factory.get(), t);
    ASSERT_TRUE(exec.ok()) << exec.status();
    EXPECT_EQ((*exec)->BoundDevice(), v.discrete ? 0 : -1);
    EXPECT_GE(static_cast<size_t>((*exec)->stats().shards), v.per_layer ? 6u : v.min_shards);
    const auto losses = Losses(exec->get(), 30);
    if (tol.parting_step < 0) {
      testing::ExpectStepLossesNear(losses, expected, tol.step);
    } else {
      const auto at = [](const std::vector<double>& v, size_t from, size_t to) {
        return std::vector<double>(v.begin() + std::min(from, v.size()),
                                   v.begin() + std::min(to, v.size()));
      };
      const size_t parting = static_cast<size_t>(tol.parting_step);
      testing::ExpectStepLossesNear(at(losses, 0, parting), at(expected, 0, parting), tol.step);
      testing::ExpectStepLossesNear(at(losses, parting, 30), at(expected, parting, 30), tol.parted);
    }
    // Stepped on a discrete device's host, every shard but the first steps during the next
    // shard's backward (after it is queued); clipping waits for every norm instead.
    const bool deferred = v.discrete && v.host_optimizer && base.training.grad_clip_norm == 0;
    EXPECT_EQ((*exec)->stats().host_steps_deferred,
              deferred ? ((*exec)->stats().shards - 1) * 30 : 0);
    auto val = (*exec)->Evaluate();
    ASSERT_TRUE(val.ok());
    EXPECT_NEAR(*val, expected_val, tol.validation * expected_val);
    auto state = (*exec)->ExportState();
    ASSERT_TRUE(state.ok());
    for (const auto& b : *state) EXPECT_EQ(b.dtype, "float32") << b.name;
    if (t.resources.device_memory_budget) {
      EXPECT_LE((*exec)->stats().peak_device_bytes, *t.resources.device_memory_budget);
    }
    // The executor's own spill folder (spill.XXXXXX), removed with it.
    auto folders = [&] {
      std::error_code ec;
      return fs::exists(spill_) ? std::distance(fs::directory_iterator(spill_, ec), {}) : 0;
    };
    EXPECT_EQ(folders(), v.disk ? 1 : 0);
    exec->reset();
    EXPECT_EQ(folders(), 0) << "spill files outlive the trial";
  }
}

TEST_F(SpillingExecutorTest, SpilledLossesEqualUnshardedTraining) {
  const std::vector<Variant> variants = {
      {"2 shards", 2, false, false, 0},
      {"4 shards", 4, false, false, 0},
      {"one layer per shard", 0, true, false, 0},
      {"one layer per shard, recompute", 0, true, false, 1.0},
      {"2 shards on disk", 2, false, true, 0},
      {"one layer per shard on disk, recompute", 0, true, true, 1.0},
      {"one layer per shard, optimizer on the host", 0, true, false, 0, true},
      // The GPU's code paths (separate device copies, copies in and out, gradients down and
      // weights up for the host optimizer) on the CPU.
      {"discrete: 2 shards", 2, false, false, 0, false, true},
      {"discrete: one layer per shard", 0, true, false, 0, false, true},
      {"discrete: 2 shards on disk", 2, false, true, 0, false, true},
      {"discrete: one layer per shard on disk", 0, true, true, 0, false, true},
      {"discrete: one layer per shard, optimizer on the host", 0, true, false, 0, true, true},
      // The 2-shard budget holds the whole model once its optimizer state stays on the host:
      // one spilled shard (the last shard's path only).
      {"discrete: one shard, optimizer on the host", 1, false, false, 0, true, true},
  };
  for (const char* opt : {"adamw", "sgd"}) {
    for (int mode = 0; mode < 2; ++mode) {
      SCOPED_TRACE(std::string(opt) + (mode ? " accumulation+clipping" : ""));
      Trial base = Small(opt);
      if (mode == 1) {
        base.training.gradient_accumulation_steps = 2;
        base.training.grad_clip_norm = 0.5;
      }
      // The validation loss sees one more update than the step losses, and SGD amplifies
      // rounding: 1e-4 there.
      ExpectVariantsTrackUnsharded(base, variants, {1e-5, 1e-4});
    }
  }
}

TEST_F(SpillingExecutorTest, Bf16SpilledTracksBf16Unsharded) {
  // bf16 rounding amplifies the last-bit differences of a different summation order (the tied
  // embedding's two gradients, per-shard clipping norms): the runs agree to 1e-5 for the first
  // steps and part slowly after; within 1% per step over 30 steps (0.45% measured at step 28 on
  // CPUs without AVX-512), against 1e-5 in fp32. How fast they part depends on the CPU's bf16
  // kernels: with LibTorch 2.11 (the CUDA build) on an AMD EPYC with AVX-512 BF16 every variant
  // below stayed within 1% through step 28 and gave 3.796 at step 29 against unsharded's 3.636
  // (4.4%; validation 3.769 against 3.662), all six variants the same to the last bit. Steps
  // 25-29 are held to 10% and the validation loss to 5%. At learning rate 2e-3 this model's
  // loss spikes (step 16), and after a spike bf16 trajectories part by up to 11% on single steps.
  Trial base = Small("adamw");
  base.training.precision = Precision::kBf16;
  base.training.learning_rate = 1e-3;
  base.training.gradient_accumulation_steps = 2;
  base.training.grad_clip_norm = 0.5;
  ExpectVariantsTrackUnsharded(
      base,
      {{"2 shards", 2, false, false, 0},
       {"one layer per shard, recompute", 0, true, false, 1.0},
       {"2 shards on disk", 2, false, true, 0},
       // The GPU's code paths in bf16, on the CPU (graphs stashed in device memory too).
       {"discrete: 2 shards", 2, false, false, 0, false, true},
       {"discrete: 2 shards on disk", 2, false, true, 0, false, true},
       {"discrete: one layer per shard, optimizer on the host", 0, true, false, 0, true, true}},
      {1e-2, 5e-2, 25, 1e-1});
}

TEST_F(SpillingExecutorTest, OneShardPlanIsPlainTraining) {
  Trial t = Small("adamw");
  t.resources.device_memory_budget = EstimateTrialFootprint(t).total_bytes();
  auto factory = Factory();
  auto exec = Make(factory.get(), t);
  ASSERT_TRUE(exec.ok());
  EXPECT_EQ((*exec)->stats().shards, 1);
  auto plain = MakeInMemoryExecutorFactory({2});
  auto data = TokenDataset::Open(t.dataset, t.model.context_length + 1);
  auto p = plain->Create(Small("adamw"), *data);
  EXPECT_EQ(Losses(exec->get(), 5), Losses(p->get(), 5));  // exactly
}

TEST_F(SpillingExecutorTest, CheckpointsMoveBetweenPlans) {
  // A checkpoint written by a 4-shard disk plan resumes on the plain executor and vice versa,
  // continuing with exactly the losses of an uninterrupted run.
  Trial t = Small("adamw");
  auto plain = MakeInMemoryExecutorFactory({2});
  auto data = TokenDataset::Open(t.dataset, t.model.context_length + 1);
  auto straight = plain->Create(t, *data);
  const auto expected = Losses(straight->get(), 10);

  Trial spilled = t;
  spilled.resources.device_memory_budget = BudgetFor(t, 4);
  spilled.resources.offload = OffloadTier::kDisk;
  auto factory = Factory();
  auto a = Make(factory.get(), spilled);
  ASSERT_TRUE(a.ok());
  auto first = Losses(a->get(), 5);
  auto state = (*a)->ExportState();
  ASSERT_TRUE(state.ok());
  auto b = plain->Create(t, *data);
  ASSERT_TRUE((*b)->ImportState(5, *state).ok());
  auto rest = Losses(b->get(), 5);
  first.insert(first.end(), rest.begin(), rest.end());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_NEAR(first[i], expected[i], 1e-5 * expected[i]) << i;
  }
  // And back into a spilled executor.
  auto back = (*b)->ExportState();
  auto c = Make(factory.get(), spilled);
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE((*c)->ImportState(10, *back).ok());
  EXPECT_EQ((*c)->step(), 10);
  auto missing = *back;
  missing.pop_back();
  EXPECT_EQ((*c)->ImportState(10, missing).code(), StatusCode::kInvalidArgument);
}

TEST_F(SpillingExecutorTest, TheExecutorRunsThePlanItsAdmissionCarries) {
  Trial t = Small("adamw");
  t.resources.device_memory_budget = BudgetFor(t, 3);
  auto factory = Factory();
  auto data = TokenDataset::Open(t.dataset, t.model.context_length + 1);
  ASSERT_TRUE(data.ok());
  auto admitted = factory->Admit(t, **data);
  ASSERT_TRUE(admitted.ok()) << admitted.status();
  EXPECT_GE(admitted->plan.shards.size(), 3u);
  EXPECT_EQ(admitted->host_bytes,
            admitted->plan.total_state_bytes + admitted->plan.peak_device_bytes);
  EXPECT_EQ(admitted->disk_bytes, 0);
  EXPECT_GT(admitted->est_step_seconds, 0);
  auto exec = factory->Build(t, *data, *admitted, 0);
  ASSERT_TRUE(exec.ok()) << exec.status();
  EXPECT_EQ(static_cast<size_t>((*exec)->stats().shards), admitted->plan.shards.size());
  // Build plans nothing itself: handed a plan cut per layer, it runs that one.
  PartitionOptions per_layer = PartitionOptionsFor(t);
  per_layer.explicit_boundaries = {1, 2, 3, 4, 5};
  Admission other = *admitted;
  auto cut = PlanShards(t, per_layer);
  ASSERT_TRUE(cut.ok()) << cut.status();
  other.plan = *cut;
  auto six = factory->Build(t, *data, other, 0);
  ASSERT_TRUE(six.ok()) << six.status();
  EXPECT_EQ((*six)->stats().shards, 6);
}

TEST_F(SpillingExecutorTest, AnOptimizerOnTheHostKeepsItsStateOffTheDevice) {
  // AdamW's state is twice the weights: stepped on the host, it never takes device memory, so
  // the same budget holds larger shards and the device peak drops.
  Trial t = Small("adamw");
  t.resources.device_memory_budget = BudgetFor(t, 4);
  auto on_device = Make(Factory().get(), t);
  ASSERT_TRUE(on_device.ok()) << on_device.status();
  auto host_factory = Factory(0, /*host_optimizer=*/true);
  auto data = TokenDataset::Open(t.dataset, t.model.context_length + 1);
  ASSERT_TRUE(data.ok());
  auto admitted = host_factory->Admit(t, **data);
  ASSERT_TRUE(admitted.ok()) << admitted.status();
  for (const auto& s : admitted->plan.shards) {
    EXPECT_EQ(s.optimizer, OptimizerPlacement::kHost);
  }
  auto on_host = host_factory->Build(t, *data, *admitted, 0);
  ASSERT_TRUE(on_host.ok()) << on_host.status();
  EXPECT_LT((*on_host)->stats().shards, (*on_device)->stats().shards);
  const auto device_losses = Losses(on_device->get(), 10);
  const auto host_losses = Losses(on_host->get(), 10);
  ASSERT_EQ(host_losses.size(), device_losses.size());
  for (size_t i = 0; i < host_losses.size(); ++i) {
    EXPECT_NEAR(host_losses[i], device_losses[i], 1e-5 * std::fabs(device_losses[i])) << i;
  }
  ASSERT_TRUE((*on_host)->ExportState().ok());
  EXPECT_LE((*on_host)->stats().peak_device_bytes, *t.resources.device_memory_budget);
  EXPECT_LE((*on_host)->stats().peak_device_bytes, admitted->plan.peak_device_bytes);
}

TEST_F(SpillingExecutorTest, ATrialMovesToAnotherDeviceBetweenSteps) {
  // Two CPU devices treated as discrete ones (as two GPUs): a trial bound to device 0 moves to
  // device 1 after 5 steps and trains on with exactly the losses of a trial that stayed.
  for (bool spilled : {true, false}) {
    SCOPED_TRACE(spilled ? "spilled (4 shards)" : "unsharded");
    Trial t = Small("adamw");
    if (spilled) t.resources.device_memory_budget = BudgetFor(t, 4);
    auto factory = MakeExecutorFactory(TwoDiscreteDevices());
    auto stays = Make(factory.get(), t);
    auto moves = Make(factory.get(), t);
    ASSERT_TRUE(stays.ok() && moves.ok());
    const auto expected = Losses(stays->get(), 10);
    auto first = Losses(moves->get(), 5);
    EXPECT_EQ((*moves)->BoundDevice(), 0);
    ASSERT_TRUE((*moves)->MoveTo(1).ok());
    EXPECT_EQ((*moves)->BoundDevice(), 1);
    EXPECT_EQ((*moves)->MoveTo(2).code(), StatusCode::kInvalidArgument) << "no such device";
    const auto rest = Losses(moves->get(), 5);
    first.insert(first.end(), rest.begin(), rest.end());
    EXPECT_EQ(first, expected);
  }
}

TEST_F(SpillingExecutorTest, ATrialMovesToAnotherDeviceWithinAStep) {
  // A spilled trial's next shard may run on any free GPU: its shards come from host memory
  // anyway. Two CPU devices treated as discrete ones (as two GPUs); shards that recompute
  // (nothing of autograd's on the device between tasks) and two micro-batches. The trial moves
  // after every task of three steps, back and forth, with its boundary activations, the
  // gradient flowing back and the tied weights' gradients, and trains with exactly the losses
  // of one that stayed: with its optimizer on the device and on the host, with clipping (its
  // apply tasks and gradient norms).
  struct Case {
    const char* name;
    OptimizerPlacement optimizer;
    double clip;
  };
  for (const Case c : {Case{"optimizer on the device", OptimizerPlacement::kDevice, 0},
                       Case{"optimizer on the host", OptimizerPlacement::kHost, 0},
                       Case{"clipping", OptimizerPlacement::kDevice, 0.5}}) {
    SCOPED_TRACE(c.name);
    Trial t = Small("adamw");
    t.training.gradient_accumulation_steps = 2;
    t.training.grad_clip_norm = c.clip;
    t.resources.shard_boundaries = {1, 2, 3, 4, 5};  // 6 shards: 11 tasks a step
    ExecutorOptions o = TwoDiscreteDevices();
    o.device_stash = false;  // no graph stays on the device
    o.optimizer_placement = c.optimizer;
    auto factory = MakeExecutorFactory(o);
    auto stays = Make(factory.get(), t);
    auto moves = Make(factory.get(), t);
    ASSERT_TRUE(stays.ok() && moves.ok()) << stays.status() << moves.status();
    ASSERT_EQ((*moves)->stats().shards, 6);
    const auto expected = Losses(stays->get(), 6);
    auto losses = Losses(moves->get(), 2);
    int moved = 0;
    for (int step = 0; step < 3; ++step) {
      losses.push_back(testing::StepByTasks(moves->get(), [&] {
        ASSERT_TRUE((*moves)->InStep());
        ASSERT_TRUE((*moves)->MayMoveNow());
        const int to = 1 - (*moves)->BoundDevice();
        const Status s = (*moves)->MoveTo(to);
        ASSERT_TRUE(s.ok()) << s;
        EXPECT_EQ((*moves)->BoundDevice(), to);
        ++moved;
      }));
    }
    const auto rest = Losses(moves->get(), 1);
    losses.insert(losses.end(), rest.begin(), rest.end());
    EXPECT_EQ(losses, expected);
    EXPECT_EQ(moved, 3 * (c.clip > 0 ? 16 : 10));  // after every task but a step's last
  }
}

TEST_F(SpillingExecutorTest, AMoveThatRunsOutOfMemoryOnTheNewDeviceIsUndone) {
  // Memory that no plan counted (another process on the GPU) fills the new device while a
  // trial moves there within a step (LibTorch's CPU allocator made to fail as a full GPU's
  // does). The move is undone: UNAVAILABLE, the trial on its own device with its step, which
  // goes on with exactly the losses of a trial that never moved; a later move succeeds. Where
  // moving back fails too, the trial has failed: its executor refuses to go on.
  auto& allocator = testing::CountingCpuAllocator::Installed();
  Trial t = Small("adamw");
  t.training.gradient_accumulation_steps = 2;
  t.resources.shard_boundaries = {1, 2, 3, 4, 5};
  ExecutorOptions o = TwoDiscreteDevices();
  o.device_stash = false;
  auto factory = MakeExecutorFactory(o);
  auto stays = Make(factory.get(), t);
  auto moves = Make(factory.get(), t);
  ASSERT_TRUE(stays.ok() && moves.ok()) << stays.status() << moves.status();
  const auto expected = Losses(stays->get(), 4);
  auto losses = Losses(moves->get(), 1);
  int task = 0;
  losses.push_back(testing::StepByTasks(moves->get(), [&] {
    if (++task == 3) {  // a forward's midst
      allocator.FailNext(1);
      const Status s = (*moves)->MoveTo(1);
      allocator.FailNext(0);
      EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s;
      EXPECT_THAT(s.message(), HasSubstr("ran out of"));
      EXPECT_THAT(s.message(), HasSubstr("moved back"));
      EXPECT_EQ((*moves)->BoundDevice(), 0);
      EXPECT_TRUE((*moves)->InStep());
    } else if (task == 8) {  // a backward's midst: room again
      const Status s = (*moves)->MoveTo(1);
      EXPECT_TRUE(s.ok()) << s;
      EXPECT_EQ((*moves)->BoundDevice(), 1);
    }
  }));
  const auto rest = Losses(moves->get(), 2);
  losses.insert(losses.end(), rest.begin(), rest.end());
  EXPECT_EQ(losses, expected);

  ASSERT_TRUE((*moves)->RunTask().ok());
  allocator.FailNext(1 << 20);  // no room on either device
  const Status failed = (*moves)->MoveTo(0);
  allocator.FailNext(0);
  EXPECT_EQ(failed.code(), StatusCode::kInternal) << failed;
  EXPECT_THAT(failed.message(), HasSubstr("moving back failed too"));
  const auto refused = (*moves)->RunTask();
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition) << refused.status();
}

TEST_F(SpillingExecutorTest, AStepThatKeepsAGraphOnItsDeviceMovesOnlyBetweenSteps) {
  // A shard whose forward graph stays on the device (stashed, for its backward) holds that
  // device's memory: its step goes on there, and the trial moves once the step is over. (A
  // short context, as in the stash test above: plans stash where the budget holds the graphs.)
  Trial t = testing::GptTrial("stash", "adamw", 4, 128, 4, 8, 11, 1e-3);
  ExecutorOptions o = TwoDiscreteDevices();
  o.host_link_bytes_per_second = 25e9;
  o.resident_state = false;
  auto factory = MakeExecutorFactory(o);
  auto data = TokenDataset::Open(t.dataset, t.model.context_length + 1);
  ASSERT_TRUE(data.ok());
  const auto first_stashes = [](const Admission& a) {
    return a.plan.shards.size() >= 2 && a.plan.shards[0].policy == ActivationPolicy::kStash;
  };
  const int tried = testing::ForChosenBudgets(
      factory.get(), t, **data, first_stashes, 1,
      [&](const Trial& budgeted, int, const Admission&) {
        auto exec = Make(factory.get(), budgeted);
        ASSERT_TRUE(exec.ok()) << exec.status();
        ASSERT_TRUE((*exec)->RunTask().ok());  // shard 0's forward: its graph stays
        EXPECT_TRUE((*exec)->InStep());
        EXPECT_FALSE((*exec)->MayMoveNow());
        const Status refused = (*exec)->MoveTo(1);
        EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition) << refused;
        EXPECT_THAT(refused.message(), HasSubstr("autograd graphs"));
        EXPECT_EQ((*exec)->BoundDevice(), 0);
        testing::StepByTasks(exec->get(), [] {});
        EXPECT_TRUE((*exec)->MayMoveNow());
        EXPECT_TRUE((*exec)->MoveTo(1).ok());
        EXPECT_EQ(Losses(exec->get(), 1).size(), 1u);
      });
  EXPECT_EQ(tried, 1) << "no budget stashes shard 0";
}

TEST_F(SpillingExecutorTest, OnADiscreteDeviceTheFirstShardStaysThereForTheNextStep) {
  // The step ends with shard 0's backward and the next begins with its forward: on a discrete
  // device it stays on the device in between (host tier: its stepped state copied out, not
  // dropped; disk tier: the forward reads it while its write goes on), so every step after the
  // first moves its weights once less (uploaded, or read from disk); an evaluation, which drops
  // it after use, and a move to another device leave the host copies or files it goes on from.
  for (bool disk : {false, true}) {
    SCOPED_TRACE(disk ? "disk tier" : "host tier");
    Trial t = Small("adamw");
    t.resources.shard_boundaries = {1, 2, 3, 4, 5};
    if (disk) t.resources.offload = OffloadTier::kDisk;
    auto reference = Make(Factory().get(), t);  // the same shards on a CPU: no device copies
    ASSERT_TRUE(reference.ok()) << reference.status();
    ExecutorOptions o = TwoDiscreteDevices();
    o.spill_dir = (spill_ / "discrete").string();
    o.optimizer_placement = OptimizerPlacement::kDevice;
    o.lookahead = false;  // its holds would move other shards less too: its own test
    auto exec = Make(MakeExecutorFactory(o).get(), t);
    ASSERT_TRUE(exec.ok()) << exec.status();
    auto moved = [&] {
      const auto st = (*exec)->stats();
      return disk ? st.disk_bytes_read : st.bytes_uploaded;
    };
    std::vector<double> losses, expected;
    std::vector<int64_t> bytes = {moved()};
    auto step = [&] {
      const auto l = Losses(exec->get(), 1);
      losses.insert(losses.end(), l.begin(), l.end());
      const auto r = Losses(reference->get(), 1);
      expected.insert(expected.end(), r.begin(), r.end());
      bytes.push_back(moved());
    };
    auto per_step = [&](size_t i) { return bytes[i] - bytes[i - 1]; };
    step();
    step();
    step();
    EXPECT_LT(per_step(2), per_step(1)) << "shard 0 was moved again for the second step";
    EXPECT_EQ(per_step(3), per_step(2));
    const int64_t first_shard = per_step(1) - per_step(2);
    ASSERT_TRUE((*exec)->Evaluate().ok());
    ASSERT_TRUE((*reference)->Evaluate().ok());
    bytes.back() = moved();
    step();  // after the evaluation dropped it, shard 0 comes back from its host copy or file
    EXPECT_EQ(per_step(4), per_step(2) + first_shard);
    step();
    ASSERT_TRUE((*exec)->MoveTo(1).ok());
    step();
    step();
    testing::ExpectStepLossesNear(losses, expected, 1e-6);
    // A checkpoint taken, and one restored, while shard 0 is kept on the device.
    const int64_t at = (*exec)->step();
    auto state = (*exec)->ExportState();
    ASSERT_TRUE(state.ok()) << state.status();
    const auto ahead = Losses(exec->get(), 2);
    ASSERT_TRUE((*exec)->ImportState(at, *state).ok());
    EXPECT_EQ(Losses(exec->get(), 2), ahead);
  }
}

TEST_F(SpillingExecutorTest, ShardsWhoseOptimizersStepInDifferentPlacesTrainAsUnsharded) {
  // The measured rates of a GPU-like link (the trial-wide choice: the host) with compute that
  // hides the blocks' state copies: the blocks and the head step on the device, the embedding
  // on the host, in one trial, on a CPU standing in for a discrete device.
  Trial t = Small("adamw");
  t.training.grad_clip_norm = 0.5;
  t.resources.shard_boundaries = {1, 2, 3, 4, 5};
  ExecutorOptions o;
  o.threads = 2;
  o.spill_dir = spill_.string();
  o.devices.simulate_discrete = true;
  o.host_link_bytes_per_second = 25e9;
  o.host_optimizer_bytes_per_second = 100e9;
  o.flops_per_second = 1e11;
  auto factory = MakeExecutorFactory(o);
  auto data = TokenDataset::Open(t.dataset, t.model.context_length + 1);
  ASSERT_TRUE(data.ok());
  auto admission = factory->Admit(t, **data);
  ASSERT_TRUE(admission.ok()) << admission.status();
  std::string placements;
  for (const auto& s : admission->plan.shards) {
    placements += s.optimizer == OptimizerPlacement::kHost ? 'h' : 'd';
  }
  EXPECT_EQ(placements, "hddddd");
  auto exec = Make(factory.get(), t);
  ASSERT_TRUE(exec.ok()) << exec.status();
  const auto losses = Losses(exec->get(), 10);
  Trial unsharded = t;
  unsharded.resources.shard_boundaries.clear();
  auto plain = Make(MakeInMemoryExecutorFactory({2}).get(), unsharded);
  ASSERT_TRUE(plain.ok());
  const auto expected = Losses(plain->get(), 10);
  testing::ExpectStepLossesNear(losses, expected, 1e-5);
}

TEST_F(SpillingExecutorTest, Bf16WeightTransitChangesNoNumber) {
  // Issue 18 item 2 on a simulated discrete device: a bf16 trial whose optimizer steps on the
  // host, its matrix weights sent to the device as bf16 (cast on the host) and their gradients
  // summed in fp32, trains to exactly the losses of the same trial sending fp32 weights for
  // autocast to cast; with micro-batches and clipping too.
  for (int mode = 0; mode < 2; ++mode) {
    SCOPED_TRACE(mode ? "accumulation and clipping" : "one micro-batch");
    Trial t = Small("adamw");
    t.training.precision = Precision::kBf16;
    t.resources.shard_boundaries = {1, 2, 3, 4, 5};
    if (mode == 1) {
      t.training.gradient_accumulation_steps = 2;
      t.training.grad_clip_norm = 0.5;
    }
    std::vector<std::vector<double>> runs;
    std::vector<int64_t> uploaded, casts;
    for (bool transit : {false, true}) {
      ExecutorOptions o;
      o.threads = 2;
      o.spill_dir = spill_.string();
      o.optimizer_placement = OptimizerPlacement::kHost;
      o.devices.simulate_discrete = true;
      o.bf16_weight_transit = transit;
      auto exec = Make(MakeExecutorFactory(o).get(), t);
      ASSERT_TRUE(exec.ok()) << exec.status();
      runs.push_back(Losses(exec->get(), 10));
      uploaded.push_back((*exec)->stats().bytes_uploaded);
      casts.push_back((*exec)->stats().weight_casts);
      auto state = (*exec)->ExportState();
      ASSERT_TRUE(state.ok());
      for (const auto& b : *state) EXPECT_EQ(b.dtype, "float32") << b.name << ": masters stay fp32";
      if (!transit) continue;
      // An import replaces the host copies: the bf16 copies (current after the evaluation's
      // uploads) are cast anew from them.
      const auto ahead = Losses(exec->get(), 3);
      ASSERT_TRUE((*exec)->Evaluate().ok());
      ASSERT_TRUE((*exec)->ImportState(10, *state).ok());
      EXPECT_EQ(Losses(exec->get(), 3), ahead);
    }
    ASSERT_EQ(runs[0].size(), 10u);
    EXPECT_EQ(runs[0], runs[1]);
    // The matrix weights, most of every block's, went up at half the bytes.
    EXPECT_GT(uploaded[1], 0);
    EXPECT_LT(uploaded[1], uploaded[0] * 6 / 10) << uploaded[1] << " of " << uploaded[0];
    // Cast once per host step, though each shard's weights go up for its forward and again
    // for its backward (recompute): 4 blocks of 4 matrix weights, 10 steps.
    EXPECT_EQ(casts[0], 0);
    EXPECT_EQ(casts[1], 4 * 4 * 10);
  }
}

TEST_F(SpillingExecutorTest, OnADiscreteDeviceAPlanThatRecomputesAttentionScoresTrainsAsUnsharded) {
  // Attention scores are most of this model's activations (8 heads at context 128 against
  // width 64): on a GPU (here the CPU as a discrete device) its plans recompute them rather
  // than cut it into more shards that recompute whole forwards.
  const Trial base = testing::GptTrial("attention", "adamw", 8, 64, 8, 128, 11, 1e-3);
  fused_attention_ = false;  // what the build's fused kernel would make moot
  auto data = TokenDataset::Open(base.dataset, base.model.context_length + 1);
  ASSERT_TRUE(data.ok());
  const auto expected = UnshardedLosses(base);
  const int64_t full = EstimateTrialFootprint(base).total_bytes();
  for (const int percent : {50, 40}) {  // one shard, then several
    SCOPED_TRACE(std::to_string(percent) + "% of the footprint");
    Trial t = base;
    t.resources.device_memory_budget = full * percent / 100;
    auto factory = Factory(25e9, false, /*discrete=*/true);
    auto admitted = factory->Admit(t, **data);
    ASSERT_TRUE(admitted.ok()) << admitted.status();
    EXPECT_EQ(admitted->plan.attention, AttentionMemory::kRecomputed);
    if (percent == 50) {
      EXPECT_EQ(admitted->plan.shards.size(), 1u);
    } else {
      EXPECT_GT(admitted->plan.shards.size(), 1u);
    }
    auto exec = factory->Build(t, *data, *admitted, 0);
    ASSERT_TRUE(exec.ok()) << exec.status();
    const auto losses = Losses(exec->get(), 30);
    if (percent == 50) {
      EXPECT_EQ(losses, expected);  // the in-memory executor, scores recomputed: exactly
    } else {
      testing::ExpectStepLossesNear(losses, expected, 1e-5);
    }
    EXPECT_LE((*exec)->stats().peak_device_bytes, *t.resources.device_memory_budget);
  }
}

/// What a plan's shards but the last keep on the device from their forward to their backward,
/// and how many of them do.
int64_t KeptOnDevice(const PartitionPlan& p, int64_t micro_batches, size_t* stashing) {
  int64_t bytes = 0;
  *stashing = 0;
  for (size_t s = 0; s + 1 < p.shards.size(); ++s) {
    if (p.shards[s].policy != ActivationPolicy::kStash) continue;
    ++*stashing;
    bytes += p.shards[s].activation_bytes * micro_batches;
  }
  return bytes;
}

TEST_F(SpillingExecutorTest, OnADiscreteDeviceStashedGraphsStayInItsMemoryAndTrainAsUnsharded) {
  // On a GPU (here the CPU as a discrete device) a shard whose forward graph the budget can
  // hold keeps it in device memory while its weights leave: its backward refills the weights'
  // storages in place and recomputes nothing. Budgets from roomy to tight: every shard
  // stashing, then some stashing and some recomputing. A short context: the weights and their
  // optimizer state outweigh the activations, as in a large model at a small batch.
  Trial base = testing::GptTrial("stash", "adamw", 4, 128, 4, 8, 11, 1e-3);
  base.training.gradient_accumulation_steps = 2;
  auto data = TokenDataset::Open(base.dataset, base.model.context_length + 1);
  ASSERT_TRUE(data.ok());
  const auto expected = UnshardedLosses(base);
  const int64_t full = EstimateTrialFootprint(base).total_bytes();
  bool all = false, mixed = false;
  for (int percent = 95; percent > 5 && !(all && mixed); percent -= 5) {
    Trial t = base;
    t.resources.device_memory_budget = full * percent / 100;
    auto factory = Factory(25e9, false, /*discrete=*/true);
    auto admitted = factory->Admit(t, **data);
    if (!admitted.ok() || admitted->plan.shards.size() < 2) continue;
    size_t stashing = 0;
    const int64_t kept = KeptOnDevice(admitted->plan, 2, &stashing);
    const size_t others = admitted->plan.shards.size() - 1;
    const bool now_all = stashing == others, now_mixed = stashing > 0 && stashing < others;
    if (!(now_all && !all) && !(now_mixed && !mixed)) continue;
    all = all || now_all;
    mixed = mixed || now_mixed;
    SCOPED_TRACE(std::to_string(percent) + "% of the footprint:\n" + FormatPlan(t, admitted->plan));
    EXPECT_TRUE(admitted->plan.stash_on_device);
    auto exec = factory->Build(t, *data, *admitted, 0);
    ASSERT_TRUE(exec.ok()) << exec.status();
    testing::ExpectStepLossesNear(Losses(exec->get(), 30), expected, 1e-5);
    // The ledger counted the stashed graphs on the device, and the budget held them.
    EXPECT_GE((*exec)->stats().peak_device_bytes, kept);
    EXPECT_LE((*exec)->stats().peak_device_bytes, *t.resources.device_memory_budget);
  }
  EXPECT_TRUE(all);
  EXPECT_TRUE(mixed);
}

TEST_F(SpillingExecutorTest, OnADiscreteDeviceOffloadedGraphsComeBackForTheirBackward) {
  // Activation offload (the CPU as a discrete device): a shard whose graph the budget cannot
  // keep copies what its forward saved to host memory, frees it, and copies it back into the
  // same storages for its backward; training equals unsharded training, and equals the same
  // plan recomputing those shards instead, loss for loss (same threads, same kernels).
  Trial base = testing::GptTrial("offload", "adamw", 6, 128, 4, 16, 11, 1e-3);
  base.training.gradient_accumulation_steps = 2;
  auto data = TokenDataset::Open(base.dataset, base.model.context_length + 1);
  ASSERT_TRUE(data.ok());
  auto options = [&](bool offload) {
    ExecutorOptions o;
    o.threads = 2;
    o.fused_attention = fused_attention_;
    o.host_link_bytes_per_second = 1e12;
    o.devices.simulate_discrete = true;
    o.activation_offload = offload;
    return o;
  };
  auto offloading = MakeExecutorFactory(options(true));
  auto recomputing = MakeExecutorFactory(options(false));
  const size_t tried = TrainChosenPlans(
      offloading.get(), base, 2, UnshardedLosses(base),
      [](const Admission& a) { return a.plan.offloaded_bytes > 0; },
      [&](const Trial& t, const Admission& admitted, TrialExecutorInterface* exec,
          const std::vector<double>& losses) {
        // What the graphs saved is what the cost model counted, to a few percent (the fused
        // kernel's softmax statistics, LayerNorm's, are left out of it).
        EXPECT_NEAR(static_cast<double>(exec->stats().activation_bytes_offloaded),
                    30.0 * static_cast<double>(admitted.plan.offloaded_bytes),
                    3.0 * static_cast<double>(admitted.plan.offloaded_bytes));
        // The host tier counted the offloaded graphs (admission's host bytes hold them).
        EXPECT_GE(admitted.host_bytes, admitted.plan.offloaded_bytes);
        // The same packing recomputing instead: the same numbers.
        Admission recompute = admitted;
        for (auto& sh : recompute.plan.shards) {
          if (sh.policy == ActivationPolicy::kOffload) sh.policy = ActivationPolicy::kRecompute;
        }
        recompute.plan.offloaded_bytes = 0;
        auto plain = recomputing->Build(t, *data, recompute, 0);
        ASSERT_TRUE(plain.ok()) << plain.status();
        EXPECT_EQ(losses, Losses(plain->get(), 30));
        EXPECT_EQ((*plain)->stats().activation_bytes_offloaded, 0);
      });
  EXPECT_GT(tried, 0u) << "no budget made a plan that offloads";
}

TEST_F(SpillingExecutorTest, OnADiscreteDevicePlansThatRecomputeLayerNormsAndGeluTrainAsUnsharded) {
  // Selective recompute (the CPU as a discrete device): at budgets whose plans recompute the
  // blocks' LayerNorm and GELU outputs in backward, spilled or not, training tracks unsharded
  // training that keeps them.
  const Trial base = testing::GptTrial("selective", "adamw", 6, 128, 4, 16, 11, 1e-3);
  // A fast device: recompute costs little beside copies and shards.
  auto factory = MakeExecutorFactory(Discrete(25e9, 1e13));
  const size_t tried = TrainChosenPlans(
      factory.get(), base, 3, UnshardedLosses(base),
      [](const Admission& a) { return a.plan.selective_recompute; },
      [](const Trial&, const Admission&, TrialExecutorInterface*, const std::vector<double>&) {});
  EXPECT_GT(tried, 0u) << "no budget made a plan that recomputes LayerNorms and GELU";
}

/// Whether two exported states hold the same tensors, bit for bit.
void ExpectSameState(const std::vector<NamedBuffer>& a, const std::vector<NamedBuffer>& b) {
  ASSERT_EQ(a.size(), b.size());
  std::map<std::string, const NamedBuffer*> by_name;
  for (const auto& x : b) by_name[x.name] = &x;
  for (const auto& x : a) {
    ASSERT_TRUE(by_name.count(x.name)) << x.name;
    EXPECT_TRUE(x.data == by_name[x.name]->data) << x.name;
  }
}

/// `a` and `b`, trained alike so far on device 0 of two, go on alike through an evaluation, a
/// checkpoint, a move of `a` to device 1, and a restore of the checkpoint (4 steps after each).
void ExpectAlikeThroughEvaluationMoveAndRestore(TrialExecutorInterface* a,
                                                TrialExecutorInterface* b) {
  auto evaluated = a->Evaluate();
  ASSERT_TRUE(evaluated.ok()) << evaluated.status();
  EXPECT_EQ(*evaluated, *b->Evaluate());
  const int64_t at = a->step();
  auto state = a->ExportState();
  ASSERT_TRUE(state.ok()) << state.status();
  auto expected = b->ExportState();
  ASSERT_TRUE(expected.ok()) << expected.status();
  ExpectSameState(*state, *expected);
  ASSERT_TRUE(a->MoveTo(1).ok());
  EXPECT_EQ(testing::StepLosses(a, 4), testing::StepLosses(b, 4));
  ASSERT_TRUE(a->ImportState(at, *state).ok());
  ASSERT_TRUE(b->ImportState(at, *state).ok());
  EXPECT_EQ(testing::StepLosses(a, 4), testing::StepLosses(b, 4));
}

TEST_F(SpillingExecutorTest, OnADiscreteDeviceResidentShardsStayThereAndTrainAsUnsharded) {
  // A fast device behind a slow link (the CPU as a discrete device): plans keep their last
  // shards' weights and optimizer state on the device between steps. Training tracks unsharded
  // training, equals the same plan moving every shard's state bit for bit, uploads less by at
  // least the resident state each step, and a checkpoint, a move to another device and a
  // resume see the resident shards' newest state. With global clipping too (every shard's
  // step waits for every gradient norm: the resident shards step where they are).
  for (const double clip : {0.0, 0.5}) {
    SCOPED_TRACE(clip > 0 ? "clipping" : "no clipping");
    Trial base = testing::GptTrial("resident", "adamw", 6, 128, 4, 16, 11, 1e-3);
    base.training.grad_clip_norm = clip;
    TrainResidentPlans(base);
  }
}

void SpillingExecutorTest::TrainResidentPlans(const Trial& base) {
  ExecutorOptions o = Discrete(1e9, 1e13);
  o.devices.devices = {CpuDevice(0, 0), CpuDevice(1, 0)};
  // The lookahead's holds would move the shards that are not resident less too (by half at
  // 67% of the footprint here): its own test.
  o.lookahead = false;
  auto factory = MakeExecutorFactory(o);
  auto data = TokenDataset::Open(base.dataset, base.model.context_length + 1);
  ASSERT_TRUE(data.ok()) << data.status();
  auto uploads = [](TrialExecutorInterface* e) {
    const int64_t before = e->stats().bytes_uploaded;
    testing::StepLosses(e, 1);
    return e->stats().bytes_uploaded - before;
  };
  const size_t tried = TrainChosenPlans(
      factory.get(), base, 7, UnshardedLosses(base),
      [](const Admission& a) {  // some shards resident, some not
        const auto& sh = a.plan.shards;
        return sh.front().resident != sh.back().resident;
      },
      [&](const Trial& t, const Admission& a, TrialExecutorInterface* kept,
          const std::vector<double>& losses) {
        Admission moving = a;  // the same shards, every one's state crossing the link
        for (auto& sh : moving.plan.shards) sh.resident = false;
        moving.plan.resident_bytes = 0;
        auto moves = factory->Build(t, *data, moving, 0);
        ASSERT_TRUE(moves.ok()) << moves.status();
        TrialExecutorInterface* other = moves->get();
        EXPECT_EQ(Losses(other, 30), losses);
        EXPECT_LE(uploads(kept) + a.plan.resident_bytes, uploads(other));
        // The resident shards stay through an evaluation; the others pass through.
        ExpectAlikeThroughEvaluationMoveAndRestore(kept, other);
        EXPECT_LE(kept->stats().peak_device_bytes, *t.resources.device_memory_budget);
      });
  EXPECT_GT(tried, 0u) << "no budget made a plan with resident and moving shards";
}

TEST_F(SpillingExecutorTest, OnADiscreteDeviceTheLookaheadHoldsShardsWhereTheStepsLeaveRoom) {
  // The CPU as a discrete device, every shard's state crossing the link (no resident shards):
  // with the lookahead, spilled shards stay on the device, or come up, before their plan
  // fetches them where the steps before left room in the budget (weights kept from forward to
  // backward, backward uploads begun early, shards kept across the step's end). The same
  // numbers bit for bit as the same plan without it (same threads, same kernels), fewer bytes
  // uploaded, the ledger within the budget; an evaluation, an export, a move and an import in
  // between (each forgets what the lookahead measured) change nothing either. Two
  // micro-batches, and budgets that cut the model into a shard a block (each offloading its
  // graph): there shards kept after their forward bring their state up later, what the
  // lookahead must not count as on the device before it is.
  Trial base = testing::GptTrial("lookahead", "adamw", 6, 128, 4, 16, 11, 1e-3);
  base.training.gradient_accumulation_steps = 2;
  auto data = TokenDataset::Open(base.dataset, base.model.context_length + 1);
  ASSERT_TRUE(data.ok()) << data.status();
  auto options = [&](bool lookahead) {
    ExecutorOptions o = Discrete(25e9, 1e11);
    o.devices.devices = {CpuDevice(0, 0), CpuDevice(1, 0)};
    o.resident_state = false;
    o.lookahead = lookahead;
    return o;
  };
  auto with = MakeExecutorFactory(options(true));
  auto without = MakeExecutorFactory(options(false));
  const size_t tried = TrainChosenPlans(
      with.get(), base, 7, UnshardedLosses(base),
      [](const Admission& a) { return a.plan.shards.size() >= 6; },
      [&](const Trial& t, const Admission& a, TrialExecutorInterface* held,
          const std::vector<double>& losses) {
        EXPECT_GT(held->stats().lookahead_holds, 0);
        auto built = without->Build(t, *data, a, 0);
        ASSERT_TRUE(built.ok()) << built.status();
        TrialExecutorInterface* plain = built->get();
        EXPECT_EQ(Losses(plain, 30), losses);
        EXPECT_EQ(plain->stats().lookahead_holds, 0);
        EXPECT_LT(held->stats().bytes_uploaded, plain->stats().bytes_uploaded);
        ExpectAlikeThroughEvaluationMoveAndRestore(held, plain);
        EXPECT_LE(held->stats().peak_device_bytes, *t.resources.device_memory_budget);
      });
  EXPECT_GT(tried, 0u) << "no budget made a plan of 6 shards or more";
}

TEST_F(SpillingExecutorTest, OnADiscreteDeviceOffloadedInputsComeBackAndTrainAsUnsharded) {
  // A deep, narrow trial (the CPU as a discrete device): at budgets whose plans keep recomputing
  // shards' inputs in host memory, training tracks unsharded training, equals the same plan
  // keeping those inputs on the device bit for bit, and the inputs' bytes are counted.
  const Trial base = testing::GptTrial("inputs", "adamw", 16, 32, 4, 64, 11, 1e-3);
  auto factory = MakeExecutorFactory(Discrete(1e11, 1e12));
  auto data = TokenDataset::Open(base.dataset, base.model.context_length + 1);
  ASSERT_TRUE(data.ok()) << data.status();
  const size_t tried = TrainChosenPlans(
      factory.get(), base, 2, UnshardedLosses(base),
      [](const Admission& a) {
        return std::any_of(a.plan.shards.begin(), a.plan.shards.end(),
                           [](const ShardPlan& s) { return s.input_offloaded; });
      },
      [&](const Trial& t, const Admission& a, TrialExecutorInterface* exec,
          const std::vector<double>& losses) {
        EXPECT_GT(exec->stats().activation_bytes_offloaded, 0);
        Admission kept = a;  // the same plan, every input kept on the device
        for (auto& sh : kept.plan.shards) sh.input_offloaded = false;
        // Room for them: the ledger counts the inputs the shards keep (the plan offloaded them
        // because the budget does not hold them).
        Trial roomy = t;
        *roomy.resources.device_memory_budget += a.plan.offloaded_bytes;
        auto keeps = factory->Build(roomy, *data, kept, 0);
        ASSERT_TRUE(keeps.ok()) << keeps.status();
        EXPECT_EQ(Losses(keeps->get(), 30), losses);
        // Less offloaded by the inputs (a shard may still offload its graph).
        EXPECT_LT((*keeps)->stats().activation_bytes_offloaded,
                  exec->stats().activation_bytes_offloaded);
      });
  EXPECT_GT(tried, 0u) << "no budget made a plan that offloads inputs";
}

TEST_F(SpillingExecutorTest, LayerTooBigIsRefusedBeforeTraining) {
  Trial t = Small("adamw");
  t.resources.device_memory_budget = 64 << 10;
  auto factory = Factory();
  auto data = TokenDataset::Open(t.dataset, t.model.context_length + 1);
  Status s = factory->Check(t, **data);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(), HasSubstr("layer "));
  EXPECT_THAT(s.message(), HasSubstr("needs"));
}

TEST_F(SpillingExecutorTest, NotEnoughFreeDiskIsRefusedBeforeTraining) {
  // ~3.3 trillion parameters: 38 TB of state, more than any test machine's disk.
  Trial t = Small("adamw");
  t.model.n_layer = 1000;
  t.model.n_embd = 16384;
  t.model.n_head = 128;
  t.training.batch_size = 1;
  t.resources.device_memory_budget = 256LL << 30;
  t.resources.offload = OffloadTier::kDisk;
  auto factory = Factory();
  auto data = TokenDataset::Open(t.dataset, t.model.context_length + 1);
  ASSERT_TRUE(data.ok());
  Status s = factory->Check(t, **data);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(s.message(), HasSubstr("free"));
  EXPECT_THAT(s.message(), HasSubstr(spill_.string()));
}

TEST_F(SpillingExecutorTest, DiskFailureIsAClearError) {
  Trial t = Small("adamw");
  t.resources.device_memory_budget = BudgetFor(t, 2);
  t.resources.offload = OffloadTier::kDisk;
  auto factory = Factory();
  auto exec = Make(factory.get(), t);
  ASSERT_TRUE(exec.ok()) << exec.status();
  ASSERT_TRUE((*exec)->TrainStep().ok());
  // Corrupt shard 0's weights on disk: the next step must fail with DATA_LOSS naming the file.
  std::vector<fs::path> folders;  // the executor's own: spill.XXXXXX
  for (const auto& e : fs::directory_iterator(spill_)) folders.push_back(e.path());
  ASSERT_EQ(folders.size(), 1u);
  EXPECT_EQ(folders[0].filename().string().rfind("spill.", 0), 0u) << folders[0];
  const fs::path file = folders[0] / "shard0.w.spill";
  ASSERT_TRUE(fs::exists(file));
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(64);
    f.put('\x7f');
  }
  auto m = (*exec)->TrainStep();
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(m.status().message(), HasSubstr("shard0.w.spill"));
  // The step stopped midway, with the unchecked bytes in shard 0's memory: the executor now
  // refuses to go on, naming why, where it used to train on (and export) them.
  auto expect_refused = [](const Status& s) {
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
    EXPECT_THAT(s.message(), HasSubstr("step 1 failed midway"));
    EXPECT_THAT(s.message(), HasSubstr("shard0.w.spill"));
  };
  expect_refused((*exec)->TrainStep().status());
  expect_refused((*exec)->Evaluate().status());
  expect_refused((*exec)->ExportState().status());
  EXPECT_EQ((*exec)->step(), 1);
}

TEST_F(SpillingExecutorTest, TrialsOfOneNameInTwoNamespacesKeepTheirOwnSpillFiles) {
  // Two tenants' trials of one name (the same job name and grid) on one agent's disk tier,
  // stepped in turn: each trains as it does alone. They once shared <spill_dir>/<name>, so each
  // read the other's weights, and the first to end deleted the other's files.
  Trial a = Small("adamw");
  a.namespace_ = "team-a";
  a.resources.device_memory_budget = BudgetFor(a, 2);
  a.resources.offload = OffloadTier::kDisk;
  Trial b = a;
  b.namespace_ = "team-b";
  b.training.seed = a.training.seed + 1;  // other weights
  auto factory = Factory();
  auto alone = [&](const Trial& t) {
    auto exec = Make(factory.get(), t);
    EXPECT_TRUE(exec.ok()) << exec.status();
    std::vector<double> losses;
    for (int i = 0; exec.ok() && i < 3; ++i) losses.push_back((*exec)->TrainStep()->loss);
    return losses;
  };
  const std::vector<double> want_a = alone(a), want_b = alone(b);
  ASSERT_NE(want_a, want_b);
  auto ea = Make(factory.get(), a), eb = Make(factory.get(), b);
  ASSERT_TRUE(ea.ok() && eb.ok());
  for (int i = 0; i < 3; ++i) {
    auto ma = (*ea)->TrainStep();
    auto mb = (*eb)->TrainStep();
    ASSERT_TRUE(ma.ok() && mb.ok()) << ma.status() << mb.status();
    EXPECT_EQ(ma->loss, want_a[static_cast<size_t>(i)]) << "step " << i;
    EXPECT_EQ(mb->loss, want_b[static_cast<size_t>(i)]) << "step " << i;
  }
  ea->reset();  // a ends: b's files stay
  EXPECT_TRUE((*eb)->TrainStep().ok());
  EXPECT_EQ(SpillFolderStem("/s", a), "/s/team-a_spill");
}

TEST_F(SpillingExecutorTest, DiskTierKeepsResidentMemoryNearTheBudget) {
  // ~35M parameters: 425 MiB of AdamW state, against a 96 MiB device budget.
  Trial t = Shaped(20, 384, 6, 64);
  t.resources.device_memory_budget = 96 << 20;
  t.resources.offload = OffloadTier::kDisk;
  t.resources.host_memory_budget = 8 << 20;  // RAM is scarce: recompute rather than stash
  const int64_t state = EstimateTrialFootprint(t).parameter_bytes * 3;
  ASSERT_GT(state, 4 * *t.resources.device_memory_budget);
  auto factory = Factory();
  auto data = TokenDataset::Open(t.dataset, t.model.context_length + 1);
  ASSERT_TRUE(data.ok());
  WarmUp(*data);
  // Sampled from before the executor exists: building the model spills it layer by layer, so
  // even set-up never holds the whole state.
  const int64_t baseline = ResidentBytes();
  ResidentPeakSampler sampler;
  auto exec = factory->Create(t, *data);
  ASSERT_TRUE(exec.ok()) << exec.status();
  Losses(exec->get(), 3);
  sampler.Stop();
  const int64_t overhead = 48 << 20;  // stated fixed overhead: allocator slack, batch, logits
  const int64_t growth = sampler.peak() - baseline;
  std::cout << "state " << FormatBytes(state) << ", budget "
            << FormatBytes(*t.resources.device_memory_budget) << ", resident growth "
            << FormatBytes(growth) << " (baseline " << FormatBytes(baseline) << ")\n";
  EXPECT_LT(sampler.peak(), baseline + *t.resources.device_memory_budget + overhead);
  EXPECT_LE((*exec)->stats().peak_device_bytes, *t.resources.device_memory_budget);
  // Counted from the shapes, not from the (spilled, empty) tensors.
  EXPECT_EQ((*exec)->stats().parameters, EstimateTrialFootprint(t).parameters);
}

TEST_F(SpillingExecutorTest, DiscreteSetUpHoldsTheHostTierAndOneShardsWeightsAtMost) {
  // On a GPU the host tier holds every shard's weights and optimizer state, which is what
  // admission counts (Admission::host_bytes). Set-up builds each shard in host memory and moves
  // it into that tier: on top of the tier it may hold one shard's freshly built weights, not
  // their optimizer state too, and afterwards it keeps neither (a model sized to the host's
  // RAM must not fail in set-up, nor hold a shard twice for its whole run). ~50M parameters
  // in two shards, on the CPU as a discrete device.
  Trial t = Shaped(4, 1024, 8, 32);
  t.resources.device_memory_budget = BudgetFor(t, 2, /*discrete=*/true);
  auto factory = Factory(0, false, /*discrete=*/true);
  auto data = TokenDataset::Open(t.dataset, t.model.context_length + 1);
  ASSERT_TRUE(data.ok()) << data.status();
  auto admitted = factory->Admit(t, **data);
  ASSERT_TRUE(admitted.ok()) << admitted.status();
  const PartitionPlan& plan = admitted->plan;
  ASSERT_EQ(plan.state_tier, StateTier::kHost);
  ASSERT_GE(plan.shards.size(), 2u);
  int64_t largest_weights = 0;
  for (const auto& s : plan.shards) largest_weights = std::max(largest_weights, s.gradient_bytes);
  WarmUp(*data);
  const int64_t baseline = ResidentBytes();
  ResidentPeakSampler sampler;
  auto exec = factory->Build(t, *data, *admitted, 0);
  ASSERT_TRUE(exec.ok()) << exec.status();
  sampler.Stop();
  const int64_t after = ResidentBytes() - baseline;
  const int64_t overhead = 64 << 20;  // stated fixed overhead: allocator slack, tied parameters
  std::cout << "host tier " << FormatBytes(plan.total_state_bytes) << ", largest shard's weights "
            << FormatBytes(largest_weights) << "; set-up's resident growth: peak "
            << FormatBytes(sampler.peak() - baseline) << ", after " << FormatBytes(after) << "\n";
  EXPECT_LT(sampler.peak() - baseline, plan.total_state_bytes + largest_weights + overhead);
  EXPECT_LT(after, plan.total_state_bytes + overhead);
  Losses(exec->get(), 1);  // and it trains
}

}  // namespace
}  // namespace hydra::executor
