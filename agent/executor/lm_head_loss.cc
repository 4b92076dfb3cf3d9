#include "agent/executor/lm_head_loss.h"

#include <algorithm>

#include "common/cost_model.h"

namespace hydra::executor {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

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

/// Summed loss of rows [first, first + rows) of hc (in the GEMMs' type), chunk by chunk, with
/// the logits' gradients written into `g` [rows, V] (the GEMMs' type, the block's buffer) when
/// it is defined (training; undefined: the loss alone).
torch::Tensor BlockLoss(const torch::Tensor& hc, const torch::Tensor& wt,
                        const torch::Tensor& targets, int64_t first, int64_t rows,
                        torch::Tensor g) {
  const bool grad = g.defined();
  const bool fp32 = hc.scalar_type() == torch::kFloat;
  auto total = torch::zeros({}, hc.options().dtype(torch::kFloat));
  for (int64_t r = 0; r < rows; r += kLmHeadChunkRows) {
    const int64_t n = std::min(kLmHeadChunkRows, rows - r);
    const auto h = hc.narrow(0, first + r, n);
    torch::Tensor z;
    if (fp32 && grad) {
      z = g.narrow(0, r, n);
      at::mm_out(z, h, wt);  // in place in the block: no copy
    } else {
      z = torch::mm(h, wt).to(torch::kFloat);
    }
    total.add_(ChunkLoss(z, targets.narrow(0, first + r, n), grad));
    if (grad && !fp32) g.narrow(0, r, n).copy_(z);
  }
  return total;
}

class LmHeadLossFunction : public torch::autograd::Function<LmHeadLossFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& h, const torch::Tensor& w,
                               const torch::Tensor& targets, torch::ScalarType compute, bool grad) {
    const int64_t n = h.size(0), v = w.size(0);
    const auto hc = h.to(compute), wc = w.to(compute);
    const auto wt = wc.t();
    if (!grad)
      return BlockLoss(hc, wt, targets, 0, n, torch::Tensor()).div_(static_cast<double>(n));
    auto total = torch::zeros({}, h.options().dtype(torch::kFloat));
    // The gradients of the summed loss, gathered block by block in fp32: dh row by row, dw
    // summed over the blocks (in bf16 each block's product is rounded to bf16 first).
    auto dh = torch::empty({n, h.size(1)}, h.options().dtype(torch::kFloat));
    auto dw = torch::zeros({v, w.size(1)}, w.options().dtype(torch::kFloat));
    const int64_t block = LmHeadBlockRows(v, static_cast<int64_t>(hc.element_size()));
    auto g = torch::empty({std::min(block, n), v}, hc.options());
    for (int64_t b = 0; b < n; b += block) {
      const int64_t rows = std::min(block, n - b);
      const auto gb = g.narrow(0, 0, rows), hb = hc.narrow(0, b, rows);
      total.add_(BlockLoss(hc, wt, targets, b, rows, gb));
      if (compute == torch::kFloat) {
        auto dhb = dh.narrow(0, b, rows);
        at::mm_out(dhb, gb, wc);
        dw.addmm_(gb.t(), hb);
      } else {
        dh.narrow(0, b, rows).copy_(torch::mm(gb, wc));
        dw.add_(torch::mm(gb.t(), hb));
      }
    }
    // Not saved variables: nothing of the graph's to check, offload or keep beyond backward.
    ctx->saved_data["dh"] = dh;
    ctx->saved_data["dw"] = dw;
    ctx->saved_data["n"] = n;
    ctx->saved_data["h_type"] = static_cast<int64_t>(h.scalar_type());
    ctx->saved_data["w_type"] = static_cast<int64_t>(w.scalar_type());
    return total.div_(static_cast<double>(n));
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    TORCH_CHECK(ctx->saved_data.count("dh"), "the LM head's backward ran twice");
    // The mean's 1/n times the incoming gradient, as a tensor where that gradient is (reading
    // it on the host would wait for a GPU's queued work in the middle of the backward): the
    // float a scalar multiplier would be, so the products are the same.
    const auto scale =
        (grad_out[0].to(torch::kDouble) / static_cast<double>(ctx->saved_data["n"].toInt()))
            .to(torch::kFloat);
    auto take = [&](const char* grad, const char* type) {
      auto t = ctx->saved_data[grad].toTensor();
      ctx->saved_data.erase(grad);
      return t.mul_(scale).to(static_cast<torch::ScalarType>(ctx->saved_data[type].toInt()));
    };
    auto dh = take("dh", "h_type");
    auto dw = take("dw", "w_type");
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
