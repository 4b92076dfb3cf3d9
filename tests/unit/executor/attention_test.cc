#include "agent/executor/attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <tuple>
#include <utility>

#include "agent/executor/precision.h"

namespace hydra::executor {
namespace {

constexpr auto kKept = AttentionMemory::kKept;
constexpr auto kRecomputed = AttentionMemory::kRecomputed;
constexpr auto kFused = AttentionMemory::kFused;

struct Result {
  torch::Tensor y, dq, dk, dv;
};

/// The attention of fixed random q, k, v (in `type`; [B*H, T, D] = [6, 16, 8]) and the
/// gradients of a fixed random projection of it, under `precision`; backward runs outside
/// the precision scope, as the executors' backward may.
Result Attend(AttentionMemory how, torch::ScalarType type, Precision precision) {
  torch::manual_seed(3);
  auto make = [&] { return torch::randn({6, 16, 8}).to(type).requires_grad_(true); };
  auto q = make(), k = make(), v = make();
  const auto mask = torch::full({16, 16}, -INFINITY).triu(1);
  const auto weights = torch::randn({6, 16, 8});
  torch::Tensor y;
  {
    PrecisionScope scope(precision);
    y = CausalAttention(q, k, v, mask, 1.0 / std::sqrt(8.0), how);
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
  ExpectIdentical(Attend(kRecomputed, torch::kFloat, Precision::kFp32),
                  Attend(kKept, torch::kFloat, Precision::kFp32));
}

TEST(AttentionTest, InBf16TooAndUnderAutocastThatBackwardNoLongerSees) {
  {
    SCOPED_TRACE("bf16 inputs");
    ExpectIdentical(Attend(kRecomputed, torch::kBFloat16, Precision::kFp32),
                    Attend(kKept, torch::kBFloat16, Precision::kFp32));
  }
  {
    // fp32 inputs, bf16 autocast in forward only: the recompute must run in bf16 too.
    SCOPED_TRACE("fp32 inputs under autocast");
    const auto recomputed = Attend(kRecomputed, torch::kFloat, Precision::kBf16);
    ExpectIdentical(recomputed, Attend(kKept, torch::kFloat, Precision::kBf16));
    EXPECT_EQ(recomputed.y.scalar_type(), torch::kBFloat16);
  }
}

TEST(AttentionTest, OnlyTheRecomputingGraphLeavesOutTheScores) {
  auto q = torch::randn({2, 8, 4}).requires_grad_(true);
  const auto mask = torch::full({8, 8}, -INFINITY).triu(1);
  const auto kept = CausalAttention(q, q, q, mask, 0.5, kKept);
  const auto recomputed = CausalAttention(q, q, q, mask, 0.5, kRecomputed);
  // The plain graph ends in the product with the probabilities (which it keeps); the
  // recomputing one in a node that holds q, k and v only.
  EXPECT_NE(kept.grad_fn()->name().find("Bmm"), std::string::npos) << kept.grad_fn()->name();
  EXPECT_NE(recomputed.grad_fn()->name().find("RecomputedAttention"), std::string::npos)
      << recomputed.grad_fn()->name();
  torch::NoGradGuard no_grad;  // evaluation: nothing to recompute, no custom node
  EXPECT_EQ(CausalAttention(q, q, q, mask, 0.5, kRecomputed).grad_fn(), nullptr);
  EXPECT_TRUE(torch::equal(CausalAttention(q, q, q, mask, 0.5, kRecomputed), kept.detach()));
}

void ExpectClose(const Result& a, const Result& b, double tolerance) {
  for (const auto& [x, y, name] : {std::tuple{a.y, b.y, "output"}, std::tuple{a.dq, b.dq, "dq"},
                                   std::tuple{a.dk, b.dk, "dk"}, std::tuple{a.dv, b.dv, "dv"}}) {
    EXPECT_TRUE(torch::allclose(x.to(torch::kFloat), y.to(torch::kFloat), tolerance, tolerance))
        << name << ": largest difference "
        << (x.to(torch::kFloat) - y.to(torch::kFloat)).abs().max().item<double>();
  }
}

/// Fused attention over the heads of one projection's output [B, T, 3C] (B = 2, T = 16,
/// H = 3, D = 8): `views` passes [B, H, T, D] views of it (the GPT block's fused path),
/// otherwise contiguous [B*H, T, D] copies (its other paths). The output as [B, T, C] and the
/// projection output's gradient.
std::pair<torch::Tensor, torch::Tensor> AttendToProjection(bool views) {
  torch::manual_seed(5);
  const int64_t B = 2, T = 16, H = 3, D = 8, C = H * D;
  auto qkv = torch::randn({B, T, 3 * C}).requires_grad_(true);
  const auto weights = torch::randn({B, T, C});
  auto parts = qkv.split(C, 2);
  auto heads = [&](const torch::Tensor& t) {
    auto h = t.view({B, T, H, D}).transpose(1, 2);
    return views ? h : h.reshape({B * H, T, D});
  };
  auto y = CausalAttention(heads(parts[0]), heads(parts[1]), heads(parts[2]),
                           torch::full({T, T}, -INFINITY).triu(1), 1.0 / std::sqrt(8.0), kFused);
  y = y.view({B, H, T, D}).transpose(1, 2).reshape({B, T, C});
  (y * weights).sum().backward();
  return {y.detach(), qkv.grad()};
}

TEST(AttentionTest, TheFusedKernelTakesTheHeadsAsViewsOfOneProjection) {
  if (!FusedAttentionAvailable()) GTEST_SKIP() << "LibTorch " << TORCH_VERSION << " fuses nothing";
  const auto [y_views, grad_views] = AttendToProjection(/*views=*/true);
  const auto [y_copies, grad_copies] = AttendToProjection(/*views=*/false);
  EXPECT_TRUE(torch::allclose(y_views, y_copies, 1e-6, 1e-6));
  EXPECT_TRUE(torch::allclose(grad_views, grad_copies, 1e-6, 1e-6));
}

TEST(AttentionTest, TheFusedKernelEqualsTheKeptScoresToRoundingAndKeepsNoScores) {
  if (!FusedAttentionAvailable()) {
    GTEST_SKIP() << "LibTorch " << TORCH_VERSION
                 << " has no scaled_dot_product_attention with a scale (the CUDA build's has)";
  }
  {
    SCOPED_TRACE("fp32");
    ExpectClose(Attend(kFused, torch::kFloat, Precision::kFp32),
                Attend(kKept, torch::kFloat, Precision::kFp32), 1e-5);
  }
  {
    SCOPED_TRACE("fp32 inputs under bf16 autocast");
    const auto fused = Attend(kFused, torch::kFloat, Precision::kBf16);
    EXPECT_EQ(fused.y.scalar_type(), torch::kBFloat16);
    ExpectClose(fused, Attend(kKept, torch::kFloat, Precision::kBf16), 3e-2);
  }
  // One fused node, not the composite of products and a softmax that keeps the scores.
  auto q = torch::randn({2, 8, 4}).requires_grad_(true);
  const auto y = CausalAttention(q, q, q, torch::full({8, 8}, -INFINITY).triu(1), 0.5, kFused);
  auto node = y.grad_fn();  // past the view back to [B*H, T, D]
  if (node->name().find("Squeeze") != std::string::npos) node = node->next_edge(0).function;
  EXPECT_NE(node->name().find("ScaledDotProduct"), std::string::npos) << node->name();
}

}  // namespace
}  // namespace hydra::executor
