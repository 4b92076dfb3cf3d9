#pragma once
// Torch-facing: include only from executor translation units.

#include <torch/torch.h>

namespace hydra::executor {

/// Mean next-token cross-entropy of the logits h · wᵀ without materialising them: rows of `h`
/// [N, C] are taken in chunks, each chunk's logits [chunk, V] are reduced to its loss in fp32
/// (max, exp, sum: a log-sum-exp) and turned in place into the gradient of the loss with
/// respect to them (softmax minus the one-hot target). Backward is then two GEMMs over those
/// gradients (dh = G · w, dw = Gᵀ · h) instead of log-softmax's forward and backward over the
/// full [N, V] logits in fp32 and their copies: on a 50257-token vocabulary the head and its
/// loss dominate everything but the GEMMs.
///
/// `compute` is the GEMMs' type: kFloat, or kBFloat16 (h and w are cast once; the softmax,
/// the loss and the gradients' reduction stay fp32; G is kept in bf16 like autocast's
/// activations). `targets` [N] int64. Gradients flow to h and w in their own types. Under
/// NoGradGuard (evaluation) only the loss is computed.
torch::Tensor LmHeadLoss(const torch::Tensor& h, const torch::Tensor& w,
                         const torch::Tensor& targets, torch::ScalarType compute);

}  // namespace hydra::executor
