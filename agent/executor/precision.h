#pragma once
// Torch-facing: include only from executor translation units.

#include <torch/torch.h>

#include "common/job.h"

namespace hydra::executor {

/// The type autocast computes matrix products in on the calling thread (kBFloat16 inside a
/// bf16 PrecisionScope), kFloat when autocast is off.
torch::ScalarType ActiveComputeType(c10::DeviceType device = c10::kCPU);

/// While alive, the calling thread's forward computation on `device` runs in `p`: for kBf16,
/// LibTorch's autocast to bfloat16 (matrix products and convolutions in bf16, their weights
/// cast from the fp32 masters once per scope; the gradients flow back into the fp32 masters).
/// kFp32 changes nothing. Layers keep numerically sensitive work in fp32 themselves (softmax,
/// LayerNorm statistics); TaskLoss computes the loss in fp32.
class PrecisionScope {
 public:
  explicit PrecisionScope(Precision p, c10::DeviceType device = c10::kCPU);
  ~PrecisionScope();
  PrecisionScope(const PrecisionScope&) = delete;
  PrecisionScope& operator=(const PrecisionScope&) = delete;

 private:
  bool active_ = false;
  c10::DeviceType device_;
  bool was_enabled_ = false;
  at::ScalarType was_type_ = at::kBFloat16;
};

}  // namespace hydra::executor
