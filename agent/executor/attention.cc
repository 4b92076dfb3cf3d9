#include "agent/executor/attention.h"

#include "agent/executor/precision.h"

// LibTorch's scaled_dot_product_attention with a `scale` argument: 2.1 and later.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
#define HYDRA_TORCH_SDPA 1
#endif

namespace hydra::executor {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

/// The computation itself, the same in forward and in the recompute.
torch::Tensor AttentionOf(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                          const torch::Tensor& mask, double scale) {
  // One GEMM computes mask + scale * q k^T: no separate passes for scaling and masking.
  const auto scores = torch::baddbmm(mask.to(q.scalar_type()).unsqueeze(0), q, k.transpose(1, 2),
                                     /*beta=*/1.0, /*alpha=*/scale);
  const auto probabilities = torch::softmax(scores, -1, torch::kFloat);
  return torch::bmm(probabilities.to(v.scalar_type()), v);
}

/// Saves q, k and v only; backward rebuilds the graph of AttentionOf, in the autocast type the
/// forward ran in (backward may run on another thread, where autocast is off), and
/// differentiates it.
class RecomputedAttention : public torch::autograd::Function<RecomputedAttention> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, const torch::Tensor& mask, double scale) {
    ctx->save_for_backward({q, k, v});
    ctx->saved_data["mask"] = mask;
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["bf16"] = ActiveComputeType(q.device().type()) == torch::kBFloat16;
    return AttentionOf(q, k, v, mask, scale);  // grad mode is off in a Function's forward
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_output) {
    const auto saved = ctx->get_saved_variables();
    std::vector<torch::Tensor> inputs;
    for (const auto& t : saved) inputs.push_back(t.detach().requires_grad_(true));
    torch::Tensor y;
    {
      torch::AutoGradMode grad(true);
      const bool bf16 = ctx->saved_data["bf16"].toBool();
      PrecisionScope precision(bf16 ? Precision::kBf16 : Precision::kFp32,
                               inputs[0].device().type());
      y = AttentionOf(inputs[0], inputs[1], inputs[2], ctx->saved_data["mask"].toTensor(),
                      ctx->saved_data["scale"].toDouble());
    }
    auto grads = torch::autograd::grad({y}, inputs, {grad_output[0]});
    return {grads[0], grads[1], grads[2], torch::Tensor(), torch::Tensor()};
  }
};

/// One fused kernel over [B, H, T, D] as given, or [1, B*H, T, D] for heads folded into the
/// batch (the flash and memory-efficient kernels take 4-d tensors).
torch::Tensor FusedCausalAttention(const torch::Tensor& q, const torch::Tensor& k,
                                   const torch::Tensor& v, double scale) {
#ifdef HYDRA_TORCH_SDPA
  auto fused = [&](const torch::Tensor& q4, const torch::Tensor& k4, const torch::Tensor& v4) {
    return at::scaled_dot_product_attention(q4, k4, v4, /*attn_mask=*/std::nullopt,
                                            /*dropout_p=*/0.0, /*is_causal=*/true, scale);
  };
  if (q.dim() == 4) return fused(q, k, v);
  return fused(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0)).squeeze(0);
#else
  (void)q, (void)k, (void)v, (void)scale;
  TORCH_CHECK(false, "fused attention needs LibTorch 2.1 or later (the CUDA build)");
#endif
}

}  // namespace

bool FusedAttentionAvailable() {
#ifdef HYDRA_TORCH_SDPA
  return true;
#else
  return false;
#endif
}

AttentionMemory ExecutorAttention(bool fused_attention) {
  return fused_attention && FusedAttentionAvailable() ? AttentionMemory::kFused
                                                      : AttentionMemory::kKept;
}

torch::Tensor CausalAttention(const torch::Tensor& q, const torch::Tensor& k,
                              const torch::Tensor& v, const torch::Tensor& mask, double scale,
                              AttentionMemory how) {
  switch (how) {
    case AttentionMemory::kFused: return FusedCausalAttention(q, k, v, scale);
    case AttentionMemory::kRecomputed:
      if (torch::GradMode::is_enabled()) return RecomputedAttention::apply(q, k, v, mask, scale);
      break;
    case AttentionMemory::kKept: break;
  }
  return AttentionOf(q, k, v, mask, scale);
}

}  // namespace hydra::executor
