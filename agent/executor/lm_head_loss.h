#pragma once
// Torch-facing: include only from executor translation units.

#include <torch/torch.h>

namespace hydra::executor {

/// Mean next-token cross-entropy of the logits h · wᵀ without materialising them: rows of `h`
/// [N, C] are taken in chunks of kLmHeadChunkRows (common/cost_model.h), each chunk's logits
/// [chunk, V] (its rows padded to LmHeadLogitsRow(V) for cuBLAS's aligned kernels) are reduced to
/// its loss by a log-softmax in fp32 and turned in place into the gradient of the loss with respect
/// to them (softmax minus the one-hot target, G, rounded once to the GEMMs' type). The forward
/// gathers G for a block of rows (LmHeadBlockRows: at most kLmHeadBlockBytes) and turns it into the
/// gradients at once (dh = G · w for the block's rows, dw
/// += Gᵀ · h), as Liger-Kernel's fused linear cross-entropy does: what outlives the forward is dh
/// [N, C] and dw [V, C] in fp32, not G [N, V] (1.6 GB in fp32 for GPT-2's vocabulary at 8192
/// tokens), and backward only scales them by the incoming gradient. Against log-softmax over the
/// full logits this saves their fp32 copies, forward and backward; on a 50257-token vocabulary the
/// head and its loss dominate everything but the GEMMs.
///
/// `compute` is the GEMMs' type: kFloat, or kBFloat16 (h and w are cast once; the softmax,
/// the loss and the sums over blocks stay fp32; each block's products are bf16, like
/// autocast's). `targets` [N] int64. Gradients flow to h and w in their own types. Under
/// NoGradGuard (evaluation) only the loss is computed.
torch::Tensor LmHeadLoss(const torch::Tensor& h, const torch::Tensor& w,
                         const torch::Tensor& targets, torch::ScalarType compute);

}  // namespace hydra::executor
