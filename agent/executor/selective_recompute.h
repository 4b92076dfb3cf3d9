#pragma once
// Torch-facing: include only from executor translation units.

#include <torch/torch.h>

namespace hydra::executor {

/// The elementwise step before a matrix product that selective recompute runs again in
/// backward.
enum class Recomputed {
  kLayerNorm,  ///< LayerNorm over the last dimension, with a weight, a bias and an epsilon
  kGeluTanh,   ///< GELU, tanh approximation (GPT-2's); no parameters
};

/// linear(pre(x), weight, bias) keeping for backward only x (and pre's weight and bias), not
/// pre's output: the backward computes that again (elementwise, cheap beside the matrix product,
/// which it does not repeat). Megatron-LM's selective activation recompute, applied to a
/// transformer block's LayerNorms and GELU: a GPT-2 block then keeps 10 values of its width a
/// token instead of 16 (with attention fused). Under autocast the product runs in the autocast
/// type as torch::linear would there, and the backward casts as autocast's casts do; the output
/// equals linear(pre(x)) and the gradients equal it to rounding. `pre_weight` and `pre_bias`
/// are undefined for kGeluTanh.
torch::Tensor LinearOfRecomputed(Recomputed pre, const torch::Tensor& x,
                                 const torch::Tensor& pre_weight, const torch::Tensor& pre_bias,
                                 double eps, const torch::Tensor& weight,
                                 const torch::Tensor& bias);

}  // namespace hydra::executor
