#include "agent/executor/inmemory_executor.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "agent/executor/checkpoint.h"

namespace hydra::executor {
namespace {

Trial SmallTrial() {
  Trial t;
  t.name = "t";
  t.model.n_layer = 2;
  t.model.n_embd = 64;
  t.model.n_head = 4;
  t.model.context_length = 64;
  t.model.vocab_size = 256;
  t.training.learning_rate = 3e-3;
  t.training.batch_size = 8;
  t.training.steps = 200;
  t.training.seed = 5;
  t.dataset.format = DatasetFormat::kText;
  t.dataset.resolved_path = std::string(HYDRA_SOURCE_DIR) + "/examples/data/corpus.txt";
  t.dataset.validation_fraction = 0.05;
  t.dataset.eval_sequences = 32;
  return t;
}

class InMemoryExecutorTest : public ::testing::Test {
 protected:
  std::unique_ptr<TrialExecutorInterface> Make(const Trial& t) {
    auto data = TokenDataset::Open(t.dataset, t.model.context_length + 1);
    EXPECT_TRUE(data.ok()) << data.status();
    auto exec = factory_->Create(t, *data);
    EXPECT_TRUE(exec.ok()) << exec.status();
    return std::move(exec).value();
  }
  std::vector<double> Train(TrialExecutorInterface* e, int steps) {
    std::vector<double> losses;
    for (int i = 0; i < steps; ++i) {
      auto m = e->TrainStep();
      EXPECT_TRUE(m.ok()) << m.status();
      losses.push_back(m->loss);
    }
    return losses;
  }
  std::unique_ptr<ExecutorFactoryInterface> factory_ = MakeInMemoryExecutorFactory({2});
};

TEST_F(InMemoryExecutorTest, LossOnRealTextFallsWellBelowUniform) {
  Trial t = SmallTrial();
  t.training.learning_rate = 1e-3;
  t.training.batch_size = 16;
  auto e = Make(t);
  auto before = e->Evaluate();
  ASSERT_TRUE(before.ok());
  EXPECT_NEAR(*before, std::log(256.0), 0.3);  // GPT-2 init predicts near-uniformly
  auto losses = Train(e.get(), 150);
  auto after = e->Evaluate();
  ASSERT_TRUE(after.ok());
  EXPECT_LT(*after, 0.6 * std::log(256.0)) << "validation loss after 150 steps";
  EXPECT_LT(losses.back(), losses.front() - 2.0);
  EXPECT_EQ(e->step(), 150);
}

TEST_F(InMemoryExecutorTest, CheckpointRoundTripIsBitExact) {
  Trial t = SmallTrial();
  auto a = Make(t);
  Train(a.get(), 3);
  auto state = a->ExportState();
  ASSERT_TRUE(state.ok());
  const std::string path = std::filesystem::temp_directory_path() /
                           ("hydra_exec_ckpt_" + std::to_string(::getpid()) + ".hck");
  ASSERT_TRUE(WriteCheckpointFile(path, {{{"step", a->step()}}, *state}).ok());
  auto read = ReadCheckpointFile(path);
  std::filesystem::remove(path);
  ASSERT_TRUE(read.ok());
  Trial other = t;
  other.training.seed = 99;  // different init: everything must come from the checkpoint
  auto b = Make(other);
  ASSERT_TRUE(b->ImportState(3, read->buffers).ok());
  auto again = b->ExportState();
  ASSERT_TRUE(again.ok());
  ASSERT_EQ(again->size(), state->size());
  for (size_t i = 0; i < state->size(); ++i) {
    EXPECT_EQ((*state)[i].name, (*again)[i].name);
    EXPECT_EQ((*state)[i].data, (*again)[i].data) << (*state)[i].name;
  }
  // Both include optimizer state.
  bool has_moments = false;
  for (const auto& buf : *state)
    has_moments = has_moments || buf.name.find("exp_avg_sq") != std::string::npos;
  EXPECT_TRUE(has_moments);
}

TEST_F(InMemoryExecutorTest, InterruptedThenResumedEqualsUninterrupted) {
  for (const char* opt : {"adamw", "sgd"}) {
    Trial t = SmallTrial();
    t.training.optimizer = *ParseName<OptimizerKind>(opt);
    t.training.lr_schedule = LrSchedule::kCosine;
    t.training.warmup_steps = 3;
    t.training.steps = 12;
    t.training.grad_clip_norm = 1.0;
    auto straight = Make(t);
    auto expected = Train(straight.get(), 12);

    auto first = Make(t);
    auto losses = Train(first.get(), 5);
    auto state = first->ExportState();
    ASSERT_TRUE(state.ok());
    first.reset();  // the process "dies"
    auto resumed = Make(t);
    ASSERT_TRUE(resumed->ImportState(5, *state).ok());
    auto rest = Train(resumed.get(), 7);
    losses.insert(losses.end(), rest.begin(), rest.end());
    ASSERT_EQ(losses.size(), expected.size());
    for (size_t i = 0; i < losses.size(); ++i) {
      EXPECT_EQ(losses[i], expected[i]) << opt << " step " << i;  // exactly, not approximately
    }
  }
}

TEST_F(InMemoryExecutorTest, GradientAccumulationMatchesTheFullBatch) {
  Trial full = SmallTrial();
  Trial accumulated = full;
  accumulated.training.gradient_accumulation_steps = 4;
  auto a = Make(full), b = Make(accumulated);
  auto la = Train(a.get(), 5), lb = Train(b.get(), 5);
  for (size_t i = 0; i < la.size(); ++i) EXPECT_NEAR(la[i], lb[i], 1e-5 * std::fabs(la[i]));
}

TEST_F(InMemoryExecutorTest, EvaluateChangesNoState) {
  Trial t = SmallTrial();
  auto a = Make(t), b = Make(t);
  Train(a.get(), 2);
  Train(b.get(), 2);
  auto v1 = a->Evaluate(), v2 = a->Evaluate();
  ASSERT_TRUE(v1.ok() && v2.ok());
  EXPECT_EQ(*v1, *v2);
  EXPECT_EQ(Train(a.get(), 1), Train(b.get(), 1));
}

TEST_F(InMemoryExecutorTest, ImportRejectsMismatchedState) {
  Trial t = SmallTrial();
  auto a = Make(t);
  auto state = a->ExportState();
  ASSERT_TRUE(state.ok());
  auto missing = *state;
  missing.pop_back();
  Status s = a->ImportState(1, missing);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("lacks"), std::string::npos) << s;
  auto reshaped = *state;
  reshaped[0].shape = {1};
  s = a->ImportState(1, reshaped);
  EXPECT_NE(s.message().find("expected"), std::string::npos) << s;
  EXPECT_EQ(a->step(), 0);
}

TEST_F(InMemoryExecutorTest, RefusesTrialsOverTheBudgetAndTokensOutsideTheVocabulary) {
  Trial t = SmallTrial();
  t.resources.device_memory_budget = 1 << 20;
  auto data = TokenDataset::Open(t.dataset, t.model.context_length + 1);
  ASSERT_TRUE(data.ok());
  Status s = factory_->Check(t, **data);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("deviceMemoryBudget is 1.00 MiB"), std::string::npos) << s;
  EXPECT_EQ(factory_->Create(t, *data).status().code(), StatusCode::kResourceExhausted);

  Trial v = SmallTrial();
  v.model.vocab_size = 100;  // the corpus holds bytes up to 126
  s = factory_->Check(v, **data);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("outside the model's vocabulary"), std::string::npos) << s;
}

TEST_F(InMemoryExecutorTest, StatsReportParametersAndFootprint) {
  auto e = Make(SmallTrial());
  auto st = e->stats();
  EXPECT_EQ(st.shards, 1);
  EXPECT_GT(st.parameters, 100000);
  EXPECT_GT(st.peak_device_bytes, st.parameters * 16);
}

}  // namespace
}  // namespace hydra::executor
