#pragma once
// Torch-facing: include only from executor translation units.

#include <torch/torch.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "common/job.h"

namespace hydra::executor {

/// How AdamW's update runs.
enum class AdamWKernel {
  /// fp32 CPU tensors: one fused pass per parameter (AdamWUpdate, vectorized for the CPU, on
  /// LibTorch's intra-op threads); GPU tensors: LibTorch's
  /// fused multi-tensor kernel (`_fused_adamw_`, LibTorch 2.4 and later: the CUDA build), a few
  /// launches for a whole shard instead of nine per parameter; otherwise per tensor.
  kAuto,
  kPerTensor,   ///< torch.optim.AdamW's single-tensor operations, parameter by parameter
  kTorchFused,  ///< `_fused_adamw_` on any device (tests; where TorchFusedAdamW() is true)
};

/// Whether this LibTorch has `_fused_adamw_` for CPU and CUDA tensors (2.4 and later).
bool TorchFusedAdamW();

/// AdamW (Loshchilov & Hutter) or SGD with momentum over a list of named parameters, with the
/// optimizer state as plain named tensors so it can be checkpointed and (later) move with the
/// parameters' shard. Same arithmetic as torch.optim's single-tensor implementations.
/// Weight decay applies to parameters with two or more dimensions only.
class Optimizer {
 public:
  /// Memory for one slot of a parameter's state: a zero-filled tensor of `param`'s shape and
  /// type.
  using StateAllocator = std::function<torch::Tensor(const torch::Tensor& param)>;

  /// `allocate` (default: torch::zeros_like, beside the parameter) gives each state tensor its
  /// memory: a discrete device's executor makes it in its host tier directly.
  Optimizer(std::vector<std::pair<std::string, torch::Tensor>> params, const TrainingSpec& training,
            const StateAllocator& allocate = nullptr);

  /// Applies one update from the parameters' .grad() with learning rate `lr`.
  /// `step` is the 1-based count of updates including this one (AdamW bias correction).
  void Step(double lr, int64_t step);

  /// Sets every gradient to zero (keeping its storage).
  void ZeroGrad();

  /// Frees every gradient (the next backward allocates fresh ones).
  void ReleaseGrads();

  /// L2 norm of each parameter's gradient, in parameter order (undefined gradients skipped).
  std::vector<torch::Tensor> GradNorms() const;

  /// Multiplies every gradient by `scale`.
  void ScaleGrads(double scale);

  /// Global L2 norm of all gradients; if `max_norm` > 0 and the norm exceeds it, scales the
  /// gradients by max_norm / (norm + 1e-6) as torch.nn.utils.clip_grad_norm_. Returns the norm
  /// before clipping.
  double ClipGradNorm(double max_norm);

  /// State tensors named "<param>.<slot>" (slots: exp_avg, exp_avg_sq, momentum_buffer).
  std::vector<std::pair<std::string, torch::Tensor>> NamedState() const;

  /// Bytes of optimizer state.
  int64_t StateBytes() const;

  /// Which AdamW kernel Step runs (kAuto unless a test says otherwise).
  void set_adamw_kernel(AdamWKernel k) { kernel_ = k; }

 private:
  struct Slot {
    std::string name;
    torch::Tensor param;
    torch::Tensor m;  // exp_avg or momentum buffer
    torch::Tensor v;  // exp_avg_sq (AdamW)
    bool decay;
  };
  /// Whether Step runs `_fused_adamw_` (kernel_, the build and where the slots are).
  bool UsesTorchFused() const;
  /// AdamW's update parameter by parameter: the fused CPU pass where it applies (kAuto).
  void AdamWPerSlot(double lr, int64_t step);
  /// AdamW's update of every slot with a gradient through `_fused_adamw_`: one call for the
  /// slots with weight decay, one for those without.
  void AdamWTorchFused(double lr, int64_t step);

  TrainingSpec training_;
  bool adamw_;
  AdamWKernel kernel_ = AdamWKernel::kAuto;
  std::vector<Slot> slots_;
};

/// The global L2 norm from per-parameter norms, computed as torch.nn.utils.clip_grad_norm_ does
/// (so sharded and unsharded training clip identically).
double GlobalNorm(const std::vector<torch::Tensor>& per_parameter_norms);

/// The factor clip_grad_norm_ scales gradients by when `total_norm` exceeds `max_norm`.
double ClipScale(double max_norm, double total_norm);

}  // namespace hydra::executor
