#include "agent/executor/optimizer.h"

#include <ATen/Parallel.h>

#include <cmath>

#include "agent/executor/adamw_kernel.h"

// LibTorch's fused multi-tensor AdamW for CPU and CUDA tensors: 2.4 and later.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
#define HYDRA_TORCH_FUSED_ADAMW 1
#endif

namespace hydra::executor {
namespace {

bool FusableOnCpu(const torch::Tensor& t) {
  return t.device().is_cpu() && t.scalar_type() == torch::kFloat && t.is_contiguous();
}

/// AdamWUpdate (the widest instruction set this CPU runs) over chunks of the parameter on
/// LibTorch's intra-op threads.
void FusedAdamWCpu(float* p, const float* g, float* m, float* v, int64_t n,
                   const AdamWScalars& scalars) {
  at::parallel_for(0, n, 1 << 15, [&](int64_t begin, int64_t end) {
    AdamWUpdate(p + begin, g + begin, m + begin, v + begin, end - begin, scalars);
  });
}

}  // namespace

Optimizer::Optimizer(std::vector<std::pair<std::string, torch::Tensor>> params,
                     const TrainingSpec& training, const StateAllocator& allocate)
    : training_(training), adamw_(training.optimizer == OptimizerKind::kAdamW) {
  auto zeros = [&](const torch::Tensor& p) {
    return allocate ? allocate(p) : torch::zeros_like(p);
  };
  for (auto& [name, p] : params) {
    Slot s{name, p, {}, {}, p.dim() >= 2};
    if (adamw_) {
      s.m = zeros(p);
      s.v = zeros(p);
    } else if (training.momentum > 0) {
      s.m = zeros(p);
    }
    slots_.push_back(std::move(s));
  }
}

bool TorchFusedAdamW() {
#ifdef HYDRA_TORCH_FUSED_ADAMW
  return true;
#else
  return false;
#endif
}

bool Optimizer::UsesTorchFused() const {
  if (kernel_ == AdamWKernel::kTorchFused) return true;
  if (kernel_ != AdamWKernel::kAuto || !TorchFusedAdamW()) return false;
  bool any = false;
  for (const auto& s : slots_) {
    if (!s.param.grad().defined()) continue;
    if (!s.param.is_cuda()) return false;
    any = true;
  }
  return any;
}

void Optimizer::AdamWPerSlot(double lr, int64_t step) {
  const auto& t = training_;
  const double bc1 = 1.0 - std::pow(t.beta1, static_cast<double>(step));
  const double bc2_sqrt = std::sqrt(1.0 - std::pow(t.beta2, static_cast<double>(step)));
  const double step_size = lr / bc1;
  for (auto& s : slots_) {
    const auto& g = s.param.grad();
    if (!g.defined()) continue;
    const double decay_factor = s.decay && t.weight_decay > 0 ? 1.0 - lr * t.weight_decay : 1.0;
    if (kernel_ == AdamWKernel::kAuto && FusableOnCpu(s.param) && FusableOnCpu(g) &&
        FusableOnCpu(s.m) && FusableOnCpu(s.v)) {
      AdamWScalars scalars;
      scalars.decay_factor = static_cast<float>(decay_factor);
      scalars.beta1 = static_cast<float>(t.beta1);
      scalars.beta2 = static_cast<float>(t.beta2);
      scalars.step_size = static_cast<float>(step_size);
      scalars.bc2_sqrt = static_cast<float>(bc2_sqrt);
      scalars.eps = static_cast<float>(t.epsilon);
      FusedAdamWCpu(s.param.data_ptr<float>(), g.data_ptr<float>(), s.m.data_ptr<float>(),
                    s.v.data_ptr<float>(), s.param.numel(), scalars);
      continue;
    }
    if (decay_factor != 1.0) s.param.mul_(decay_factor);
    s.m.mul_(t.beta1).add_(g, 1.0 - t.beta1);
    s.v.mul_(t.beta2).addcmul_(g, g, 1.0 - t.beta2);
    auto denom = (s.v.sqrt() / bc2_sqrt).add_(t.epsilon);
    s.param.addcdiv_(s.m, denom, -step_size);
  }
}

void Optimizer::AdamWTorchFused(double lr, int64_t step) {
#ifdef HYDRA_TORCH_FUSED_ADAMW
  const auto& t = training_;
  for (const bool decay : {true, false}) {
    std::vector<torch::Tensor> params, grads, ms, vs, steps;
    for (auto& s : slots_) {
      if (!s.param.grad().defined() || (s.decay && t.weight_decay > 0) != decay) continue;
      params.push_back(s.param);
      grads.push_back(s.param.grad());
      ms.push_back(s.m);
      vs.push_back(s.v);
    }
    if (params.empty()) continue;
    // The kernel reads each parameter's step count (torch.optim keeps one tensor each and
    // increments it first): the same count for all of them.
    const torch::Tensor count =
        torch::full({}, static_cast<double>(step),
                    torch::TensorOptions(params[0].device()).dtype(torch::kFloat));
    steps.assign(params.size(), count);
    at::_fused_adamw_(params, grads, ms, vs, /*max_exp_avg_sqs=*/{}, steps, lr, t.beta1, t.beta2,
                      decay ? t.weight_decay : 0.0, t.epsilon, /*amsgrad=*/false,
                      /*maximize=*/false);
  }
#else
  (void)lr, (void)step;
  TORCH_CHECK(false, "this LibTorch has no _fused_adamw_ (2.4 and later)");
#endif
}

void Optimizer::Step(double lr, int64_t step) {
  torch::NoGradGuard no_grad;
  const auto& t = training_;
  if (adamw_) {
    if (UsesTorchFused()) {
      AdamWTorchFused(lr, step);
    } else {
      AdamWPerSlot(lr, step);
    }
    return;
  }
  for (auto& s : slots_) {
    auto g = s.param.grad();
    if (!g.defined()) continue;
    if (s.decay && t.weight_decay > 0) g = g.add(s.param, t.weight_decay);
    if (s.m.defined()) {
      // torch.optim.SGD: the first step copies the gradient into the buffer.
      if (step == 1) {
        s.m.copy_(g);
      } else {
        s.m.mul_(t.momentum).add_(g);
      }
      s.param.add_(s.m, -lr);
    } else {
      s.param.add_(g, -lr);
    }
  }
}

void Optimizer::ZeroGrad() {
  for (auto& s : slots_) {
    auto& g = s.param.mutable_grad();
    if (g.defined()) g.zero_();
  }
}

void Optimizer::ReleaseGrads() {
  for (auto& s : slots_) s.param.mutable_grad() = torch::Tensor();
}

std::vector<torch::Tensor> Optimizer::GradNorms() const {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> norms;
  for (const auto& s : slots_) {
    if (s.param.grad().defined()) norms.push_back(s.param.grad().norm());
  }
  return norms;
}

void Optimizer::ScaleGrads(double scale) {
  torch::NoGradGuard no_grad;
  for (auto& s : slots_) {
    if (s.param.grad().defined()) s.param.mutable_grad().mul_(scale);
  }
}

double Optimizer::ClipGradNorm(double max_norm) {
  auto norms = GradNorms();
  if (norms.empty()) return 0.0;
  const double total = GlobalNorm(norms);
  if (max_norm > 0 && total > max_norm) ScaleGrads(ClipScale(max_norm, total));
  return total;
}

double GlobalNorm(const std::vector<torch::Tensor>& per_parameter_norms) {
  torch::NoGradGuard no_grad;
  return torch::stack(per_parameter_norms).norm().item<double>();
}

double ClipScale(double max_norm, double total_norm) { return max_norm / (total_norm + 1e-6); }

std::vector<std::pair<std::string, torch::Tensor>> Optimizer::NamedState() const {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& s : slots_) {
    if (adamw_) {
      out.emplace_back(s.name + ".exp_avg", s.m);
      out.emplace_back(s.name + ".exp_avg_sq", s.v);
    } else if (s.m.defined()) {
      out.emplace_back(s.name + ".momentum_buffer", s.m);
    }
  }
  return out;
}

int64_t Optimizer::StateBytes() const {
  int64_t bytes = 0;
  for (const auto& [name, t] : NamedState()) bytes += t.numel() * t.element_size();
  return bytes;
}

}  // namespace hydra::executor
