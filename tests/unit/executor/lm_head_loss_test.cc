// The chunked LM-head loss equals log-softmax cross-entropy over the full logits, in value and
// in gradients, in fp32 and (within bf16's precision) in bf16.
#include "agent/executor/lm_head_loss.h"

#include <gtest/gtest.h>

#include "common/cost_model.h"

namespace hydra::executor {
namespace {

struct Result {
  torch::Tensor loss, dh, dw;
};

Result Train(bool fused, torch::ScalarType compute, int64_t rows, double grad_scale,
             int64_t vocab = 1000, int64_t width = 48) {
  torch::manual_seed(3);
  auto h = torch::randn({rows, width}).requires_grad_(true);
  auto w = (0.3 * torch::randn({vocab, width})).requires_grad_(true);
  const auto targets = torch::randint(0, vocab, {rows}, torch::kLong);
  torch::Tensor loss;
  if (fused) {
    loss = LmHeadLoss(h, w, targets, compute);
  } else {
    const auto logits = torch::mm(h.to(compute), w.to(compute).t()).to(torch::kFloat);
    loss = torch::nn::functional::cross_entropy(logits, targets);
  }
  (loss * grad_scale).backward();
  return {loss.detach(), h.grad(), w.grad()};
}

double RelativeError(const torch::Tensor& got, const torch::Tensor& want) {
  return ((got - want).norm() / want.norm()).item<double>();
}

TEST(LmHeadLossTest, EqualsCrossEntropyOverTheFullLogitsInFp32) {
  // 600 rows: two whole chunks of 256 and a partial one.
  for (double scale : {1.0, 0.5}) {
    const Result fused = Train(true, torch::kFloat, 600, scale);
    const Result full = Train(false, torch::kFloat, 600, scale);
    EXPECT_EQ(fused.loss.scalar_type(), torch::kFloat);
    EXPECT_NEAR(fused.loss.item<double>(), full.loss.item<double>(),
                1e-6 * full.loss.item<double>());
    EXPECT_LT(RelativeError(fused.dh, full.dh), 1e-5) << "scale " << scale;
    EXPECT_LT(RelativeError(fused.dw, full.dw), 1e-5) << "scale " << scale;
    EXPECT_EQ(fused.dw.scalar_type(), torch::kFloat);
  }
}

TEST(LmHeadLossTest, Bf16GemmsWithFp32LossAndFp32Gradients) {
  const Result fused = Train(true, torch::kBFloat16, 300, 1.0);
  const Result fp32 = Train(false, torch::kFloat, 300, 1.0);
  const Result bf16 = Train(false, torch::kBFloat16, 300, 1.0);
  EXPECT_EQ(fused.dh.scalar_type(), torch::kFloat) << "gradients in the masters' type";
  EXPECT_EQ(fused.dw.scalar_type(), torch::kFloat);
  EXPECT_NEAR(fused.loss.item<double>(), bf16.loss.item<double>(), 1e-5 * bf16.loss.item<double>())
      << "the same bf16 logits, the same fp32 reduction";
  EXPECT_NEAR(fused.loss.item<double>(), fp32.loss.item<double>(), 1e-2 * fp32.loss.item<double>());
  EXPECT_LT(RelativeError(fused.dh, fp32.dh), 2e-2);
  EXPECT_LT(RelativeError(fused.dw, fp32.dw), 2e-2);
  EXPECT_GT(RelativeError(fused.dw, fp32.dw), 0) << "computed in bf16";
}

TEST(LmHeadLossTest, GradientsGatheredBlockByBlockOnGpt2sVocabulary) {
  // GPT-2's vocabulary: blocks of 256 rows in fp32 and 512 in bf16 (64 MiB of the logits'
  // gradients), so 600 rows make three blocks and two: dh row by row and dw summed over them
  // equal the full logits' gradients.
  const int64_t vocab = 50257, rows = 600;
  ASSERT_EQ(LmHeadLogitsRow(vocab), 50304);  // rows padded for cuBLAS
  ASSERT_EQ(LmHeadBlockRows(vocab, 4), 256);
  ASSERT_EQ(LmHeadBlockRows(vocab, 2), 512);
  const Result full = Train(false, torch::kFloat, rows, 1.0, vocab, 16);
  const Result fused = Train(true, torch::kFloat, rows, 1.0, vocab, 16);
  EXPECT_NEAR(fused.loss.item<double>(), full.loss.item<double>(), 1e-6 * full.loss.item<double>());
  EXPECT_LT(RelativeError(fused.dh, full.dh), 1e-5);
  EXPECT_LT(RelativeError(fused.dw, full.dw), 1e-5);
  const Result bf16 = Train(true, torch::kBFloat16, rows, 1.0, vocab, 16);
  const Result bf16_full = Train(false, torch::kBFloat16, rows, 1.0, vocab, 16);
  EXPECT_NEAR(bf16.loss.item<double>(), bf16_full.loss.item<double>(),
              1e-5 * bf16_full.loss.item<double>());
  EXPECT_LT(RelativeError(bf16.dh, full.dh), 2e-2);
  EXPECT_LT(RelativeError(bf16.dw, full.dw), 2e-2);
}

TEST(LmHeadLossTest, WithoutGradientsOnlyTheLoss) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(4);
  // A parameter requires grad even in evaluation: only the loss is computed all the same.
  const auto h = torch::randn({10, 8}), w = torch::randn({50, 8}).requires_grad_(true);
  const auto targets = torch::randint(0, 50, {10}, torch::kLong);
  const auto want = torch::nn::functional::cross_entropy(torch::mm(h, w.t()), targets);
  const auto got = LmHeadLoss(h, w, targets, torch::kFloat);
  EXPECT_FALSE(got.requires_grad());
  EXPECT_NEAR(got.item<double>(), want.item<double>(), 1e-5);
}

}  // namespace
}  // namespace hydra::executor
