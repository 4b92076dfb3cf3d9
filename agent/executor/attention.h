#pragma once
// Torch-facing: include only from executor translation units.

#include <torch/torch.h>

#include "agent/executor/executor.h"
#include "common/cost_model.h"

namespace hydra::executor {

/// Causal self-attention's core over heads folded into the batch: softmax(mask + scale q k^T) v
/// for q, k, v [B*H, T, D] and the additive mask [T, T]. The softmax runs in fp32 in every
/// precision; the products run in q's and v's type (bf16 under autocast), the mask and the
/// probabilities cast to it explicitly, as autocast would.
///
/// `how` (what backward gets; the same outputs either way):
/// * kKept: the scores and probabilities stay for backward.
/// * kRecomputed: while grad mode is on, only q, k and v stay and backward recomputes the
///   scores and probabilities (selective recomputation, as in Megatron-LM): the [B*H, T, T]
///   tensors, most of a GPT block's activations at long contexts, do not stay in memory from
///   forward to backward, for about a seventh of the block's forward FLOPs again. Outputs and
///   gradients equal kKept's bit for bit.
/// * kFused: LibTorch's scaled_dot_product_attention with a causal mask (`mask` must be the
///   causal one; it is not read): flash or memory-efficient kernels on a GPU, which never
///   materialise the scores; equal to kKept to rounding. Only where FusedAttentionAvailable()
///   (executor.h). q, k and v may also be [B, H, T, D] with any strides but a contiguous last
///   dimension (views of one qkv projection's output: no copies); the output is then
///   [B, H, T, D] too, laid out [B, T, H, D] by the GPU's kernels.
torch::Tensor CausalAttention(const torch::Tensor& q, const torch::Tensor& k,
                              const torch::Tensor& v, const torch::Tensor& mask, double scale,
                              AttentionMemory how);

}  // namespace hydra::executor
