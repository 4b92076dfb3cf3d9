#include "agent/executor/layer_memory.h"

#include <c10/core/Allocator.h>
#include <c10/util/ThreadLocalDebugInfo.h>
#include <torch/version.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <vector>

#include "agent/executor/precision.h"

namespace hydra::executor {
namespace {

/// The CPU allocator's reports on this thread while it is installed: bytes now and the most
/// since ResetPeak. LibTorch's allocator reports a block's release only where it saw the
/// block's allocation reported, so the measurement frees what it made while installed.
class ThreadAllocations final : public c10::MemoryReportingInfoBase {
 public:
#if TORCH_VERSION_MAJOR >= 2
  using Total = size_t;
#else
  using Total = int64_t;
#endif
  void reportMemoryUsage(void* /*ptr*/, int64_t bytes, Total /*allocated*/, Total /*reserved*/,
                         c10::Device device) override {
    if (device.type() != c10::DeviceType::CPU) return;
    const int64_t now = now_ += bytes;
    int64_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
  }
  bool memoryProfilingEnabled() const override { return true; }

  int64_t now() const { return now_.load(); }
  int64_t peak() const { return peak_.load(); }
  void ResetPeak() { peak_ = now_.load(); }

 private:
  // Atomic: a scripted module's forked tasks (torch.jit.fork) carry the thread's debug info.
  std::atomic<int64_t> now_{0};
  std::atomic<int64_t> peak_{0};
};

/// The layer's parameters, its own and those it borrows (tied weights).
std::vector<torch::Tensor> Parameters(SequentialLayer& layer) {
  auto ps = layer.parameters();
  for (const auto& p : layer.borrowed_parameters()) ps.push_back(p);
  return ps;
}

LayerMemory Measure(SequentialLayer& layer, const torch::Tensor& input, Precision precision,
                    bool input_grad, const std::function<torch::Tensor(const torch::Tensor&)>& loss,
                    ThreadAllocations& bytes) {
  std::vector<torch::Tensor> made;  // gradients made here, dropped after
  for (auto& p : Parameters(layer)) {
    if (p.grad().defined()) continue;
    p.mutable_grad() = torch::zeros_like(p);
    made.push_back(p);
  }
  LayerMemory m;
  {
    torch::Tensor x = input.clone();
    if (input_grad) x.requires_grad_(true);
    const int64_t start = bytes.now();
    bytes.ResetPeak();
    torch::Tensor result;
    {
      PrecisionScope scope(precision);
      result = layer.forward(x);
      if (loss) result = loss(result);  // the logits go once the loss has what it keeps
    }
    const int64_t result_bytes = static_cast<int64_t>(result.nbytes());
    m.kept = std::max<int64_t>(0, bytes.now() - start - result_bytes);
    m.transient = std::max<int64_t>(0, bytes.peak() - start - m.kept - result_bytes);
    const torch::Tensor grad = torch::ones_like(result);
    const int64_t begun = bytes.now();
    bytes.ResetPeak();
    result.backward(grad);
    m.transient = std::max(m.transient, bytes.peak() - begun);
  }
  for (auto& p : made) p.mutable_grad() = torch::Tensor();
  return m;
}

}  // namespace

LayerMemory MeasureLayerMemory(SequentialLayer& layer, const torch::Tensor& input,
                               Precision precision, bool input_grad,
                               const std::function<torch::Tensor(const torch::Tensor&)>& loss) {
  auto bytes = std::make_shared<ThreadAllocations>();
  c10::DebugInfoGuard installed(c10::DebugInfoKind::PROFILER_STATE, bytes);
  return Measure(layer, input, precision, input_grad, loss, *bytes);
}

}  // namespace hydra::executor
