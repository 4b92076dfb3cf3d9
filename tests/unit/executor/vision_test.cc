// The image families (mlp, resnet) on an images-u8 file: spilled training equals in-memory
// training step by step, the models learn a learnable task, and bad image files are refused.
#include "agent/executor/vision.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include "agent/executor/spilling_executor.h"
#include "common/cost_model.h"
#include "common/partitioner.h"

namespace hydra::executor {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

/// `n` 3x8x8 images; the label says which half (top or bottom) is brighter.
void WriteImages(const fs::path& path, int n) {
  std::mt19937 rng(7);
  std::ofstream f(path, std::ios::binary);
  for (int i = 0; i < n; ++i) {
    const uint8_t label = static_cast<uint8_t>(rng() % 2);
    f.put(static_cast<char>(label));
    for (int c = 0; c < 3; ++c) {
      for (int y = 0; y < 8; ++y) {
        for (int x = 0; x < 8; ++x) {
          const bool bright = (y < 4) == (label == 0);
          f.put(static_cast<char>((bright ? 140 : 60) + static_cast<int>(rng() % 80)));
        }
      }
    }
  }
}

class VisionTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("hydra_vision_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    WriteImages(dir_ / "images.bin", 400);
  }
  void TearDown() override { fs::remove_all(dir_); }

  Trial Make(const std::string& family) {
    Trial t;
    t.name = family;
    t.model.family = *ParseName<ModelFamily>(family);
    t.model.n_layer = family == "mlp" ? 4 : 3;
    t.model.n_embd = family == "mlp" ? 256 : 8;
    t.model.num_classes = 2;
    t.dataset.format = DatasetFormat::kImagesU8;
    t.dataset.image_shape = {3, 8, 8};
    t.dataset.resolved_path = (dir_ / "images.bin").string();
    t.dataset.eval_sequences = 40;
    t.training.batch_size = 16;
    t.training.learning_rate = 3e-3;
    t.training.steps = 30;
    t.training.seed = 3;
    return t;
  }
  std::unique_ptr<ExecutorFactoryInterface> Factory() {
    ExecutorOptions o;
    o.threads = 2;
    o.spill_dir = (dir_ / "spill").string();
    return MakeExecutorFactory(o);
  }
  std::vector<double> Train(const Trial& t, int steps, int64_t* shards = nullptr) {
    auto data = TokenDataset::Open(t.dataset, SampleWindow(t));
    EXPECT_TRUE(data.ok()) << data.status();
    auto factory = Factory();
    auto exec = factory->Create(t, *data);
    EXPECT_TRUE(exec.ok()) << exec.status();
    if (!exec.ok()) return {};
    if (shards) *shards = (*exec)->stats().shards;
    std::vector<double> losses;
    for (int s = 0; s < steps; ++s) {
      auto m = (*exec)->TrainStep();
      EXPECT_TRUE(m.ok()) << m.status();
      if (!m.ok()) break;
      losses.push_back(m->loss);
    }
    auto val = (*exec)->Evaluate();
    EXPECT_TRUE(val.ok());
    losses.push_back(val.ok() ? *val : NAN);
    return losses;
  }
  fs::path dir_;
};

TEST_P(VisionTest, SpilledTrainingEqualsInMemoryAndLearns) {
  Trial t = Make(GetParam());
  t.training.grad_clip_norm = 1.0;
  t.training.gradient_accumulation_steps = 2;
  int64_t one = 0;
  const auto plain = Train(t, 12, &one);
  EXPECT_EQ(one, 1);
  // A budget that cuts the model into several shards whose state lives on disk.
  Trial spilled = t;
  const int64_t full = EstimateTrialFootprint(t).total_bytes();
  for (int pct = 60; pct > 1; --pct) {
    Trial probe = t;
    probe.resources.device_memory_budget = full * pct / 100;
    auto plan = PlanShards(probe, PartitionOptionsFor(probe));
    if (plan.ok() && plan->shards.size() >= 3) {
      spilled = probe;
      break;
    }
  }
  ASSERT_TRUE(spilled.resources.device_memory_budget.has_value()) << "no 3-shard budget";
  spilled.resources.offload = OffloadTier::kDisk;
  int64_t shards = 0;
  const auto cut = Train(spilled, 12, &shards);
  EXPECT_GE(shards, 3);
  ASSERT_EQ(cut.size(), plain.size());
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_NEAR(cut[i], plain[i], 1e-5 * std::abs(plain[i])) << "step " << i;
  }
  // The task is learnable: 30 steps beat chance (ln 2 = 0.693) on the validation images.
  const auto learned = Train(Make(GetParam()), 30);
  EXPECT_LT(learned.back(), 0.6) << "validation loss after 30 steps";
}

