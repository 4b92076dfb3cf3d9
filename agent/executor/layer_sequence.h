#pragma once
// Torch-facing: include only from executor translation units.

#include <torch/torch.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/cost_model.h"

namespace hydra::executor {

/// One stage of a sequential model: a module with one tensor in and one tensor out. Shards are
/// contiguous ranges of these.
class SequentialLayer : public torch::nn::Module {
 public:
  virtual torch::Tensor forward(const torch::Tensor& input) = 0;
  /// Parameters this layer uses but another layer registers (tied weights).
  virtual std::vector<torch::Tensor> borrowed_parameters() const { return {}; }
  /// Parameters this layer registers that a later layer also uses (tied weights). When the
  /// model is sharded they stay on the device for the whole step.
  virtual std::vector<torch::Tensor> lent_parameters() const { return {}; }
  /// The mean next-token loss of this (last) layer's output against `target` [B, T], computed
  /// without its full output when the layer knows how (GPT-2's LM head); an undefined tensor
  /// when it does not (the caller then runs forward() and the task's loss).
  virtual torch::Tensor forward_loss(const torch::Tensor& /*input*/,
                                     const torch::Tensor& /*target*/) {
    return {};
  }
  /// What the layer's attention keeps for backward (attention.h; the plan's `attention`).
  /// Layers without attention ignore it.
  virtual void set_attention(AttentionMemory /*how*/) {}
  /// Whether the layer recomputes its elementwise steps before matrix products in backward
  /// instead of keeping their outputs (selective_recompute.h; the plan's
  /// `selective_recompute`). Layers without such steps ignore it.
  virtual void set_selective_recompute(bool /*on*/) {}
};

/// A model as an ordered list of named layers. Parameters shared between layers (GPT-2's tied
/// embedding / LM head) are registered by exactly one layer, the first to use them.
struct LayerSequence {
  std::vector<std::string> names;
  std::vector<std::shared_ptr<SequentialLayer>> layers;

  void SetAttention(AttentionMemory how) const {
    for (const auto& layer : layers) layer->set_attention(how);
  }
  void SetSelectiveRecompute(bool on) const {
    for (const auto& layer : layers) layer->set_selective_recompute(on);
  }

  torch::Tensor Forward(torch::Tensor x) const {
    for (const auto& layer : layers) x = layer->forward(x);
    return x;
  }

  /// Every parameter once, named "<layer>.<module path>", in layer order.
  std::vector<std::pair<std::string, torch::Tensor>> NamedParameters() const {
    std::vector<std::pair<std::string, torch::Tensor>> out;
    for (size_t i = 0; i < layers.size(); ++i) {
      for (const auto& p : layers[i]->named_parameters(/*recurse=*/true)) {
        out.emplace_back(names[i] + "." + p.key(), p.value());
      }
    }
    return out;
  }
};

}  // namespace hydra::executor
