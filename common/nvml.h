#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/devices.h"
#include "common/status.h"

namespace hydra {

/// A GPU as NVML (the NVIDIA driver's management library) reports it. NVML numbers GPUs
/// physically and ignores CUDA_VISIBLE_DEVICES: join with CUDA's devices by `uuid`.
struct NvmlGpu {
  unsigned index = 0;  ///< NVML's index, not CUDA's
  std::string name, uuid;
  int64_t total_bytes = 0, free_bytes = 0, used_bytes = 0;  ///< used: by every process
};

/// NVML loaded at run time with dlopen, so that every build (the CPU one included) runs where no
/// NVIDIA driver is installed. Reading memory through NVML creates no CUDA context: the CUDA
/// runtime's cudaMemGetInfo costs a context (hundreds of MiB) on each GPU it asks about, taken
/// from whoever else shares that GPU. Thread-safe once opened (NVML is).
class Nvml {
 public:
  /// The driver's library, as the NVIDIA container toolkit mounts it into a GPU pod.
  static constexpr char kLibrary[] = "libnvidia-ml.so.1";

  /// Loads `library` and initialises NVML. NOT_FOUND when the library is not there (no NVIDIA
  /// driver on this machine, or not mounted into the container); FAILED_PRECONDITION naming the
  /// cause when a function is missing or nvmlInit fails (a driver too old, or not loaded).
  static StatusOr<std::unique_ptr<Nvml>> Open(const std::string& library = kLibrary);
  ~Nvml();
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  /// The GPUs the driver manages, in NVML's order. A GPU NVML fails on (fallen off the bus:
  /// "GPU is lost"; a MIG parent an unprivileged caller may not read) is left out, and its
  /// FAILED_PRECONDITION, naming the GPU and the call, goes to `skipped` if given: the others
  /// are still described. An error only when NVML cannot count the GPUs.
  StatusOr<std::vector<NvmlGpu>> Gpus(std::vector<Status>* skipped = nullptr) const;

  /// The driver's version ("580.95.05").
  StatusOr<std::string> DriverVersion() const;

  struct Api;  ///< the NVML functions this class uses, resolved with dlsym

 private:
  Nvml(void* handle, std::unique_ptr<Api> api);
  void* handle_;
  std::unique_ptr<Api> api_;
};

/// "NVIDIA H100 80GB HBM3 (GPU-…), NVIDIA H100 80GB HBM3 (GPU-…)": for error messages.
std::string DescribeNvmlGpus(const std::vector<NvmlGpu>& gpus);

/// Fills the free memory of each of `gpus` (CUDA's view: its indices, CUDA_VISIBLE_DEVICES
/// applied) that NVML describes by the same UUID, marking it FreeMemorySource::kNvml. Returns
/// the positions in `gpus` left unfilled (a MIG instance, or a GPU NVML did not list).
std::vector<size_t> TakeFreeMemoryFromNvml(const std::vector<NvmlGpu>& nvml,
                                           std::vector<GpuInfo>* gpus);

}  // namespace hydra
