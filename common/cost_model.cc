#include "common/cost_model.h"

namespace hydra {

namespace {

/// A TorchScript model's children as measured at load time. What autograd saves inside a child
/// is not visible from outside, so its activations are estimated as kSavedPerOutput times its
/// output (a transformer block saves about 16x its output per token plus attention scores;
/// an MLP layer 2-3x): an estimate for planning, which the budget ledger then enforces.
std::vector<LayerCost> ModuleLayerCosts(const ModelSpec& m, int64_t micro_batch) {
  constexpr int64_t kSavedPerOutput = 16;
  std::vector<LayerCost> layers;
  for (const auto& l : m.layers) {
    LayerCost c;
    c.name = l.name;
    c.parameters = l.parameters;
    c.tied_parameters = l.tied_parameters;
    c.output_bytes = micro_batch * l.output_elements * 4;
    c.activation_bytes = kSavedPerOutput * c.output_bytes;
    // A dense layer: 2 FLOPs per parameter per token.
    c.forward_flops = 2.0 * static_cast<double>(l.parameters) *
                      static_cast<double>(micro_batch * m.context_length);
    layers.push_back(c);
  }
  return layers;
}

}  // namespace

std::vector<LayerCost> ModelLayerCosts(const ModelSpec& m, int64_t micro_batch) {
  if (m.family == "torchscript") return ModuleLayerCosts(m, micro_batch);
  const int64_t B = micro_batch, T = m.context_length, C = m.n_embd, H = m.n_head, V = m.vocab_size;
  const int64_t tokens = B * T;
  const int64_t f = 4;  // fp32
  std::vector<LayerCost> layers;
  LayerCost embed;
  embed.name = "embed";
  embed.parameters = V * C + T * C;
  embed.tied_parameters = V * C;
  embed.activation_bytes = tokens * 8;  // token ids
  embed.output_bytes = tokens * C * f;
  embed.forward_flops = static_cast<double>(tokens) * C;
  layers.push_back(embed);
  for (int64_t i = 0; i < m.n_layer; ++i) {
    LayerCost b;
    b.name = "block" + std::to_string(i);
    b.parameters = 12 * C * C + 13 * C;
    // Saved for backward per token: layer-norm inputs/outputs, qkv, attention output,
    // projections, the MLP's 4C hidden twice (pre/post GELU), plus attention probabilities
    // and scores (H x T each).
    b.activation_bytes = tokens * (16 * C + 2 * H * T) * f;
    b.output_bytes = tokens * C * f;
    b.forward_flops = static_cast<double>(tokens) * (2.0 * 12 * C * C + 4.0 * T * C);
    layers.push_back(b);
  }
  LayerCost head;
  head.name = "head";
  head.parameters = 2 * C;  // final LayerNorm; the LM head is tied to the token embedding
  head.activation_bytes = tokens * (2 * C + 2 * V) * f;
  head.output_bytes = tokens * V * f;
  head.forward_flops = static_cast<double>(tokens) * 2.0 * C * V;
  layers.push_back(head);
  return layers;
}

namespace {

std::vector<LayerCost> MlpCosts(const ModelSpec& m, const std::vector<int64_t>& shape, int64_t B) {
  const int64_t pixels = shape[0] * shape[1] * shape[2], W = m.n_embd, K = m.num_classes;
  std::vector<LayerCost> layers;
  auto dense = [&](const std::string& name, int64_t in, int64_t out, bool relu) {
    LayerCost c;
    c.name = name;
    c.parameters = in * out + out;
    c.activation_bytes = B * (in + (relu ? 2 * out : out)) * 4;  // input, pre/post ReLU
    c.output_bytes = B * out * 4;
    c.forward_flops = 2.0 * static_cast<double>(B * in * out);
    layers.push_back(c);
  };
  dense("input", pixels, W, true);
  for (int64_t i = 0; i < m.n_layer; ++i) dense("hidden" + std::to_string(i), W, W, true);
  dense("head", W, K, false);
  return layers;
}

std::vector<LayerCost> ResNetCosts(const ModelSpec& m, const std::vector<int64_t>& shape,
                                   int64_t B) {
  int64_t width = m.n_embd, h = shape[1], w = shape[2];
  std::vector<LayerCost> layers;
  LayerCost stem;
  stem.name = "stem";
  stem.parameters = 9 * shape[0] * width + 2 * width;
  stem.output_bytes = B * width * h * w * 4;
  stem.activation_bytes = B * shape[0] * h * w * 4 + 3 * stem.output_bytes;
  stem.forward_flops = 2.0 * 9 * static_cast<double>(B * shape[0] * width * h * w);
  layers.push_back(stem);
  for (int64_t i = 0; i < m.n_layer; ++i) {
    const bool down = i % 3 == 2;
    const int64_t out = down ? 2 * width : width;
    const int64_t in_bytes = B * width * h * w * 4;
    if (down) h = (h + 1) / 2, w = (w + 1) / 2;
    LayerCost b;
    b.name = "block" + std::to_string(i);
    b.parameters = 9 * width * out + 9 * out * out + 4 * out + (down ? width * out : 0);
    b.output_bytes = B * out * h * w * 4;
    // Input, two convolutions, two GroupNorms, two ReLUs and the sum (+ the shortcut).
    b.activation_bytes = in_bytes + (7 + (down ? 1 : 0)) * b.output_bytes;
    b.forward_flops = 2.0 * 9 * static_cast<double>(B * (width * out + out * out) * h * w) +
                      (down ? 2.0 * static_cast<double>(B * width * out * h * w) : 0.0);
    layers.push_back(b);
    width = out;
  }
  LayerCost head;
  head.name = "head";
  head.parameters = width * m.num_classes + m.num_classes;
  head.activation_bytes = B * (width * h * w + width) * 4;
  head.output_bytes = B * m.num_classes * 4;
  head.forward_flops =
      static_cast<double>(B * width * h * w) + 2.0 * static_cast<double>(B * width * m.num_classes);
  layers.push_back(head);
  return layers;
}

}  // namespace

std::vector<LayerCost> ModelLayerCosts(const Trial& trial, int64_t micro_batch) {
  const auto& shape = trial.dataset.image_shape;
  if (shape.size() == 3 && trial.model.family == "mlp") {
    return MlpCosts(trial.model, shape, micro_batch);
  }
  if (shape.size() == 3 && trial.model.family == "resnet") {
    return ResNetCosts(trial.model, shape, micro_batch);
  }
  return ModelLayerCosts(trial.model, micro_batch);
}

int64_t OptimizerBytesPerParameter(const TrainingSpec& training) {
  if (training.optimizer == "adamw") return 8;
  return training.momentum > 0 ? 4 : 0;
}

TrialFootprint EstimateTrialFootprint(const Trial& trial) {
  TrialFootprint fp;
  int64_t micro = trial.training.batch_size / trial.training.gradient_accumulation_steps;
  for (const auto& l : ModelLayerCosts(trial, micro)) {
    fp.parameters += l.parameters;
    fp.activation_bytes += l.activation_bytes;
  }
  fp.parameter_bytes = fp.parameters * 4;
  fp.gradient_bytes = fp.parameters * 4;
  fp.optimizer_bytes = fp.parameters * OptimizerBytesPerParameter(trial.training);
  return fp;
}

}  // namespace hydra