TEST_P(VisionTest, Bf16TracksFp32AndSpillsLikeInMemory) {
  Trial t = Make(GetParam());
  const auto fp32 = Train(t, 30);
  t.training.precision = Precision::kBf16;
  const auto bf16 = Train(t, 30);
  ASSERT_EQ(bf16.size(), fp32.size());
  EXPECT_NE(bf16, fp32) << "the bf16 run computed in fp32";
  EXPECT_LT(bf16.back(), 0.6) << "bf16 validation loss after 30 steps";
  EXPECT_NEAR(bf16.back(), fp32.back(), 0.05 * fp32.back() + 0.01);
  Trial spilled = t;
  spilled.resources.shard_boundaries = {1, 2};
  spilled.resources.offload = OffloadTier::kDisk;
  const auto cut = Train(spilled, 30);
  ASSERT_EQ(cut.size(), bf16.size());
  // Near zero loss, relative differences grow: 0.2% or 1e-3 absolute (1.6e-4 measured).
  EXPECT_NEAR(cut.back(), bf16.back(), 2e-3 * bf16.back() + 1e-3);
}

TEST_P(VisionTest, CostModelMatchesTheBuiltLayers) {
  // Per layer, the planner's parameters, buffers and output sizes are those of the real model
  // (resnet with 4 blocks, so one block halves the resolution and doubles the channels).
  Trial t = Make(GetParam());
  t.model.n_layer = 4;
  t.model.n_embd = 16;
  const int64_t micro = 5;
  const auto costs = ModelLayerCosts(t, micro);
  const LayerSequence seq = GetParam() == "mlp" ? BuildMlp(t.model, t.dataset.image_shape, 1)
                                                : BuildResNet(t.model, t.dataset.image_shape, 1);
  ASSERT_EQ(costs.size(), seq.layers.size());
  torch::NoGradGuard no_grad;
  auto x = torch::rand({micro, 3, 8, 8});
  for (size_t i = 0; i < costs.size(); ++i) {
    EXPECT_EQ(costs[i].name, seq.names[i]);
    int64_t params = 0;
    for (const auto& p : seq.layers[i]->parameters()) params += p.numel();
    EXPECT_EQ(costs[i].parameters, params) << seq.names[i];
    int64_t buffers = 0;  // what the spilling executor's ledger takes for them
    for (const auto& b : seq.layers[i]->buffers()) buffers += static_cast<int64_t>(b.nbytes());
    EXPECT_EQ(costs[i].buffer_bytes, buffers) << seq.names[i];
    x = seq.layers[i]->forward(x);
    EXPECT_EQ(costs[i].output_bytes, x.numel() * 4) << seq.names[i];
    EXPECT_GE(costs[i].activation_bytes, costs[i].output_bytes) << seq.names[i];
  }
  EXPECT_EQ(x.sizes().vec(), (std::vector<int64_t>{micro, 2}));
}

INSTANTIATE_TEST_SUITE_P(Families, VisionTest, ::testing::Values("mlp", "resnet"));

TEST_F(VisionTest, BadImageFilesAreRefused) {
  Trial t = Make("mlp");
  // Not whole records of this shape.
  { std::ofstream(dir_ / "images.bin", std::ios::app | std::ios::binary) << "xyz"; }
  auto torn = TokenDataset::Open(t.dataset, SampleWindow(t));
  EXPECT_FALSE(torn.ok());
  EXPECT_THAT(torn.status().message(), HasSubstr("is not a whole number of 193-byte records"));
  // Labels beyond numClasses.
  WriteImages(dir_ / "images.bin", 50);
  t.model.num_classes = 1 + 0;  // labels 0 and 1 exist
  auto data = TokenDataset::Open(t.dataset, SampleWindow(t));
  ASSERT_TRUE(data.ok());
  Status s = Factory()->Check(t, **data);
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("holds label 1, outside the model's classes"));
}

}  // namespace
}  // namespace hydra::executor
