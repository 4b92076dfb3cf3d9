#pragma once
// Torch-facing: include only from executor translation units.

#include <torch/torch.h>

namespace hydra::executor {

/// Causal self-attention's core over heads folded into the batch: softmax(mask + scale q k^T) v
/// for q, k, v [B*H, T, D] and the additive mask [T, T]. The softmax runs in fp32 in every
/// precision; the products run in q's and v's type (bf16 under autocast), the mask and the
/// probabilities cast to it explicitly, as autocast would.
///
/// `recompute`: while grad mode is on, keep only q, k and v for backward and recompute the
/// scores and probabilities there (selective recomputation, as in Megatron-LM): the [B*H, T, T]
/// tensors, most of a GPT block's activations at long contexts, do not stay in memory from
/// forward to backward, for about a seventh of the block's forward FLOPs again. Outputs and
/// gradients equal the plain path's bit for bit.
torch::Tensor CausalAttention(const torch::Tensor& q, const torch::Tensor& k,
                              const torch::Tensor& v, const torch::Tensor& mask, double scale,
                              bool recompute);

}  // namespace hydra::executor
