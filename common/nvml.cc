#include "common/nvml.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstring>

namespace hydra {

// The few declarations of NVML's C API (nvml.h, stable since the _v2 functions of driver
// 325) that this file uses, so the build needs no NVIDIA headers.
namespace {

using nvmlReturn_t = int;
constexpr nvmlReturn_t kNvmlSuccess = 0;
using nvmlDevice_t = struct nvmlDevice_st*;
struct nvmlMemory_t {
  unsigned long long total, free, used;
};
constexpr unsigned kNameBufferSize = 96;    // NVML_DEVICE_NAME_V2_BUFFER_SIZE
constexpr unsigned kUuidBufferSize = 96;    // NVML_DEVICE_UUID_V2_BUFFER_SIZE
constexpr unsigned kDriverBufferSize = 80;  // NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE

}  // namespace

struct Nvml::Api {
  nvmlReturn_t (*init)();
  nvmlReturn_t (*shutdown)();
  const char* (*error_string)(nvmlReturn_t);
  nvmlReturn_t (*device_count)(unsigned*);
  nvmlReturn_t (*device_by_index)(unsigned, nvmlDevice_t*);
  nvmlReturn_t (*device_name)(nvmlDevice_t, char*, unsigned);
  nvmlReturn_t (*device_uuid)(nvmlDevice_t, char*, unsigned);
  nvmlReturn_t (*device_memory)(nvmlDevice_t, nvmlMemory_t*);
  nvmlReturn_t (*driver_version)(char*, unsigned);

