#include "agent/executor/gpt2.h"

#include <cmath>

#include "agent/executor/attention.h"
#include "agent/executor/lm_head_loss.h"
#include "agent/executor/precision.h"
#include "agent/executor/selective_recompute.h"

namespace hydra::executor {
namespace {

class Gpt2Embedding : public SequentialLayer {
 public:
  Gpt2Embedding(int64_t vocab, int64_t context, int64_t width) {
    wte = register_parameter("wte", torch::empty({vocab, width}));
    wpe = register_parameter("wpe", torch::empty({context, width}));
  }
  torch::Tensor forward(const torch::Tensor& idx) override {
    const int64_t t = idx.size(1);
    return torch::embedding(wte, idx) + wpe.narrow(0, 0, t);
  }
  std::vector<torch::Tensor> lent_parameters() const override { return {wte}; }
  torch::Tensor wte, wpe;
};

class Gpt2Block : public SequentialLayer {
 public:
  /// `mask`: the additive causal mask [context, context] (0 on and below the diagonal, -inf
  /// above), one tensor shared by every block of a model.
  Gpt2Block(int64_t width, int64_t heads, const torch::Tensor& mask) : heads_(heads) {
    ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})));
    qkv = register_module("qkv", torch::nn::Linear(width, 3 * width));
    proj = register_module("proj", torch::nn::Linear(width, width));
    ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})));
    fc = register_module("fc", torch::nn::Linear(width, 4 * width));
    fc_proj = register_module("fc_proj", torch::nn::Linear(4 * width, width));
    mask_ = register_buffer("mask", mask);
  }

  torch::Tensor forward(const torch::Tensor& x) override {
    const int64_t B = x.size(0), T = x.size(1), C = x.size(2), D = C / heads_;
    auto parts = LinearAfter(ln1, x, qkv).split(C, /*dim=*/2);
    // Fused: [B, H, T, D] views of the projection's output, as the fused kernels take them
    // (no copies), whose output, laid out [B, T, H, D], is proj's input without a copy too, and
    // backward keeps it once. Otherwise [B*H, T, D]: heads folded into the batch for the
    // batched GEMMs.
    const bool fused = attention_ == AttentionMemory::kFused;
    auto heads = [&](const torch::Tensor& t) {
      auto h = t.view({B, T, heads_, D}).transpose(1, 2);
      return fused ? h : h.reshape({B * heads_, T, D});
    };
    auto y = CausalAttention(heads(parts[0]), heads(parts[1]), heads(parts[2]),
                             mask_.narrow(0, 0, T).narrow(1, 0, T),
                             1.0 / std::sqrt(static_cast<double>(D)), attention_)
                 .view({B, heads_, T, D})
                 .transpose(1, 2)
                 .reshape({B, T, C});
    auto h = x + Affine(proj, y);
    const torch::Tensor hidden = LinearAfter(ln2, h, fc);
    if (!selective_) return h + Affine(fc_proj, torch::gelu(hidden, "tanh"));
    return h + LinearOfRecomputed(Recomputed::kGeluTanh, hidden, {}, {}, 0, fc_proj->weight,
                                  fc_proj->bias);
  }

  void set_attention(AttentionMemory how) override { attention_ = how; }
  void set_selective_recompute(bool on) override { selective_ = on; }

  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  torch::nn::Linear qkv{nullptr}, proj{nullptr}, fc{nullptr}, fc_proj{nullptr};

 private:
  /// ATen's linear: one matrix product with the bias added in its epilogue (under autocast, all
  /// three in bf16), where the C++ frontend's Linear::forward multiplies a [B, T, C] input and
  /// then adds the bias as a second kernel (in bf16, an fp32 bias broadcast into the bf16
  /// product: 8 ms of GPT-2 medium's 82 ms bf16 step on an H200).
  static torch::Tensor Affine(const torch::nn::Linear& linear, const torch::Tensor& x) {
    return torch::linear(x, linear->weight, linear->bias);
  }

  /// linear(ln(x)); with selective recompute, keeping x rather than ln's output for backward.
  torch::Tensor LinearAfter(torch::nn::LayerNorm& ln, const torch::Tensor& x,
                            torch::nn::Linear& linear) {
    if (!selective_) return Affine(linear, ln->forward(x));
    return LinearOfRecomputed(Recomputed::kLayerNorm, x, ln->weight, ln->bias, ln->options.eps(),
                              linear->weight, linear->bias);
  }

  int64_t heads_;
  AttentionMemory attention_ = AttentionMemory::kKept;
  bool selective_ = false;
  torch::Tensor mask_;
};

class Gpt2Head : public SequentialLayer {
 public:
  Gpt2Head(int64_t width, torch::Tensor tied_wte) : wte_(std::move(tied_wte)) {
    ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})));
  }
  torch::Tensor forward(const torch::Tensor& x) override {
    return torch::matmul(ln_f->forward(x), wte_.t());
  }
  torch::Tensor forward_loss(const torch::Tensor& x, const torch::Tensor& target) override {
    const auto h = ln_f->forward(x);
    return LmHeadLoss(h.reshape({-1, h.size(-1)}), wte_, target.reshape({-1}),
                      ActiveComputeType(h.device().type()));
  }
  std::vector<torch::Tensor> borrowed_parameters() const override { return {wte_}; }
  torch::nn::LayerNorm ln_f{nullptr};

 private:
  torch::Tensor wte_;  // owned (registered) by the embedding layer
};

}  // namespace

LayerSequence BuildGpt2(const ModelSpec& spec, uint64_t seed,
                        const std::function<void(const LayerSequence&, size_t)>& on_layer_built) {
  torch::NoGradGuard no_grad;
  auto gen = at::detail::createCPUGenerator(seed);
  const double std_dev = 0.02;
  const double proj_std = 0.02 / std::sqrt(2.0 * static_cast<double>(spec.n_layer));
  LayerSequence seq;
  auto embed = std::make_shared<Gpt2Embedding>(spec.vocab_size, spec.context_length, spec.n_embd);
  embed->wte.normal_(0.0, std_dev, gen);
  embed->wpe.normal_(0.0, std_dev, gen);
  auto built = [&]() {
    if (on_layer_built) on_layer_built(seq, seq.layers.size() - 1);
  };
  seq.names.push_back("embed");
  seq.layers.push_back(embed);
  built();
  // One mask for every block: a model moved to a GPU carries one copy, not one per block.
  const auto mask = torch::full({spec.context_length, spec.context_length}, -INFINITY).triu(1);
  for (int64_t i = 0; i < spec.n_layer; ++i) {
    auto block = std::make_shared<Gpt2Block>(spec.n_embd, spec.n_head, mask);
    for (auto* lin : {&block->qkv, &block->proj, &block->fc, &block->fc_proj}) {
      const bool residual = lin == &block->proj || lin == &block->fc_proj;
      (*lin)->weight.normal_(0.0, residual ? proj_std : std_dev, gen);
      (*lin)->bias.zero_();
    }
    seq.names.push_back("block" + std::to_string(i));
    seq.layers.push_back(block);
    built();
  }
  seq.names.push_back("head");
  seq.layers.push_back(std::make_shared<Gpt2Head>(spec.n_embd, embed->wte));
  built();
  return seq;
}

}  // namespace hydra::executor
