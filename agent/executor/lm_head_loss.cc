#include "agent/executor/lm_head_loss.h"

#include <algorithm>

namespace hydra::executor {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

/// Rows per chunk: [256, 50257] fp32 logits are 51 MB, past that the chunk stops paying.
constexpr int64_t kChunkRows = 256;

/// Loss of one chunk's fp32 logits `z` [rows, V] (overwritten, when `grad`, with the gradient
/// of the chunk's summed loss: softmax(z) - onehot(targets)). Returns the summed loss.
torch::Tensor ChunkLoss(torch::Tensor& z, const torch::Tensor& targets, bool grad) {
  const auto t = targets.unsqueeze(1);
  const auto target_logit = z.gather(1, t);
  const auto max = std::get<0>(z.max(1, /*keepdim=*/true));
  z.sub_(max).exp_();
  const auto sum = z.sum(1, /*keepdim=*/true);
  const auto loss = (sum.log() + max - target_logit).sum();
  if (grad) {
    z.div_(sum);
    z.scatter_add_(1, t, torch::full_like(target_logit, -1.0));
  }
  return loss;
}

class LmHeadLossFunction : public torch::autograd::Function<LmHeadLossFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& h, const torch::Tensor& w,
                               const torch::Tensor& targets, torch::ScalarType compute, bool grad) {
    const int64_t n = h.size(0), v = w.size(0);
    const auto hc = h.to(compute), wc = w.to(compute);
    const auto wt = wc.t();
    // Kept for backward: the logits' gradients, in the GEMMs' type.
    auto g = grad ? torch::empty({n, v}, hc.options()) : torch::Tensor();
    auto total = torch::zeros({}, h.options().dtype(torch::kFloat));
    for (int64_t r = 0; r < n; r += kChunkRows) {
      const int64_t rows = std::min(kChunkRows, n - r);
      const auto tc = targets.narrow(0, r, rows);
      torch::Tensor z;
      if (compute == torch::kFloat && grad) {
        z = g.narrow(0, r, rows);
        at::mm_out(z, hc.narrow(0, r, rows), wt);  // in place in G: no copy
      } else {
        z = torch::mm(hc.narrow(0, r, rows), wt).to(torch::kFloat);
      }
      total.add_(ChunkLoss(z, tc, grad));
      if (grad && compute != torch::kFloat) g.narrow(0, r, rows).copy_(z);
    }
    if (grad) ctx->save_for_backward({hc, wc, g});
    ctx->saved_data["n"] = n;
    ctx->saved_data["h_type"] = static_cast<int64_t>(h.scalar_type());
    ctx->saved_data["w_type"] = static_cast<int64_t>(w.scalar_type());
    return total.div_(static_cast<double>(n));
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    const auto saved = ctx->get_saved_variables();
    const auto &hc = saved[0], &wc = saved[1], &g = saved[2];
    // The mean's 1/n times the incoming gradient, as a tensor where that gradient is (reading
    // it on the host would wait for a GPU's queued work in the middle of the backward): the
    // float a scalar multiplier would be, so the products are the same.
    const auto scale =
        (grad_out[0].to(torch::kDouble) / static_cast<double>(ctx->saved_data["n"].toInt()))
            .to(torch::kFloat);
    auto type = [&](const char* key) {
      return static_cast<torch::ScalarType>(ctx->saved_data[key].toInt());
    };
    auto dh = torch::mm(g, wc).to(torch::kFloat).mul_(scale).to(type("h_type"));
    auto dw = torch::mm(g.t(), hc).to(torch::kFloat).mul_(scale).to(type("w_type"));
    return {dh, dw, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor LmHeadLoss(const torch::Tensor& h, const torch::Tensor& w,
                         const torch::Tensor& targets, torch::ScalarType compute) {
  // Decided here: inside apply() grad mode is off, and a parameter requires grad even under
  // NoGradGuard (evaluation), where no gradient buffer may be built.
  const bool grad = torch::GradMode::is_enabled() && (h.requires_grad() || w.requires_grad());
  return LmHeadLossFunction::apply(h, w, targets, compute, grad);
}

}  // namespace hydra::executor