  Status Check(nvmlReturn_t r, const std::string& call) const {
    if (r == kNvmlSuccess) return OkStatus();
    return FailedPreconditionError("NVML " + call + ": " + error_string(r) + " (error " +
                                   std::to_string(r) + ")");
  }
};

namespace {

template <typename F>
bool Resolve(void* handle, const char* symbol, F* out) {
  *out = reinterpret_cast<F>(dlsym(handle, symbol));
  return *out != nullptr;
}

// The first function `handle` lacks, or "" when it has them all.
std::string ResolveAll(void* handle, Nvml::Api* api) {
  if (!Resolve(handle, "nvmlInit_v2", &api->init)) return "nvmlInit_v2";
  if (!Resolve(handle, "nvmlShutdown", &api->shutdown)) return "nvmlShutdown";
  if (!Resolve(handle, "nvmlErrorString", &api->error_string)) return "nvmlErrorString";
  if (!Resolve(handle, "nvmlDeviceGetCount_v2", &api->device_count)) return "nvmlDeviceGetCount_v2";
  if (!Resolve(handle, "nvmlDeviceGetHandleByIndex_v2", &api->device_by_index))
    return "nvmlDeviceGetHandleByIndex_v2";
  if (!Resolve(handle, "nvmlDeviceGetName", &api->device_name)) return "nvmlDeviceGetName";
  if (!Resolve(handle, "nvmlDeviceGetUUID", &api->device_uuid)) return "nvmlDeviceGetUUID";
  if (!Resolve(handle, "nvmlDeviceGetMemoryInfo", &api->device_memory))
    return "nvmlDeviceGetMemoryInfo";
  if (!Resolve(handle, "nvmlSystemGetDriverVersion", &api->driver_version))
    return "nvmlSystemGetDriverVersion";
  return "";
}

StatusOr<NvmlGpu> Describe(const Nvml::Api& api, unsigned index) {
  const std::string gpu = "(GPU " + std::to_string(index) + ")";
  nvmlDevice_t device = nullptr;
  RETURN_IF_ERROR(
      api.Check(api.device_by_index(index, &device), "nvmlDeviceGetHandleByIndex_v2" + gpu));
  char name[kNameBufferSize] = {}, uuid[kUuidBufferSize] = {};
  RETURN_IF_ERROR(
      api.Check(api.device_name(device, name, sizeof(name)), "nvmlDeviceGetName" + gpu));
  RETURN_IF_ERROR(
      api.Check(api.device_uuid(device, uuid, sizeof(uuid)), "nvmlDeviceGetUUID" + gpu));
  nvmlMemory_t memory{};
  RETURN_IF_ERROR(api.Check(api.device_memory(device, &memory), "nvmlDeviceGetMemoryInfo" + gpu));
  NvmlGpu g;
  g.index = index;
  g.name = std::string(name, strnlen(name, sizeof(name)));
  g.uuid = std::string(uuid, strnlen(uuid, sizeof(uuid)));
  g.total_bytes = static_cast<int64_t>(memory.total);
  g.free_bytes = static_cast<int64_t>(memory.free);
  g.used_bytes = static_cast<int64_t>(memory.used);
  return g;
}

}  // namespace

StatusOr<std::unique_ptr<Nvml>> Nvml::Open(const std::string& library) {
  // RTLD_LOCAL: NVML's symbols stay out of the global namespace (a fake one in tests too).
  // RTLD_NODELETE: never unmapped (LibTorch's CUDA code may hold the driver's NVML too).
  void* handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (handle == nullptr) {
    const char* why = dlerror();
    return NotFoundError("NVML: cannot load " + library + " (" + (why ? why : "unknown") +
                         "): no NVIDIA driver here, or it is not mounted into this container");
  }
  auto api = std::make_unique<Api>();
  if (std::string missing = ResolveAll(handle, api.get()); !missing.empty()) {
    dlclose(handle);
    return FailedPreconditionError("NVML: " + library + " has no " + missing +
                                   " (an NVIDIA driver older than 325?)");
  }
  if (Status s = api->Check(api->init(), "nvmlInit_v2"); !s.ok()) {
    dlclose(handle);
    return s;
  }
  return std::unique_ptr<Nvml>(new Nvml(handle, std::move(api)));
}

Nvml::Nvml(void* handle, std::unique_ptr<Api> api) : handle_(handle), api_(std::move(api)) {}

Nvml::~Nvml() {
  api_->shutdown();
  dlclose(handle_);
}

StatusOr<std::vector<NvmlGpu>> Nvml::Gpus(std::vector<Status>* skipped) const {
  unsigned count = 0;
  RETURN_IF_ERROR(api_->Check(api_->device_count(&count), "nvmlDeviceGetCount_v2"));
  std::vector<NvmlGpu> out;
  for (unsigned i = 0; i < count; ++i) {
    auto g = Describe(*api_, i);
    if (g.ok()) {
      out.push_back(*std::move(g));
    } else if (skipped != nullptr) {
      skipped->push_back(g.status());
    }
  }
  return out;
}

StatusOr<std::string> Nvml::DriverVersion() const {
  char version[kDriverBufferSize] = {};
  RETURN_IF_ERROR(
      api_->Check(api_->driver_version(version, sizeof(version)), "nvmlSystemGetDriverVersion"));
  return std::string(version, strnlen(version, sizeof(version)));
}

std::string DescribeNvmlGpus(const std::vector<NvmlGpu>& gpus) {
  std::string out;
  for (const auto& g : gpus) out += (out.empty() ? "" : ", ") + g.name + " (" + g.uuid + ")";
  return out;
}

std::vector<size_t> TakeFreeMemoryFromNvml(const std::vector<NvmlGpu>& nvml,
                                           std::vector<GpuInfo>* gpus) {
  std::vector<size_t> unfilled;
  for (size_t i = 0; i < gpus->size(); ++i) {
    GpuInfo& g = (*gpus)[i];
    auto it =
        std::find_if(nvml.begin(), nvml.end(), [&](const NvmlGpu& n) { return n.uuid == g.uuid; });
    if (it == nvml.end()) {
      unfilled.push_back(i);
      continue;
    }
    g.free_bytes = it->free_bytes;
    g.free_from = GpuInfo::FreeMemorySource::kNvml;
  }
  return unfilled;
}

}  // namespace hydra
