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
  t.training.optimizer = OptimizerKind::kAdamW;
  auto adam = EstimateTrialFootprint(t);
  EXPECT_EQ(adam.optimizer_bytes, adam.parameters * 8);
  t.training.optimizer = OptimizerKind::kSgd;
  auto sgd = EstimateTrialFootprint(t);
  EXPECT_EQ(sgd.optimizer_bytes, sgd.parameters * 4);
  EXPECT_GT(adam.total_bytes(), sgd.total_bytes());
  t.training.batch_size = 16;
  EXPECT_GT(EstimateTrialFootprint(t).activation_bytes, sgd.activation_bytes);
}

/// A 2-block GPT-2 of width `embd` with 4 heads.
Trial TwoBlocks(int64_t embd, int64_t context, int64_t batch) {
  Trial t;
  t.model.n_layer = 2;
  t.model.n_embd = embd;
  t.model.n_head = 4;
  t.model.context_length = context;
  t.training.batch_size = batch;
  return t;
}

TEST(CostModelTest, Bf16HalvesMostActivationsAndAddsTheWorkingCopyOfTheWeights) {
  Trial t = TwoBlocks(256, 256, 8);
  const auto fp32 = ModelLayerCosts(t, 8);
  t.training.precision = Precision::kBf16;
  const auto bf16 = ModelLayerCosts(t, 8);
  ASSERT_EQ(fp32.size(), bf16.size());
  const double tokens = 8.0 * 256, C = 256, HT = 4.0 * 256;
  // block1: (36C + 12HT) bytes a token and the bf16 copy of its 12C^2 + 13C parameters.
  EXPECT_EQ(bf16[2].activation_bytes,
            static_cast<int64_t>(tokens * (36 * C + 12 * HT) + 2 * (12 * C * C + 13 * C)));
  EXPECT_EQ(fp32[2].activation_bytes, static_cast<int64_t>(tokens * (16 * C + 2 * HT) * 4));
  // All but the attention scores nearly halve; the scores do not (the fp32 softmax beside bf16
  // copies: 12 bytes a score at its peak against fp32's 8).
  EXPECT_LT(bf16[2].activation_bytes - bf16[2].attention_bytes,
            0.7 * static_cast<double>(fp32[2].activation_bytes - fp32[2].attention_bytes));
  EXPECT_GT(bf16[2].attention_bytes, fp32[2].attention_bytes);
  for (size_t i = 0; i < bf16.size(); ++i) {
    EXPECT_EQ(bf16[i].parameters, fp32[i].parameters) << "fp32 masters: same parameters";
    EXPECT_EQ(bf16[i].output_bytes, fp32[i].output_bytes) << "the residual stream stays fp32";
  }
  // The head at its peak: the final LayerNorm's fp32 input and its output in the GEMMs' type,
  // the gradients the fused LM head and loss computes in its forward (dh [tokens, C], dw [V,
  // C], fp32), one block of the logits' gradients (all the tokens here) and a chunk's fp32
  // log-probabilities; the copy of the tied token embedding the LM head's products read (in
  // fp32 padded to LmHeadLogitsRow rows; in bf16 its bf16 copy, which it casts for the LM
  // head); in bf16 also the chunk's fp32 copy (on a CPU).
  const double V = static_cast<double>(t.model.vocab_size);
  ASSERT_EQ(LmHeadLogitsRow(t.model.vocab_size), t.model.vocab_size) << "no padding here";
  ASSERT_GE(LmHeadBlockRows(t.model.vocab_size, 2), static_cast<int64_t>(tokens));
  EXPECT_EQ(
      fp32.back().activation_bytes,
      static_cast<int64_t>(tokens * (3 * C + V) * 4 + 2 * V * C * 4 + kLmHeadChunkRows * V * 4));
  EXPECT_EQ(bf16.back().activation_bytes,
            static_cast<int64_t>(tokens * (4 * C + 2 * C + 4 * C + 2 * V) + V * C * 4 +
                                 kLmHeadChunkRows * V * 8) +
                2 * (bf16.back().parameters + bf16.front().tied_parameters));
  EXPECT_EQ(bf16.front().activation_bytes - fp32.front().activation_bytes,
            2 * (bf16.front().parameters - bf16.front().tied_parameters));
  const auto fp = EstimateTrialFootprint(t);
  EXPECT_EQ(fp.parameter_bytes, fp.parameters * 4) << "master weights stay fp32";
  EXPECT_EQ(fp.optimizer_bytes, fp.parameters * 8) << "AdamW moments stay fp32";
}

TEST(CostModelTest, ABlocksAttentionScoresAreThePartThatRecomputingThemFrees) {
  Trial t = TwoBlocks(128, 512, 2);
  const double tokens = 2.0 * 512, C = 128, HT = 4.0 * 512, T = 512;
  const auto fp32 = ModelLayerCosts(t, 2);
  // The H x T scores and probabilities per token, fp32; QK^T and PV again: 4TC FLOPs a token.
  EXPECT_EQ(fp32[1].attention_bytes, static_cast<int64_t>(tokens * 2 * HT * 4));
  EXPECT_DOUBLE_EQ(fp32[1].attention_flops, tokens * 4 * T * C);
  EXPECT_DOUBLE_EQ(fp32[1].forward_flops, tokens * (24 * C * C + 4 * T * C));
  EXPECT_LT(fp32[1].attention_bytes, fp32[1].activation_bytes);
  // bf16: the fp32 probabilities beside their bf16 copy, and while the softmax runs the bf16
  // scores and their fp32 copy: 12 bytes a score.
  t.training.precision = Precision::kBf16;
  EXPECT_EQ(ModelLayerCosts(t, 2)[1].attention_bytes, static_cast<int64_t>(tokens * 12 * HT));
  // Layers without attention have nothing to recompute.
  EXPECT_EQ(fp32.front().attention_bytes, 0);
  EXPECT_EQ(fp32.back().attention_bytes, 0);
  EXPECT_EQ(fp32.back().attention_flops, 0);
}

