// A stand-in for the NVIDIA driver's libnvidia-ml.so.1, built as a shared library for the unit
// tests of common/nvml (machines without a GPU have no NVML). It exports the NVML functions
// hydra uses, with the C ABI of nvml.h, and describes the GPUs the environment asks for:
//   HYDRA_FAKE_NVML_GPUS="UUID,NAME,TOTAL,FREE,USED;..."  (read at nvmlInit_v2)
//   HYDRA_FAKE_NVML_INIT_ERROR=N     nvmlInit_v2 returns N
//   HYDRA_FAKE_NVML_LOST_GPU=I       GPU I answers NVML_ERROR_GPU_IS_LOST to memory queries
// Built twice: FAKE_NVML_WITHOUT_MEMORY_INFO leaves nvmlDeviceGetMemoryInfo out (a library
// missing a function).
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

namespace {

struct FakeGpu {
  std::string uuid, name;
  unsigned long long total = 0, free = 0, used = 0;
};

std::vector<FakeGpu> gpus;
int inits = 0;

constexpr int kSuccess = 0, kUninitialized = 1, kInvalidArgument = 2, kInsufficientSize = 7,
              kGpuIsLost = 15;

int EnvInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v == nullptr ? fallback : std::atoi(v);
}

std::vector<FakeGpu> ParseGpus(const char* spec) {
  std::vector<FakeGpu> out;
  std::stringstream all(spec == nullptr ? "" : spec);
  std::string entry;
  while (std::getline(all, entry, ';')) {
    std::stringstream fields(entry);
    FakeGpu g;
    std::string total, free, used;
    std::getline(fields, g.uuid, ',');
    std::getline(fields, g.name, ',');
    std::getline(fields, total, ',');
    std::getline(fields, free, ',');
    std::getline(fields, used, ',');
    g.total = std::stoull(total);
    g.free = std::stoull(free);
    g.used = std::stoull(used);
    out.push_back(g);
  }
  return out;
}

int CopyOut(const std::string& s, char* out, unsigned size) {
  if (s.size() + 1 > size) return kInsufficientSize;
  std::memcpy(out, s.c_str(), s.size() + 1);
  return kSuccess;
}

const FakeGpu* Gpu(void* device) { return static_cast<const FakeGpu*>(device); }

}  // namespace

extern "C" {

struct nvmlMemory_t {
  unsigned long long total, free, used;
};

int nvmlInit_v2() {
  if (int e = EnvInt("HYDRA_FAKE_NVML_INIT_ERROR", 0); e != 0) return e;
  if (inits++ == 0) gpus = ParseGpus(std::getenv("HYDRA_FAKE_NVML_GPUS"));
  return kSuccess;
}

int nvmlShutdown() {
  if (inits == 0) return kUninitialized;
  if (--inits == 0) gpus.clear();
  return kSuccess;
}

const char* nvmlErrorString(int result) {
  switch (result) {
    case kSuccess: return "Success";
    case kUninitialized: return "Uninitialized";
    case 9: return "Driver Not Loaded";
    case kGpuIsLost: return "GPU is lost";
    default: return "Unknown Error";
  }
}

int nvmlDeviceGetCount_v2(unsigned* count) {
  if (inits == 0) return kUninitialized;
  *count = static_cast<unsigned>(gpus.size());
  return kSuccess;
}

int nvmlDeviceGetHandleByIndex_v2(unsigned index, void** device) {
  if (inits == 0) return kUninitialized;
  if (index >= gpus.size()) return kInvalidArgument;
  *device = &gpus[index];
  return kSuccess;
}

int nvmlDeviceGetName(void* device, char* name, unsigned size) {
  return CopyOut(Gpu(device)->name, name, size);
}

int nvmlDeviceGetUUID(void* device, char* uuid, unsigned size) {
  return CopyOut(Gpu(device)->uuid, uuid, size);
}

#ifndef FAKE_NVML_WITHOUT_MEMORY_INFO
int nvmlDeviceGetMemoryInfo(void* device, nvmlMemory_t* memory) {
  if (Gpu(device) - gpus.data() == EnvInt("HYDRA_FAKE_NVML_LOST_GPU", -1)) return kGpuIsLost;
  *memory = {Gpu(device)->total, Gpu(device)->free, Gpu(device)->used};
  return kSuccess;
}
#endif

int nvmlSystemGetDriverVersion(char* version, unsigned size) {
  return CopyOut("580.95.05", version, size);
}

}  // extern "C"
