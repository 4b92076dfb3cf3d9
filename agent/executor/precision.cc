#include "agent/executor/precision.h"

#include <ATen/autocast_mode.h>
#include <torch/version.h>

namespace hydra::executor {
namespace {

// LibTorch 2.4 replaced the per-device-type autocast calls with ones taking the device type.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
bool AutocastEnabled(c10::DeviceType d) { return at::autocast::is_autocast_enabled(d); }
void SetAutocast(c10::DeviceType d, bool on) { at::autocast::set_autocast_enabled(d, on); }
at::ScalarType AutocastType(c10::DeviceType d) { return at::autocast::get_autocast_dtype(d); }
void SetAutocastType(c10::DeviceType d, at::ScalarType t) {
  at::autocast::set_autocast_dtype(d, t);
}
#else
bool AutocastEnabled(c10::DeviceType d) {
  return d == c10::kCPU ? at::autocast::is_cpu_enabled() : at::autocast::is_enabled();
}
void SetAutocast(c10::DeviceType d, bool on) {
  d == c10::kCPU ? at::autocast::set_cpu_enabled(on) : at::autocast::set_enabled(on);
}
at::ScalarType AutocastType(c10::DeviceType d) {
  return d == c10::kCPU ? at::autocast::get_autocast_cpu_dtype()
                        : at::autocast::get_autocast_gpu_dtype();
}
void SetAutocastType(c10::DeviceType d, at::ScalarType t) {
  d == c10::kCPU ? at::autocast::set_autocast_cpu_dtype(t)
                 : at::autocast::set_autocast_gpu_dtype(t);
}
#endif

}  // namespace

torch::ScalarType ActiveComputeType(c10::DeviceType device) {
  return AutocastEnabled(device) ? AutocastType(device) : torch::kFloat;
}

PrecisionScope::PrecisionScope(Precision p, c10::DeviceType device) : device_(device) {
  if (p != Precision::kBf16) return;
  active_ = true;
  was_enabled_ = AutocastEnabled(device_);
  was_type_ = AutocastType(device_);
  SetAutocast(device_, true);
  SetAutocastType(device_, at::kBFloat16);
  at::autocast::increment_nesting();
}

PrecisionScope::~PrecisionScope() {
  if (!active_) return;
  // As torch.autocast's __exit__: the cache of casted weights lives for the outermost scope.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  SetAutocast(device_, was_enabled_);
  SetAutocastType(device_, was_type_);
}

}  // namespace hydra::executor