TEST(CostModelTest, SelectiveRecomputeFreesABlocksLayerNormAndGeluOutputs) {
  Trial t = TwoBlocks(128, 64, 2);
  const double tokens = 2.0 * 64, C = 128;
  const auto fp32 = ModelLayerCosts(t, 2);
  // Two LayerNorm outputs of C and GELU's 4C a token, fp32; again in backward at
  // kRecomputeFlopsPerValue a value.
  EXPECT_EQ(fp32[1].recomputable_bytes, static_cast<int64_t>(tokens * 6 * C * 4));
  EXPECT_DOUBLE_EQ(fp32[1].recompute_flops, tokens * 6 * C * kRecomputeFlopsPerValue);
  EXPECT_EQ(KeptActivationBytes(fp32[1], AttentionMemory::kFused, true),
            KeptActivationBytes(fp32[1], AttentionMemory::kFused) - fp32[1].recomputable_bytes);
  // Fused: 10 values of C a token kept instead of 16.
  EXPECT_EQ(KeptActivationBytes(fp32[1], AttentionMemory::kFused, true),
            static_cast<int64_t>(tokens * 10 * C * 4));
  // bf16: what the GEMMs saved were bf16 copies (2 bytes a value), and the casts of the three
  // products' weights and biases (their backward casts them again, and holds one MLP product's
  // cast and its bf16 weight gradient while it runs).
  t.training.precision = Precision::kBf16;
  const auto bf16 = ModelLayerCosts(t, 2);
  EXPECT_EQ(bf16[1].recomputable_bytes,
            static_cast<int64_t>(tokens * 12 * C + 2 * (11 * C * C + 8 * C)));
  EXPECT_EQ(bf16[1].selective_backward_bytes, static_cast<int64_t>(tokens * 24 * C + 16 * C * C));
  // Of the block's casts (2 bytes a parameter) only the attention projection's are kept.
  EXPECT_EQ(KeptActivationBytes(bf16[1], AttentionMemory::kFused, true),
            static_cast<int64_t>(tokens * 24 * C + 2 * (C * C + 5 * C)));
  // Nothing for the embedding and the head.
  EXPECT_EQ(fp32.front().recomputable_bytes, 0);
  EXPECT_EQ(fp32.back().recomputable_bytes, 0);
  EXPECT_EQ(fp32.back().recompute_flops, 0);
}

TEST(CostModelTest, Gpt2sCausalMaskIsABufferCountedOnce) {
  // One [T, T] fp32 mask every block shares, on the device all along: counted at the first.
  const Trial t = TwoBlocks(64, 128, 4);
  const auto layers = ModelLayerCosts(t, 4);
  int64_t buffers = 0;
  for (const auto& l : layers) buffers += l.buffer_bytes;
  EXPECT_EQ(buffers, 128 * 128 * 4);
  EXPECT_EQ(layers[1].buffer_bytes, buffers);
  EXPECT_EQ(EstimateTrialFootprint(t).buffer_bytes, buffers);
}

TEST(CostModelTest, TorchScriptChildrenCountWhatWasMeasuredForTheirMicroBatch) {
  Trial t;
  t.model.family = ModelFamily::kTorchScript;
  t.model.context_length = 32;
  ModuleLayer block;
  block.name = "block";
  block.parameters = 1000;
  block.output_elements = 32 * 16;
  block.buffer_bytes = 4096;
  ModuleLayer head = block;
  head.name = "head";
  head.buffer_bytes = 0;
  t.model.layers = {block, head};
  // Unmeasured: 16x the output, no transient.
  auto layers = ModelLayerCosts(t, 4);
  EXPECT_EQ(layers[0].activation_bytes, 16 * 4 * 32 * 16 * 4);
  EXPECT_EQ(layers[0].backward_bytes, 0);
  EXPECT_EQ(layers[0].buffer_bytes, 4096);
  EXPECT_EQ(layers[1].output_bytes, 4 * 32 * 16 * 4);
  // Measured: per sequence and fixed, at the micro-batch; the last child's output is the loss.
  ModuleLayer::Memory m;
  m.kept = {1000, 50};
  m.transient = {300, 7};
  for (auto& l : t.model.layers) l.memory = m;
  layers = ModelLayerCosts(t, 4);
  EXPECT_EQ(layers[0].activation_bytes, 4 * 1000 + 50);
  EXPECT_EQ(layers[0].backward_bytes, 4 * 300 + 7);
  EXPECT_EQ(layers[0].output_bytes, 4 * 32 * 16 * 4);
  EXPECT_EQ(layers[1].output_bytes, 4);
}

}  // namespace
}  // namespace hydra
