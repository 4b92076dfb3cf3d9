#include "bench/kernel_trace.h"

#ifdef HYDRA_WITH_CUDA
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/cuda.h>

#include <exception>
#endif

namespace hydra::bench {

#ifdef HYDRA_WITH_CUDA
namespace {
namespace prof = torch::profiler::impl;
const prof::ProfilerConfig& TraceConfig() {
  static const prof::ProfilerConfig config(prof::ProfilerState::KINETO);
  return config;
}
const std::set<prof::ActivityType>& TraceActivities() {
  static const std::set<prof::ActivityType> activities{prof::ActivityType::CPU,
                                                       prof::ActivityType::CUDA};
  return activities;
}
}  // namespace

Status StartKernelTrace() {
  try {
    torch::autograd::profiler::prepareProfiler(TraceConfig(), TraceActivities());
    torch::autograd::profiler::enableProfiler(TraceConfig(), TraceActivities());
  } catch (const std::exception& e) {
    return UnavailableError(std::string("the Kineto profiler did not start: ") + e.what());
  }
  return OkStatus();
}

Status SaveKernelTrace(const std::string& path) {
  try {
    if (torch::cuda::is_available()) torch::cuda::synchronize();
    torch::autograd::profiler::disableProfiler()->save(path);
  } catch (const std::exception& e) {
    return UnavailableError("writing the kernel trace " + path + " failed: " + e.what());
  }
  return OkStatus();
}
#else
Status StartKernelTrace() {
  return FailedPreconditionError("--profile-trace records GPU kernels: it needs the CUDA build");
}
Status SaveKernelTrace(const std::string&) { return StartKernelTrace(); }
#endif

}  // namespace hydra::bench
