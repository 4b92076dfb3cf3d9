#include "agent/executor/gpt2.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

#include "agent/executor/executor.h"
#include "agent/executor/precision.h"
#include "common/cost_model.h"

namespace hydra::executor {
namespace {

ModelSpec Small() {
  ModelSpec m;
  m.n_layer = 2;
  m.n_embd = 32;
  m.n_head = 4;
  m.context_length = 16;
  m.vocab_size = 256;
  return m;
}

TEST(Gpt2Test, LayersAreEmbedBlocksHead) {
  auto seq = BuildGpt2(Small(), 1);
  EXPECT_EQ(seq.names, (std::vector<std::string>{"embed", "block0", "block1", "head"}));
  auto x = torch::randint(0, 256, {3, 16}, torch::kLong);
  auto logits = seq.Forward(x);
  EXPECT_EQ(logits.sizes().vec(), (std::vector<int64_t>{3, 16, 256}));
  // Shorter sequences than the context work too.
  EXPECT_EQ(seq.Forward(x.narrow(1, 0, 5)).size(1), 5);
}

TEST(Gpt2Test, ParameterCountMatchesCostModelAndHeadIsTied) {
  auto seq = BuildGpt2(Small(), 1);
  int64_t n = 0;
  for (const auto& [name, p] : seq.NamedParameters()) n += p.numel();
  int64_t expected = 0;
  for (const auto& l : ModelLayerCosts(Small(), 1)) expected += l.parameters;
  EXPECT_EQ(n, expected);
  // The head has only its LayerNorm; the projection is the embedding's wte.
  int64_t head = 0;
  for (const auto& p : seq.layers.back()->parameters()) head += p.numel();
  EXPECT_EQ(head, 2 * 32);
}

TEST(Gpt2Test, BuffersAreWhatTheCostModelCounts) {
  // The spilling executor's ledger takes the built model's buffers on the device (each tensor
  // once: the causal mask is every block's); the planner counts the cost model's buffer_bytes.
  for (const Precision precision : {Precision::kFp32, Precision::kBf16}) {
    SCOPED_TRACE(PrecisionName(precision));
    Trial t;
    t.model = Small();
    t.training.precision = precision;
    const auto seq = BuildGpt2(t.model, 1);
    std::set<const void*> seen;
    int64_t built = 0;
    for (const auto& layer : seq.layers) {
      for (const auto& b : layer->buffers()) {
        if (seen.insert(b.unsafeGetTensorImpl()).second) built += static_cast<int64_t>(b.nbytes());
      }
    }
    int64_t counted = 0;
    for (const auto& l : ModelLayerCosts(t, 1)) counted += l.buffer_bytes;
    EXPECT_GT(built, 0);
    EXPECT_EQ(counted, built);
  }
}

/// How many nodes of `out`'s autograd graph are called `name`.
int GraphNodesNamed(const torch::Tensor& out, const std::string& name) {
  std::vector<torch::autograd::Node*> todo{out.grad_fn().get()};
  std::set<torch::autograd::Node*> seen;
  int n = 0;
  while (!todo.empty()) {
    torch::autograd::Node* node = todo.back();
    todo.pop_back();
    if (node == nullptr || !seen.insert(node).second) continue;
    n += node->name() == name;
    for (const auto& e : node->next_edges()) todo.push_back(e.function.get());
  }
  return n;
}

TEST(Gpt2Test, BlocksAddTheirBiasesInTheMatrixProducts) {
  // Each of a block's four projections is one product with its bias (addmm, whose epilogue adds
  // the bias on a GPU), not a product and a broadcast add: that add took 8 ms of GPT-2
  // medium's 82 ms bf16 step on an H200.
  for (const bool selective : {false, true}) {
    auto seq = BuildGpt2(Small(), 1);
    seq.SetSelectiveRecompute(selective);
    auto x = torch::randint(0, 256, {3, 16}, torch::kLong);
    const auto h = seq.layers[2]->forward(seq.layers[1]->forward(seq.layers[0]->forward(x)));
    // Selective recompute: only proj is a plain product (qkv, fc and fc_proj run in custom
    // functions that call torch::linear too).
    EXPECT_EQ(GraphNodesNamed(h, "AddmmBackward0"), selective ? 2 : 8) << selective;
  }
}

TEST(Gpt2Test, FusedAttentionComputesTheSameModel) {
  // The fused path hands the kernel views of the qkv projection's heads ([B, H, T, D]) where the
  // others fold the heads into the batch: the same logits and gradients to rounding.
  if (!FusedAttentionAvailable()) GTEST_SKIP() << "LibTorch " << TORCH_VERSION << " fuses nothing";
  auto run = [](AttentionMemory how) {
    auto seq = BuildGpt2(Small(), 11);
    seq.SetAttention(how);
    torch::manual_seed(2);
    auto x = torch::randint(0, 256, {3, 16}, torch::kLong);
    auto logits = seq.Forward(x);
    logits.pow(2).mean().backward();
    std::vector<torch::Tensor> out{logits.detach()};
    for (const auto& [name, p] : seq.NamedParameters()) out.push_back(p.grad());
    return out;
  };
  const auto fused = run(AttentionMemory::kFused), kept = run(AttentionMemory::kKept);
  ASSERT_EQ(fused.size(), kept.size());
  for (size_t i = 0; i < fused.size(); ++i) {
    EXPECT_TRUE(torch::allclose(fused[i], kept[i], 1e-4, 1e-5))
        << i << ": largest difference " << (fused[i] - kept[i]).abs().max().item<double>();
  }
}

TEST(Gpt2Test, SelectiveRecomputeComputesTheSameModel) {
  // Blocks that recompute their LayerNorm and GELU outputs in backward: the same logits and
  // gradients to rounding, in fp32 and under bf16 autocast, with the scores kept and fused.
  for (const Precision precision : {Precision::kFp32, Precision::kBf16}) {
    SCOPED_TRACE(PrecisionName(precision));
    for (const AttentionMemory how : {AttentionMemory::kKept, AttentionMemory::kFused}) {
      if (how == AttentionMemory::kFused && !FusedAttentionAvailable()) continue;
      auto run = [&](bool selective) {
        auto seq = BuildGpt2(Small(), 11);
        seq.SetAttention(how);
        seq.SetSelectiveRecompute(selective);
        torch::manual_seed(2);
        auto x = torch::randint(0, 256, {3, 16}, torch::kLong);
        torch::Tensor logits;
        {
          PrecisionScope scope(precision, torch::kCPU);
          logits = seq.Forward(x);
        }
        logits.to(torch::kFloat).pow(2).mean().backward();
        std::vector<torch::Tensor> out{logits.detach().to(torch::kFloat)};
        for (const auto& [name, p] : seq.NamedParameters()) out.push_back(p.grad());
        return out;
      };
      const auto selective = run(true), kept = run(false);
      ASSERT_EQ(selective.size(), kept.size());
      const double tol = precision == Precision::kFp32 ? 1e-5 : 2e-2;
      EXPECT_TRUE(torch::equal(selective[0], kept[0]));  // the forward is the same computation
      for (size_t i = 1; i < selective.size(); ++i) {
        EXPECT_TRUE(torch::allclose(selective[i], kept[i], tol, tol))
            << i << ": largest difference " << (selective[i] - kept[i]).abs().max().item<double>();
      }
    }
  }
}

TEST(Gpt2Test, CausalFutureTokensDoNotChangeEarlierLogits) {
  auto seq = BuildGpt2(Small(), 7);
  torch::NoGradGuard g;
  auto x = torch::randint(0, 256, {2, 16}, torch::kLong);
  auto base = seq.Forward(x);
  for (int64_t pos : {0, 5, 15}) {
    auto y = x.clone();
    y.index_put_({torch::indexing::Slice(), pos},
                 (y.index({torch::indexing::Slice(), pos}) + 1) % 256);
    auto out = seq.Forward(y);
    // Positions before `pos` are identical; position `pos` itself changes.
    if (pos > 0) {
      EXPECT_TRUE(torch::equal(out.narrow(1, 0, pos), base.narrow(1, 0, pos))) << pos;
    }
    EXPECT_FALSE(torch::allclose(out.narrow(1, pos, 1), base.narrow(1, pos, 1))) << pos;
  }
}

TEST(Gpt2Test, InitIsDeterministicAndFollowsGpt2) {
  ModelSpec m = Small();
  m.n_layer = 8;
  m.n_embd = 256;
  auto a = BuildGpt2(m, 3), b = BuildGpt2(m, 3), c = BuildGpt2(m, 4);
  auto pa = a.NamedParameters(), pb = b.NamedParameters(), pc = c.NamedParameters();
  ASSERT_EQ(pa.size(), pb.size());
  bool any_diff = false;
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_TRUE(torch::equal(pa[i].second, pb[i].second)) << pa[i].first;
    any_diff = any_diff || !torch::equal(pa[i].second, pc[i].second);
  }
  EXPECT_TRUE(any_diff);
  for (const auto& [name, p] : pa) {
    if (name == "block0.qkv.weight" || name == "embed.wte") {
      EXPECT_NEAR(p.std().item<double>(), 0.02, 0.001) << name;
    }
    if (name == "block0.fc_proj.weight") {
      EXPECT_NEAR(p.std().item<double>(), 0.02 / std::sqrt(16.0), 0.0005) << name;
    }
    if (name == "block0.qkv.bias") {
      EXPECT_EQ(p.abs().sum().item<double>(), 0.0);
    }
  }
}

}  // namespace
}  // namespace hydra::executor
