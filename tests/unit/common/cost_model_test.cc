#include "common/cost_model.h"

#include <gtest/gtest.h>

namespace hydra {
namespace {

TEST(CostModelTest, Gpt2SmallHasItsKnownParameterCount) {
  // GPT-2 small: 124,439,808 parameters with the tied LM head (Radford et al., HF count).
  ModelSpec m;
  m.n_layer = 12;
  m.n_embd = 768;
  m.n_head = 12;
  m.context_length = 1024;
  m.vocab_size = 50257;
  int64_t params = 0;
  for (const auto& l : ModelLayerCosts(m, 1)) params += l.parameters;
  EXPECT_EQ(params, 124439808);
}

TEST(CostModelTest, FootprintCountsOptimizerState) {
  Trial t;
  t.training.optimizer = "adamw";
  auto adam = EstimateTrialFootprint(t);
  EXPECT_EQ(adam.optimizer_bytes, adam.parameters * 8);
  t.training.optimizer = "sgd";
  auto sgd = EstimateTrialFootprint(t);
  EXPECT_EQ(sgd.optimizer_bytes, sgd.parameters * 4);
  EXPECT_GT(adam.total_bytes(), sgd.total_bytes());
  t.training.batch_size = 16;
  EXPECT_GT(EstimateTrialFootprint(t).activation_bytes, sgd.activation_bytes);
}

}  // namespace
}  // namespace hydra
