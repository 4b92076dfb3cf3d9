#include "common/cost_model.h"

#include <algorithm>
#include <cstdio>

namespace hydra {

namespace {

constexpr double kMaxAccounted = static_cast<double>(kMaxAccountedQuantity);

/// Turns the formulas' doubles (exact integers below 2^53) into int64 quantities, clamping at
/// kMaxAccountedQuantity and remembering the first that was over it.
class Accountant {
 public:
  /// A count of parameters (too many: the model itself is too large).
  int64_t Parameters(double v, const std::string& layer) {
    return Take(v, layer, "parameters", "", "spec.model");
  }
  /// Bytes of one micro-batch (too many: the micro-batch or the model is too large).
  int64_t Bytes(double v, const std::string& layer, const char* what) {
    return Take(v, layer, what, " bytes", "spec.training.batchSize");
  }
  const std::optional<FieldError>& error() const { return error_; }

 private:
  int64_t Take(double v, const std::string& layer, const char* what, const char* unit,
               const char* field) {
    if (v <= kMaxAccounted) return static_cast<int64_t>(v);
    if (!error_) {
      char number[32];
      std::snprintf(number, sizeof(number), "%.3g", v);
      error_ = FieldError{field,
                          "the model is too large to account: " + layer + "'s " + what +
                              " would be " + number + unit + ", more than 2^50 (1 PiB)" +
                              " (make the model, batchSize / gradientAccumulationSteps or "
                              "contextLength smaller)",
                          -1};
    }
    return kMaxAccountedQuantity;
  }
  std::optional<FieldError> error_;
};

/// A TorchScript model's children as measured at load time (executor::ResolveModel): what each
/// child's forward keeps and its forward or backward allocates besides, measured on the CPU
/// (ModuleLayer::memory). A child not measured is estimated as kSavedPerOutput times its output
/// (a transformer block keeps about 16x its output per token plus its attention scores, which
/// that misses; an MLP layer 2-3x).
std::vector<LayerCost> ModuleLayerCosts(const ModelSpec& m, int64_t micro_batch, Accountant& a) {
  constexpr double kSavedPerOutput = 16;
  std::vector<LayerCost> layers;
  for (const auto& l : m.layers) {
    LayerCost c;
    c.name = l.name;
    c.parameters = l.parameters;
    c.tied_parameters = l.tied_parameters;
    const double out =
        static_cast<double>(micro_batch) * static_cast<double>(l.output_elements) * 4;
    c.output_bytes = a.Bytes(out, l.name, "output");
    c.activation_bytes = a.Bytes(kSavedPerOutput * out, l.name, "activations");
    c.buffer_bytes = l.buffer_bytes;
    if (l.memory) {
      const auto bytes = [&](const ModuleLayer::Bytes& b) {
        return static_cast<double>(b.per_sequence) * static_cast<double>(micro_batch) +
               static_cast<double>(b.fixed);
      };
      c.activation_bytes = a.Bytes(bytes(l.memory->kept), l.name, "activations");
      c.backward_bytes = a.Bytes(bytes(l.memory->transient), l.name, "activations");
      // The last child was measured with the loss: its logits are part of its transient, and
      // a last shard's output is the loss.
      if (&l == &m.layers.back()) c.output_bytes = 4;
    }
    // A dense layer: 2 FLOPs per parameter per token.
    c.forward_flops = 2.0 * static_cast<double>(l.parameters) * static_cast<double>(micro_batch) *
                      static_cast<double>(m.context_length);
    layers.push_back(c);
  }
  return layers;
}

std::vector<LayerCost> GptCosts(const ModelSpec& m, int64_t micro_batch, Precision precision,
                                Accountant& a) {
  const double B = static_cast<double>(micro_batch), T = static_cast<double>(m.context_length),
               C = static_cast<double>(m.n_embd), H = static_cast<double>(m.n_head),
               V = static_cast<double>(m.vocab_size);
  const double tokens = B * T;
  const double f = 4;  // fp32
  std::vector<LayerCost> layers;
  LayerCost embed;
  embed.name = "embed";
  embed.parameters = a.Parameters(V * C + T * C, embed.name);
  embed.tied_parameters = a.Parameters(V * C, embed.name);
  embed.activation_bytes = a.Bytes(tokens * 8, embed.name, "activations");  // token ids
  embed.output_bytes = a.Bytes(tokens * C * f, embed.name, "output");
  embed.forward_flops = tokens * C;
  embed.backward_bytes = a.Bytes(V * C * f, embed.name, "activations");  // dense, fp32
  layers.push_back(embed);
  for (int64_t i = 0; i < m.n_layer; ++i) {
    LayerCost b;
    b.name = "block" + std::to_string(i);
    b.parameters = a.Parameters(12 * C * C + 13 * C, b.name);
    // Saved for backward per token: layer-norm inputs/outputs, qkv, attention output,
    // projections, the MLP's 4C hidden twice (pre/post GELU), plus attention probabilities
    // (H x T) and the scores they come from (H x T, alive while the softmax runs).
    // In bf16 the residual stream and LayerNorm inputs stay fp32 (8C bytes), the GEMMs' inputs
    // and the MLP's hidden are bf16 (14C values, 28C bytes); the softmax output stays fp32 next
    // to its bf16 copy for the GEMM (6 bytes per score), and while the softmax runs its bf16
    // scores and, under CUDA's autocast, their fp32 copy are alive too (6 more: on an H200 the
    // allocator's peak passed a ledger without them by about that, one block's worth).
    const bool bf16 = precision == Precision::kBf16;
    b.activation_bytes = bf16 ? a.Bytes(tokens * (36 * C + 12 * H * T), b.name, "activations")
                              : a.Bytes(tokens * (16 * C + 2 * H * T) * f, b.name, "activations");
    b.attention_bytes = a.Bytes(tokens * H * T * (bf16 ? 12 : 2 * f), b.name, "attention scores");
    b.output_bytes = a.Bytes(tokens * C * f, b.name, "output");
    b.attention_flops = tokens * 4.0 * T * C;
    b.forward_flops = tokens * 2.0 * 12 * C * C + b.attention_flops;
    // Selective recompute: the two LayerNorms' outputs (C each; in bf16 their bf16 copies for
    // the GEMMs) and GELU's output (4C, in bf16 bf16 too) are not kept, nor in bf16 the casts
    // of the three products' weights and biases (11C^2 + 8C values; their backward casts again):
    // of the 2 bytes a parameter TrialCosts counts for bf16's casts, only the attention
    // projection's stay (device_memory_test measures it).
    b.recomputable_bytes =
        a.Bytes(tokens * 6 * C * (bf16 ? 2 : f) + (bf16 ? 2 * (11 * C * C + 8 * C) : 0), b.name,
                "activations");
    b.recompute_flops = tokens * 6.0 * C * kRecomputeFlopsPerValue;
    // What the backward allocates beyond that (BackwardTransientBytes), as measured on the CPU:
    // the MLP's two 4C gradients (fp32 32C bytes a token; bf16 16C, and a C-wide one), in fp32
    // one H x T gradient of the scores more than kept, with selective recompute its values again
    // and in bf16 an MLP product's weight cast again and its weight gradient in bf16 before the
    // fp32 copy (2 x 8C^2 bytes).
    b.backward_bytes = a.Bytes(tokens * C * (bf16 ? 18 : 32), b.name, "activations");
    b.score_gradient_bytes = bf16 ? 0 : a.Bytes(tokens * H * T * f, b.name, "attention scores");
    b.selective_backward_bytes =
        a.Bytes(tokens * C * (bf16 ? 24 : 32) + (bf16 ? 16 * C * C : 0), b.name, "activations");
    // The additive causal mask [T, T] in fp32, one tensor every block shares.
    if (i == 0) b.buffer_bytes = a.Bytes(T * T * f, b.name, "buffers");
    layers.push_back(b);
  }
  LayerCost head;
  head.name = "head";
  head.parameters = a.Parameters(2 * C, head.name);  // final LayerNorm; the LM head is tied
  // The fused LM head and loss (agent/executor/lm_head_loss) at its peak, in its forward: the
  // final LayerNorm's input (fp32, kept for backward) and its output in the GEMMs' type, the
  // gradients it computes there and keeps for backward (dh [tokens, C] and dw [V, C], fp32;
  // V padded to LmHeadLogitsRow, as the weights' copy in the GEMMs' type the products read),
  // one block of the logits' gradients in the GEMMs' type (the chunks' logits are computed in
  // place there) and one chunk's fp32 log-probabilities (in bf16 on a CPU also the chunk's
  // fp32 copy that LibTorch's log-softmax makes there: 8 bytes a logit; a GPU's reads bf16).
  const double gemm = precision == Precision::kBf16 ? 2 : f;
  const double block = std::min<double>(
      tokens, static_cast<double>(LmHeadBlockRows(m.vocab_size, static_cast<int64_t>(gemm))));
  const double chunk = std::min<double>(tokens, static_cast<double>(kLmHeadChunkRows));
  const double row = static_cast<double>(LmHeadLogitsRow(m.vocab_size));  // padded logits
  // The weights' padded copy: in fp32 all of it; in bf16 the padding's rows (the tied
  // embedding's bf16 working copy counts the rest).
  const double copy = gemm < f ? (row - V) * C * gemm : row * C * f;
  head.activation_bytes = a.Bytes(tokens * (C * f + C * gemm + C * 4) + row * C * 4 + copy +
                                      block * row * gemm + chunk * row * (gemm < f ? 2 * f : f),
                                  head.name, "activations");
  // Its output is the loss: the fused head never holds the [tokens, V] logits (in training and
  // evaluation alike, LayersLoss), so a last shard's boundary does not count them.
  head.output_bytes = 4;
  head.forward_flops = tokens * 2.0 * C * V;
  layers.push_back(head);
  return layers;
}

std::vector<LayerCost> ModelCosts(const ModelSpec& m, int64_t micro_batch, Precision precision,
                                  Accountant& a) {
  if (m.family == ModelFamily::kTorchScript) return ModuleLayerCosts(m, micro_batch, a);
  return GptCosts(m, micro_batch, precision, a);
}

/// What an image layer's backward allocates per parameter while it runs: its gradients (fp32),
/// in bf16 first in bf16 (autocast's copies of the weights) and then cast to fp32.
double WeightGradientBytes(Precision precision) { return precision == Precision::kBf16 ? 6 : 4; }

std::vector<LayerCost> MlpCosts(const ModelSpec& m, const std::vector<int64_t>& shape, int64_t B,
                                Precision precision, Accountant& a) {
  const double grad = WeightGradientBytes(precision);
  const double pixels =
      static_cast<double>(shape[0]) * static_cast<double>(shape[1]) * static_cast<double>(shape[2]);
  const double W = static_cast<double>(m.n_embd), K = static_cast<double>(m.num_classes);
  const double batch = static_cast<double>(B);
  std::vector<LayerCost> layers;
  auto dense = [&](const std::string& name, double in, double out, bool relu) {
    LayerCost c;
    c.name = name;
    c.parameters = a.Parameters(in * out + out, name);
    // Input, pre/post ReLU.
    c.activation_bytes = a.Bytes(batch * (in + (relu ? 2 * out : out)) * 4, name, "activations");
    c.output_bytes = a.Bytes(batch * out * 4, name, "output");
    c.forward_flops = 2.0 * batch * in * out;
    // Its weights' new gradients and those of its input and pre-ReLU output (measured on the
    // CPU: device_memory_test).
    c.backward_bytes =
        a.Bytes((in * out + out) * grad + batch * (in + out) * 4, name, "activations");
    layers.push_back(c);
  };
  dense("input", pixels, W, true);
  for (int64_t i = 0; i < m.n_layer; ++i) dense("hidden" + std::to_string(i), W, W, true);
  dense("head", W, K, false);
  return layers;
}

std::vector<LayerCost> ResNetCosts(const ModelSpec& m, const std::vector<int64_t>& shape,
                                   int64_t micro_batch, Precision precision, Accountant& a) {
  const double grad = WeightGradientBytes(precision);
  // Channels double every third block: a deep enough ResNet is too wide for int64, so
  // everything is counted in double and checked by the accountant.
  const double B = static_cast<double>(micro_batch), in_channels = static_cast<double>(shape[0]);
  double width = static_cast<double>(m.n_embd);
  int64_t h = shape[1], w = shape[2];
  auto area = [&] { return static_cast<double>(h) * static_cast<double>(w); };
  std::vector<LayerCost> layers;
  LayerCost stem;
  stem.name = "stem";
  stem.parameters = a.Parameters(9 * in_channels * width + 2 * width, stem.name);
  const double stem_out = B * width * area() * 4;
  stem.output_bytes = a.Bytes(stem_out, stem.name, "output");
  stem.activation_bytes =
      a.Bytes(B * in_channels * area() * 4 + 3 * stem_out, stem.name, "activations");
  stem.forward_flops = 2.0 * 9 * B * in_channels * width * area();
  // A layer's backward holds its weights' new gradients and, at its peak, two of its input's
  // and of its output's sizes (the convolutions', GroupNorms' and ReLUs' gradients; measured on
  // the CPU: device_memory_test).
  auto backward = [&](double parameters, double in_bytes, double out_bytes, const std::string& n) {
    return a.Bytes(parameters * grad + 2 * (in_bytes + out_bytes), n, "activations");
  };
  stem.backward_bytes = backward(static_cast<double>(stem.parameters), B * in_channels * area() * 4,
                                 stem_out, stem.name);
  layers.push_back(stem);
  for (int64_t i = 0; i < m.n_layer; ++i) {
    const bool down = i % 3 == 2;
    const double out = down ? 2 * width : width;
    const double in_bytes = B * width * area() * 4;
    if (down) h = (h + 1) / 2, w = (w + 1) / 2;
    LayerCost b;
    b.name = "block" + std::to_string(i);
    b.parameters =
        a.Parameters(9 * width * out + 9 * out * out + 4 * out + (down ? width * out : 0), b.name);
    const double out_bytes = B * out * area() * 4;
    b.output_bytes = a.Bytes(out_bytes, b.name, "output");
    // Input, two convolutions, two GroupNorms, two ReLUs and the sum (+ the shortcut).
    b.activation_bytes =
        a.Bytes(in_bytes + (7 + (down ? 1 : 0)) * out_bytes, b.name, "activations");
    b.forward_flops = 2.0 * 9 * B * (width * out + out * out) * area() +
                      (down ? 2.0 * B * width * out * area() : 0.0);
    b.backward_bytes = backward(static_cast<double>(b.parameters), in_bytes, out_bytes, b.name);
    layers.push_back(b);
    width = out;
  }
  const double K = static_cast<double>(m.num_classes);
  LayerCost head;
  head.name = "head";
  head.parameters = a.Parameters(width * K + K, head.name);
  head.activation_bytes = a.Bytes(B * (width * area() + width) * 4, head.name, "activations");
  head.output_bytes = a.Bytes(B * K * 4, head.name, "output");
  head.forward_flops = B * width * area() + 2.0 * B * width * K;
  head.backward_bytes =
      backward(static_cast<double>(head.parameters), B * width * area() * 4, B * K * 4, head.name);
  layers.push_back(head);
  return layers;
}

std::vector<LayerCost> FamilyCosts(const Trial& trial, int64_t micro_batch, Accountant& a) {
  const auto& shape = trial.dataset.image_shape;
  if (shape.size() == 3 && trial.model.family == ModelFamily::kMlp) {
    return MlpCosts(trial.model, shape, micro_batch, trial.training.precision, a);
  }
  if (shape.size() == 3 && trial.model.family == ModelFamily::kResNet) {
    return ResNetCosts(trial.model, shape, micro_batch, trial.training.precision, a);
  }
  return ModelCosts(trial.model, micro_batch, trial.training.precision, a);
}

/// In bf16 each layer's graph also holds the bf16 working copy of its weights (2 bytes a
/// parameter) for every micro-batch in flight, next to the fp32 masters; tied weights are
/// charged to the last layer, whose LM head casts them (the embedding looks them up in fp32).
std::vector<LayerCost> TrialCosts(const Trial& trial, int64_t micro_batch, Accountant& a) {
  auto layers = FamilyCosts(trial, micro_batch, a);
  if (trial.training.precision != Precision::kBf16 || layers.empty()) return layers;
  double tied = 0;
  for (auto& l : layers) {
    tied += static_cast<double>(l.tied_parameters);
    l.activation_bytes = a.Bytes(static_cast<double>(l.activation_bytes) +
                                     2.0 * static_cast<double>(l.parameters - l.tied_parameters),
                                 l.name, "activations");
  }
  auto& last = layers.back();
  last.activation_bytes =
      a.Bytes(static_cast<double>(last.activation_bytes) + 2.0 * tied, last.name, "activations");
  return layers;
}

int64_t MicroBatch(const TrainingSpec& t) {
  return t.batch_size / std::max<int64_t>(1, t.gradient_accumulation_steps);
}

}  // namespace

std::vector<LayerCost> ModelLayerCosts(const ModelSpec& m, int64_t micro_batch) {
  Accountant a;
  return ModelCosts(m, micro_batch, Precision::kFp32, a);
}

std::vector<LayerCost> ModelLayerCosts(const Trial& trial, int64_t micro_batch) {
  Accountant a;
  return TrialCosts(trial, micro_batch, a);
}

int64_t OptimizerBytesPerParameter(const TrainingSpec& training) {
  if (training.optimizer == OptimizerKind::kAdamW) return 8;
  return training.momentum > 0 ? 4 : 0;
}

const char* AttentionMemoryName(AttentionMemory a) {
  switch (a) {
    case AttentionMemory::kKept: return "kept";
    case AttentionMemory::kRecomputed: return "recomputed";
    case AttentionMemory::kFused: return "fused";
  }
  return "?";
}

int64_t KeptActivationBytes(const LayerCost& l, AttentionMemory a, bool selective) {
  const int64_t kept =
      a == AttentionMemory::kKept ? l.activation_bytes : l.activation_bytes - l.attention_bytes;
  return selective ? kept - l.recomputable_bytes : kept;
}

int64_t AttentionTransientBytes(const LayerCost& l, AttentionMemory a) {
  if (l.attention_bytes == 0) return 0;
  switch (a) {
    case AttentionMemory::kKept: return l.score_gradient_bytes;
    case AttentionMemory::kRecomputed: return l.attention_bytes + l.score_gradient_bytes;
    case AttentionMemory::kFused: return l.output_bytes;
  }
  return 0;
}

int64_t BackwardTransientBytes(const LayerCost& l, AttentionMemory a, bool selective) {
  return std::max(AttentionTransientBytes(l, a), l.backward_bytes) +
         (selective ? l.selective_backward_bytes : 0);
}

TrialFootprint EstimateTrialFootprint(const Trial& trial, AttentionMemory attention) {
  TrialFootprint fp;
  int64_t transient = 0;
  for (const auto& l : ModelLayerCosts(trial, MicroBatch(trial.training))) {
    fp.parameters += l.parameters;
    fp.activation_bytes += KeptActivationBytes(l, attention);
    fp.buffer_bytes += l.buffer_bytes;
    transient = std::max(transient, BackwardTransientBytes(l, attention, false));
  }
  fp.activation_bytes += transient;
  fp.parameter_bytes = fp.parameters * 4;
  fp.gradient_bytes = fp.parameters * 4;
  fp.optimizer_bytes = fp.parameters * OptimizerBytesPerParameter(trial.training);
  return fp;
}

std::optional<FieldError> CostModelLimitError(const Trial& trial) {
  Accountant a;
  double parameters = 0, activations = 0;
  for (const auto& l : TrialCosts(trial, MicroBatch(trial.training), a)) {
    parameters += static_cast<double>(l.parameters);
    activations += static_cast<double>(l.activation_bytes);
  }
  if (a.error()) return a.error();
  // Each layer fits; the model's totals must too.
  a.Parameters(parameters, "the whole model");
  a.Bytes(activations, "the whole model", "activations");
  return a.error();
}

}  // namespace hydra
