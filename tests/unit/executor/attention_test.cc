#include "agent/executor/attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "agent/executor/precision.h"

namespace hydra::executor {
namespace {

struct Result {
  torch::Tensor y, dq, dk, dv;
};

/// The attention of fixed random q, k, v (in `type`; [B*H, T, D] = [6, 16, 8]) and the
/// gradients of a fixed random projection of it, under `precision`; backward runs outside
/// the precision scope, as the executors' backward may.
Result Attend(bool recompute, torch::ScalarType type, Precision precision) {
  torch::manual_seed(3);
  auto make = [&] { return torch::randn({6, 16, 8}).to(type).requires_grad_(true); };
  auto q = make(), k = make(), v = make();
  const auto mask = torch::full({16, 16}, -INFINITY).triu(1);
  const auto weights = torch::randn({6, 16, 8});
  torch::Tensor y;
  {
    PrecisionScope scope(precision);
    y = CausalAttention(q, k, v, mask, 1.0 / std::sqrt(8.0), recompute);
  }
  (y.to(torch::kFloat) * weights).sum().backward();
  return {y.detach(), q.grad(), k.grad(), v.grad()};
}

void ExpectIdentical(const Result& a, const Result& b) {
  EXPECT_TRUE(torch::equal(a.y, b.y));
  EXPECT_TRUE(torch::equal(a.dq, b.dq));
  EXPECT_TRUE(torch::equal(a.dk, b.dk));
  EXPECT_TRUE(torch::equal(a.dv, b.dv));
}

TEST(AttentionTest, RecomputingTheScoresGivesTheSameOutputAndGradientsBitForBit) {
  SCOPED_TRACE("fp32");
  ExpectIdentical(Attend(true, torch::kFloat, Precision::kFp32),
                  Attend(false, torch::kFloat, Precision::kFp32));
}

TEST(AttentionTest, InBf16TooAndUnderAutocastThatBackwardNoLongerSees) {
  {
    SCOPED_TRACE("bf16 inputs");
    ExpectIdentical(Attend(true, torch::kBFloat16, Precision::kFp32),
                    Attend(false, torch::kBFloat16, Precision::kFp32));
  }
  {
    // fp32 inputs, bf16 autocast in forward only: the recompute must run in bf16 too.
    SCOPED_TRACE("fp32 inputs under autocast");
    const auto recomputed = Attend(true, torch::kFloat, Precision::kBf16);
    ExpectIdentical(recomputed, Attend(false, torch::kFloat, Precision::kBf16));
    EXPECT_EQ(recomputed.y.scalar_type(), torch::kBFloat16);
  }
}

TEST(AttentionTest, OnlyTheRecomputingGraphLeavesOutTheScores) {
  auto q = torch::randn({2, 8, 4}).requires_grad_(true);
  const auto mask = torch::full({8, 8}, -INFINITY).triu(1);
  const auto kept = CausalAttention(q, q, q, mask, 0.5, false);
  const auto recomputed = CausalAttention(q, q, q, mask, 0.5, true);
  // The plain graph ends in the product with the probabilities (which it keeps); the
  // recomputing one in a node that holds q, k and v only.
  EXPECT_NE(kept.grad_fn()->name().find("Bmm"), std::string::npos) << kept.grad_fn()->name();
  EXPECT_NE(recomputed.grad_fn()->name().find("RecomputedAttention"), std::string::npos)
      << recomputed.grad_fn()->name();
  torch::NoGradGuard no_grad;  // evaluation: nothing to recompute, no custom node
  EXPECT_EQ(CausalAttention(q, q, q, mask, 0.5, true).grad_fn(), nullptr);
  EXPECT_TRUE(torch::equal(CausalAttention(q, q, q, mask, 0.5, true), kept.detach()));
}

}  // namespace
}  // namespace hydra::executor
