#include "agent/executor/gpus.h"

#ifdef HYDRA_WITH_CUDA
#include <c10/core/AllocatorConfig.h>
#include <c10/cuda/CUDAAllocatorConfig.h>
#include <cuda_runtime_api.h>
#endif

#include <cstdlib>
#include <cstring>
#include <thread>

#include "common/nvml.h"
#include "common/units.h"

namespace hydra::executor {

bool CudaCompiledIn() {
#ifdef HYDRA_WITH_CUDA
  return true;
#else
  return false;
#endif
}

void ConfigureCudaAllocator() {
#ifdef HYDRA_WITH_CUDA
  // A user's own setting wins, under either name (PYTORCH_ALLOC_CONF is 2.x's own).
  if (std::getenv("PYTORCH_ALLOC_CONF") != nullptr ||
      std::getenv("PYTORCH_CUDA_ALLOC_CONF") != nullptr) {
    return;
  }
  constexpr char kSettings[] = "expandable_segments:True";
  ::setenv("PYTORCH_CUDA_ALLOC_CONF", kSettings, /*overwrite=*/0);  // and child processes
  // LibTorch reads the variable once, when its allocator's configuration is first used: after
  // a CUDA allocation (bench/spill's pilot came first) only setting it directly still applies,
  // to the segments made from then on.
  c10::cuda::CUDACachingAllocator::setAllocatorSettings(kSettings);
#endif
}

bool CudaExpandableSegments() {
#ifdef HYDRA_WITH_CUDA
  return c10::CachingAllocator::AcceleratorAllocatorConfig::use_expandable_segments();
#else
  return false;
#endif
}

#ifdef HYDRA_WITH_CUDA
namespace {

Status CudaError(cudaError_t e, const std::string& what) {
  return FailedPreconditionError("CUDA " + what + ": " + cudaGetErrorString(e) +
                                 " (is the NVIDIA driver loaded, and new enough for CUDA 13?)");
}

StatusOr<GpuInfo> Describe(int index) {
  cudaDeviceProp p;
  if (cudaError_t e = cudaGetDeviceProperties(&p, index); e != cudaSuccess) {
    return CudaError(e, "cudaGetDeviceProperties(" + std::to_string(index) + ")");
  }
  GpuInfo g;
  g.index = index;
  g.name = p.name;
  unsigned char uuid[16];
  std::memcpy(uuid, p.uuid.bytes, sizeof(uuid));
  g.uuid = FormatGpuUuid(uuid);
  g.total_bytes = static_cast<int64_t>(p.totalGlobalMem);
  return g;
}

// The fallback where NVML cannot say: the free memory through the CUDA runtime, which creates
// the device's context (once per process and GPU) to answer. On a thread of its own, whose
// current device goes with it: setting the caller's back would create GPU 0's context too.
Status MeasureFreeMemoryWithCuda(GpuInfo* g) {
  size_t free_bytes = 0, total_bytes = 0;
  cudaError_t e = cudaSuccess;
  std::thread([&] {
    e = cudaSetDevice(g->index);
    if (e == cudaSuccess) e = cudaMemGetInfo(&free_bytes, &total_bytes);
  }).join();
  if (e != cudaSuccess) return CudaError(e, "cudaMemGetInfo on cuda:" + std::to_string(g->index));
  g->free_bytes = static_cast<int64_t>(free_bytes);
  g->free_from = GpuInfo::FreeMemorySource::kCudaRuntime;
  return OkStatus();
}

// NVML's GPUs, or none when NVML is missing or fails (the CUDA runtime answers instead).
std::vector<NvmlGpu> NvmlGpusOrNone() {
  auto nvml = Nvml::Open();
  if (!nvml.ok()) return {};
  auto gpus = (*nvml)->Gpus();
  return gpus.ok() ? *std::move(gpus) : std::vector<NvmlGpu>{};
}

}  // namespace
#endif

#ifndef HYDRA_WITH_CUDA
namespace {

// "; the NVIDIA driver here manages 2 GPUs: ...", or "" where NVML is missing or sees none.
std::string GpusTheDriverManages() {
  auto nvml = Nvml::Open();
  if (!nvml.ok()) return "";
  auto gpus = (*nvml)->Gpus();
  if (!gpus.ok() || gpus->empty()) return "";
  return "; the NVIDIA driver here manages " + std::to_string(gpus->size()) +
         " GPU(s): " + DescribeNvmlGpus(*gpus);
}

}  // namespace
#endif

StatusOr<std::vector<GpuInfo>> DiscoverGpus() {
#ifdef HYDRA_WITH_CUDA
  int count = 0;
  if (cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) {
    if (e == cudaErrorNoDevice) return std::vector<GpuInfo>{};
    return CudaError(e, "cudaGetDeviceCount");
  }
  std::vector<GpuInfo> out;
  for (int i = 0; i < count; ++i) {
    ASSIGN_OR_RETURN(auto g, Describe(i));
    out.push_back(std::move(g));
  }
  if (out.empty()) return out;
  for (size_t i : TakeFreeMemoryFromNvml(NvmlGpusOrNone(), &out)) {
    RETURN_IF_ERROR(MeasureFreeMemoryWithCuda(&out[i]));
  }
  return out;
#else
  return FailedPreconditionError(
      "this build has no CUDA (Debian's LibTorch is CPU-only): build with scripts/build-cuda.sh "
      "against PyPI's CUDA LibTorch" +
      GpusTheDriverManages());
#endif
}

StatusOr<std::vector<DeviceSpec>> FindDevices(const DevicesRequest& request,
                                              int64_t default_cpu_budget) {
  if (request.kind == DeviceKind::kCpu)
    return ResolveDevices(request, default_cpu_budget, std::vector<GpuInfo>{});
  return ResolveDevices(request, default_cpu_budget, DiscoverGpus());
}

Status CheckExecutorsCanUse(const std::vector<DeviceSpec>& devices) {
  for (const auto& d : devices) {
    if (d.kind == DeviceKind::kCpu || CudaCompiledIn()) continue;
    // Only a CUDA build finds GPUs; a list made elsewhere (a test) may still name one.
    return FailedPreconditionError("--devices: " + d.name + " (" + d.model + ", " +
                                   FormatBytes(d.memory_bytes) +
                                   " budget) needs a build with CUDA (scripts/build-cuda.sh); "
                                   "this one trains on CPU devices only: use --devices cpu:N");
  }
  return OkStatus();
}

}  // namespace hydra::executor
