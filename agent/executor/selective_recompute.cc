#include "agent/executor/selective_recompute.h"

#include <vector>

namespace hydra::executor {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

torch::Tensor Pre(Recomputed pre, const torch::Tensor& x, const torch::Tensor& w,
                  const torch::Tensor& b, double eps) {
  if (pre == Recomputed::kGeluTanh) return torch::gelu(x, "tanh");
  return torch::layer_norm(x, {x.size(-1)}, w, b, eps);
}

/// A leaf copy of `t` that requires grad.
torch::Tensor Leaf(const torch::Tensor& t) { return t.detach().requires_grad_(true); }

class LinearOfRecomputedFunction : public torch::autograd::Function<LinearOfRecomputedFunction> {
 public:
  // The forward runs below autograd but under autocast, as the layers' own calls would.
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& pre_weight, const torch::Tensor& pre_bias,
                               const torch::Tensor& weight, const torch::Tensor& bias, int64_t pre,
                               double eps) {
    // Detached: autocast caches its casts of leaves that require grad until its outermost scope
    // ends (the shard's forward), which would keep every product's cast weight alive through
    // the forward; the backward casts the weight again, so this cast lives only for the product.
    const torch::Tensor b = bias.numel() > 0 ? bias.detach() : torch::Tensor();
    torch::Tensor y = torch::linear(Pre(static_cast<Recomputed>(pre), x, pre_weight, pre_bias, eps),
                                    weight.detach(), b);
    ctx->save_for_backward({x, pre_weight, pre_bias, weight, bias});
    ctx->saved_data["pre"] = pre;
    ctx->saved_data["eps"] = eps;
    ctx->saved_data["type"] = static_cast<int64_t>(y.scalar_type());  // the product's
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list s = ctx->get_saved_variables();
    const torch::Tensor &x = s[0], &weight = s[3];
    const torch::Tensor bias = s[4].numel() > 0 ? s[4] : torch::Tensor();
    const auto pre = static_cast<Recomputed>(ctx->saved_data["pre"].toInt());
    const auto type = static_cast<torch::ScalarType>(ctx->saved_data["type"].toInt());
    const torch::Tensor& gy = grads[0];
    // pre's output again, with its own graph for pre's backward (GELU's weight and bias are
    // placeholders: LinearOfRecomputed).
    const bool norm = pre == Recomputed::kLayerNorm;
    const torch::Tensor xr = Leaf(x), wr = norm ? Leaf(s[1]) : torch::Tensor(),
                        br = norm ? Leaf(s[2]) : torch::Tensor();
    torch::Tensor p;
    {
      torch::AutoGradMode on(true);
      p = Pre(pre, xr, wr, br, ctx->saved_data["eps"].toDouble());
    }
    // The product's backward, in the type it ran in (autocast cast its inputs to it).
    const int64_t out = weight.size(0), in = weight.size(1);
    const torch::Tensor flat = gy.reshape({-1, out});
    const torch::Tensor grad_weight =
        flat.t().mm(p.detach().to(type).reshape({-1, in})).to(weight.scalar_type());
    const torch::Tensor grad_bias =
        bias.defined() ? flat.sum(0).to(bias.scalar_type()) : torch::Tensor();
    const torch::Tensor grad_p = gy.matmul(weight.to(type)).to(p.scalar_type());
    const variable_list g =
        torch::autograd::grad({p}, norm ? variable_list{xr, wr, br} : variable_list{xr}, {grad_p});
    return {g[0],
            norm ? g[1] : torch::Tensor(),
            norm ? g[2] : torch::Tensor(),
            grad_weight,
            grad_bias,
            torch::Tensor(),
            torch::Tensor()};
  }
};

}  // namespace

torch::Tensor LinearOfRecomputed(Recomputed pre, const torch::Tensor& x,
                                 const torch::Tensor& pre_weight, const torch::Tensor& pre_bias,
                                 double eps, const torch::Tensor& weight,
                                 const torch::Tensor& bias) {
  // LibTorch 1.13's custom functions take no undefined tensors: GELU's weight and bias (and an
  // absent bias) are empty placeholders.
  auto given = [&](const torch::Tensor& t) { return t.defined() ? t : x.new_empty({0}); };
  return LinearOfRecomputedFunction::apply(x, given(pre_weight), given(pre_bias), weight,
                                           given(bias), static_cast<int64_t>(pre), eps);
}

}  // namespace hydra::executor
