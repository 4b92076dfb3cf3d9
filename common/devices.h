#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace hydra {

enum class DeviceKind { kCpu, kCuda };

/// A device that trains trials: a CUDA GPU, or a CPU device with a memory budget.
struct DeviceSpec {
  std::string name;          ///< "cpu:0", "cuda:1"
  int64_t memory_bytes = 0;  ///< the memory trials may use on it (a CPU device's budget)
  DeviceKind kind = DeviceKind::kCpu;
  int index = 0;      ///< the CPU device's ordinal, or the CUDA device index
  std::string uuid;   ///< CUDA: "GPU-…" as nvidia-smi and dcgm-exporter write it
  std::string model;  ///< CUDA: the GPU's name ("NVIDIA H100 80GB HBM3")
};

/// CPU device `index` ("cpu:<index>") with a memory budget of `budget` bytes.
DeviceSpec CpuDevice(int index, int64_t budget);

/// What --devices asks for, before any GPU is looked at:
///   cpu:N[,budget=Q]            N CPU devices, each with budget Q
///   cuda[,budget=Q]             every visible GPU
///   cuda:I[,J...][,budget=Q]    the GPUs with CUDA indices I, J, ...
/// Q is a byte quantity such as 20Gi.
struct DevicesRequest {
  DeviceKind kind = DeviceKind::kCpu;
  int cpu_count = 0;
  std::vector<int> cuda_indices;  ///< empty: every visible GPU
  std::optional<int64_t> budget;
};

/// INVALID_ARGUMENT naming the problem and the expected forms for a malformed flag.
StatusOr<DevicesRequest> ParseDevicesRequest(const std::string& flag);

/// A GPU as the CUDA runtime reports it.
struct GpuInfo {
  /// Who measured free_bytes: NVML reads it without a CUDA context; the CUDA runtime's
  /// cudaMemGetInfo creates one on the GPU (the fallback where NVML is missing).
  enum class FreeMemorySource { kCudaRuntime, kNvml };

  int index = 0;
  std::string name, uuid;
  int64_t total_bytes = 0, free_bytes = 0;
  FreeMemorySource free_from = FreeMemorySource::kCudaRuntime;
};

/// What LibTorch's caching allocator holds on a GPU now (c10's DeviceStats, current values).
struct DeviceAllocatorBytes {
  int64_t allocated = 0;  ///< in tensors
  int64_t reserved = 0;   ///< taken from CUDA: allocated plus cached free blocks
};

/// A GPU's 16-byte UUID as NVML, nvidia-smi and dcgm-exporter write it:
/// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", lower-case hex.
std::string FormatGpuUuid(const unsigned char (&bytes)[16]);

/// Room left on a GPU for this process's own CUDA context (LibTorch's kernels loaded lazily)
/// when its free memory was read through NVML, before the context existed.
inline constexpr int64_t kCudaContextBytes = int64_t{512} << 20;

/// Share of a GPU's free memory that is its default budget: the rest is left for the CUDA
/// context, cuBLAS workspaces and the caching allocator's slack.
inline constexpr double kDefaultGpuBudgetShare = 0.9;

/// The devices a request names. CPU devices get `budget` or `default_cpu_budget` each. CUDA
/// devices come from `gpus` (the error of a failed discovery is passed on, with the flag named):
/// an index that is not visible, a repeated one, or a budget above a GPU's memory is
/// INVALID_ARGUMENT; no visible GPU is FAILED_PRECONDITION. A GPU's default budget is
/// kDefaultGpuBudgetShare of its free memory.
StatusOr<std::vector<DeviceSpec>> ResolveDevices(const DevicesRequest& request,
                                                 int64_t default_cpu_budget,
                                                 const StatusOr<std::vector<GpuInfo>>& gpus);

/// Per device, the memory that trials keeping state on it must share (TrialSchedulerOptions::
/// device_memory_bytes): a GPU's memory_bytes, 0 for a CPU device (trials move between those).
std::vector<int64_t> DiscreteDeviceMemory(const std::vector<DeviceSpec>& devices);

/// The CPU's model name ("Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz") from /proc/cpuinfo;
/// empty if unknown. Float results are bit-identical only on the same CPU kind.
std::string CpuModelName();

}  // namespace hydra
