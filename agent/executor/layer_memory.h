#pragma once
// Torch-facing: include only from executor translation units.

#include <functional>

#include "agent/executor/layer_sequence.h"
#include "common/job.h"

namespace hydra::executor {

/// What one layer's training allocates on the CPU, as LibTorch's CPU allocator reports it to
/// this thread (c10's memory-reporting hook, which LibTorch's profiler uses): the same bytes a
/// GPU's caching allocator hands out for the same operations, kernels' scratch apart (and
/// anything an intra-op worker thread allocates, which reports to no one: LibTorch's kernels
/// allocate their outputs on the calling thread).
struct LayerMemory {
  int64_t kept = 0;  ///< alive after the forward (and the loss), less its output
  /// The most allocated at once beyond kept and the output: in the forward (temporaries, a
  /// last layer's logits before its loss) or in the backward (the gradients it makes).
  int64_t transient = 0;
};

/// `layer`'s forward of `input` in `precision` (the input's gradient wanted where
/// `input_grad`), then `loss` of its output where given, and the backward from the output (a
/// gradient of ones) or the loss, measured. The layer's parameters have gradients throughout
/// (made first where missing, and dropped after), so the backward adds into them as from a
/// step's second micro-batch on. Every tensor it makes is freed before it returns.
LayerMemory MeasureLayerMemory(SequentialLayer& layer, const torch::Tensor& input,
                               Precision precision, bool input_grad,
                               const std::function<torch::Tensor(const torch::Tensor&)>& loss = {});

}  // namespace hydra::executor
