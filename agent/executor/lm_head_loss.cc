#include "agent/executor/lm_head_loss.h"

#include <algorithm>
#include <limits>

#include "common/cost_model.h"

namespace hydra::executor {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

/// Summed loss of one chunk's logits `z` [rows, R] (in the GEMMs' type; R =
/// LmHeadLogitsRow(v): the columns from v on are the padding's, whose logits are 0), which,
/// when `grad`, it overwrites with the gradient of that loss with respect to them: softmax(z)
/// minus the one-hot targets, computed in fp32 and rounded once to z's type (0 in the
/// padding). Two passes over the logits (fused kernels: the log-softmax, in fp32 whatever z's
/// type, and its exp), not the seven of max, subtract, exp, sum, divide and the copies to and
/// from fp32.
torch::Tensor ChunkLoss(torch::Tensor& z, int64_t v, const torch::Tensor& targets, bool grad) {
  const int64_t row = z.size(1);
  if (row > v) z.narrow(1, v, row - v).fill_(-std::numeric_limits<double>::infinity());
  const auto t = targets.unsqueeze(1);
  const auto logp = torch::log_softmax(z, 1, torch::kFloat);
  const auto target_logp = logp.gather(1, t);
  if (grad) {
    at::exp_out(z, logp);
    z.scatter_(1, t, (target_logp.exp() - 1.0).to(z.scalar_type()));
  }
  return -target_logp.sum();
}

/// Summed loss of rows [first, first + rows) of hc (in the GEMMs' type), chunk by chunk, with
/// the logits' gradients written into `g` [rows, R] (the GEMMs' type, the block's buffer) when
/// it is defined (training; undefined: the loss alone). `wt` [C, R]: the padded weights,
/// transposed. Each chunk's logits are computed in their place in `g`.
torch::Tensor BlockLoss(const torch::Tensor& hc, const torch::Tensor& wt, int64_t v,
                        const torch::Tensor& targets, int64_t first, int64_t rows,
                        torch::Tensor g) {
  const bool grad = g.defined();
  auto total = torch::zeros({}, hc.options().dtype(torch::kFloat));
  for (int64_t r = 0; r < rows; r += kLmHeadChunkRows) {
    const int64_t n = std::min(kLmHeadChunkRows, rows - r);
    const auto h = hc.narrow(0, first + r, n);
    torch::Tensor z = grad ? g.narrow(0, r, n) : torch::empty({n, wt.size(1)}, hc.options());
    at::mm_out(z, h, wt);
    total.add_(ChunkLoss(z, v, targets.narrow(0, first + r, n), grad));
  }
  return total;
}

/// w [v, C] in the GEMMs' type with LmHeadLogitsRow(v) rows, the padding's 0: every dimension
/// of the head's three products a multiple of 64.
torch::Tensor PaddedWeights(const torch::Tensor& w, torch::ScalarType compute) {
  const int64_t v = w.size(0), row = LmHeadLogitsRow(v);
  auto wc = torch::empty({row, w.size(1)}, w.options().dtype(compute));
  wc.narrow(0, 0, v).copy_(w);
  if (row > v) wc.narrow(0, v, row - v).zero_();
  return wc;
}

/// Rows of dh for a block of the logits' gradients `gb` [rows, R] (the GEMMs' type): G · w into
/// `dhb` (fp32), the product with `wc` (PaddedWeights), except on a CPU in bf16, where it runs
/// in fp32 (G's first v columns cast, w's fp32 masters): LibTorch 1.13's CPU GEMM for reduced
/// floats sums a product whose right factor is row-major in bf16 itself, which over V = 50257 terms
/// lost 20% of dh on a CPU without AVX-512, where bf16 products are also emulated, 11x slower than
/// the fp32 one (an AMD EPYC, 2 threads).
void BlockDh(torch::Tensor dhb, const torch::Tensor& gb, const torch::Tensor& w,
             const torch::Tensor& wc) {
  if (gb.scalar_type() == torch::kFloat) {
    at::mm_out(dhb, gb, wc);
  } else if (gb.is_cuda()) {
    dhb.copy_(torch::mm(gb, wc));
  } else {
    at::mm_out(dhb, gb.narrow(1, 0, w.size(0)).to(torch::kFloat), w.to(torch::kFloat));
  }
}

class LmHeadLossFunction : public torch::autograd::Function<LmHeadLossFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& h, const torch::Tensor& w,
                               const torch::Tensor& targets, torch::ScalarType compute, bool grad) {
    const int64_t n = h.size(0), v = w.size(0), row = LmHeadLogitsRow(v);
    const auto hc = h.to(compute), wc = PaddedWeights(w, compute);
    const auto wt = wc.t();
    if (!grad)
      return BlockLoss(hc, wt, v, targets, 0, n, torch::Tensor()).div_(static_cast<double>(n));
    auto total = torch::zeros({}, h.options().dtype(torch::kFloat));
    // The gradients of the summed loss, gathered block by block in fp32: dh row by row, dw
    // summed over the blocks (in bf16 each block's product is rounded to bf16 first; the
    // padding's rows stay 0 and are dropped).
    auto dh = torch::empty({n, h.size(1)}, h.options().dtype(torch::kFloat));
    auto dw = torch::zeros({row, w.size(1)}, w.options().dtype(torch::kFloat));
    const int64_t block = LmHeadBlockRows(v, static_cast<int64_t>(hc.element_size()));
    auto g = torch::empty({std::min(block, n), row}, hc.options());
    for (int64_t b = 0; b < n; b += block) {
      const int64_t rows = std::min(block, n - b);
      const auto gb = g.narrow(0, 0, rows), hb = hc.narrow(0, b, rows);
      total.add_(BlockLoss(hc, wt, v, targets, b, rows, gb));
      BlockDh(dh.narrow(0, b, rows), gb, w, wc);
      if (compute == torch::kFloat) {
        dw.addmm_(gb.t(), hb);
      } else {
        dw.add_(torch::mm(gb.t(), hb));
      }
    }
    // Not saved variables: nothing of the graph's to check, offload or keep beyond backward.
    ctx->saved_data["dh"] = dh;
    ctx->saved_data["dw"] = dw.narrow(0, 0, v);
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
