#pragma once

#include <vector>

#include "common/devices.h"
#include "common/status.h"

namespace hydra::executor {

/// Whether this build can reach GPUs (built with -DHYDRA_WITH_CUDA=ON, scripts/build-cuda.sh).
bool CudaCompiledIn();

/// Makes LibTorch's CUDA caching allocator grow its segments in place (expandable segments)
/// unless PYTORCH_CUDA_ALLOC_CONF or PYTORCH_ALLOC_CONF already says something: a spilling
/// executor frees and allocates shard-sized blocks all the time, which fragments fixed
/// segments (the Hydra prototype needed max_split_size_mb). LibTorch reads the variable once,
/// at the first CUDA allocation, so this also sets the allocator's settings directly: called
/// after a GPU was touched, it still applies to the segments made from then on. main() calls
/// it first. Idempotent; nothing in a build without CUDA.
void ConfigureCudaAllocator();

/// Whether LibTorch's caching allocator makes expandable segments (false without CUDA).
bool CudaExpandableSegments();

/// Caps LibTorch's caching allocator on each GPU of `devices` at that GPU's budget
/// (DeviceSpec::memory_bytes, from --devices budget= or 90% of its free memory): the trials of
/// this process never hold more, so what other processes use on a shared GPU stays theirs, and
/// an executor whose ledger is wrong fails with CUDA's out-of-memory error instead of taking
/// it. Memory the allocator has cached is released first (the cap binds only where it asks CUDA
/// for more). Nothing for CPU devices or in a build without CUDA; FAILED_PRECONDITION if CUDA
/// fails.
Status CapGpuMemory(const std::vector<DeviceSpec>& devices);

/// The GPUs visible to CUDA (CUDA_VISIBLE_DEVICES applies): index, name, UUID, total and free
/// memory. The free memory comes from NVML (dlopen'd libnvidia-ml.so.1; no CUDA context is
/// created), matched by UUID, and from cudaMemGetInfo only for a GPU NVML cannot describe.
/// Empty when the driver sees no device; FAILED_PRECONDITION naming the cause when this build
/// has no CUDA (saying which GPUs the driver manages, if NVML is there) or the driver cannot
/// be used.
StatusOr<std::vector<GpuInfo>> DiscoverGpus();

/// The devices a --devices request (ParseDevicesRequest) names on this machine: CPU devices
/// without looking for GPUs, CUDA devices from DiscoverGpus().
StatusOr<std::vector<DeviceSpec>> FindDevices(const DevicesRequest& request,
                                              int64_t default_cpu_budget);

/// OK when the executors can train on every one of `devices` (GPUs need the CUDA build);
/// FAILED_PRECONDITION naming the first they cannot.
Status CheckExecutorsCanUse(const std::vector<DeviceSpec>& devices);

}  // namespace hydra::executor
