#include "common/devices.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>

#include "common/units.h"

namespace hydra {
namespace {

constexpr char kForms[] = "cpu:N, cpu:N,budget=4Gi, cuda, cuda:0,2 or cuda:0,budget=20Gi";

/// A non-negative decimal integer of at most 4 digits, else nullopt.
std::optional<int> SmallInt(const std::string& text) {
  if (text.empty() || text.size() > 4 || text.find_first_not_of("0123456789") != std::string::npos)
    return std::nullopt;
  return std::atoi(text.c_str());
}

std::vector<std::string> SplitCommas(const std::string& flag) {
  std::vector<std::string> parts;
  std::stringstream in(flag);
  std::string part;
  while (std::getline(in, part, ',')) parts.push_back(part);
  if (!flag.empty() && flag.back() == ',') parts.emplace_back();
  return parts;
}

}  // namespace

DeviceSpec CpuDevice(int index, int64_t budget) {
  DeviceSpec d;
  d.name = "cpu:" + std::to_string(index);
  d.index = index;
  d.memory_bytes = budget;
  return d;
}

StatusOr<DevicesRequest> ParseDevicesRequest(const std::string& flag) {
  auto bad = [&](const std::string& why) {
    return InvalidArgumentError("--devices: " + why + " (expected " + kForms + "; got '" + flag +
                                "')");
  };
  std::vector<std::string> parts = SplitCommas(flag);
  if (parts.empty()) return bad("empty");
  DevicesRequest r;
  const std::string head = parts.front();
  if (head.rfind("cpu:", 0) == 0) {
    const auto n = SmallInt(head.substr(4));
    if (!n || *n < 1 || *n > 1024) return bad("N must be an integer from 1 to 1024");
    r.cpu_count = *n;
  } else if (head == "cuda" || head.rfind("cuda:", 0) == 0) {
    r.kind = DeviceKind::kCuda;
    if (head != "cuda") {
      const auto i = SmallInt(head.substr(5));
      if (!i) return bad("a GPU index must be an integer >= 0");
      r.cuda_indices.push_back(*i);
    }
  } else {
    return bad("unknown device kind '" + head + "'");
  }
  for (size_t k = 1; k < parts.size(); ++k) {
    const std::string& p = parts[k];
    if (p.rfind("budget=", 0) == 0) {
      if (r.budget) return bad("budget given twice");
      auto bytes = ParseByteQuantity(p.substr(7));
      if (!bytes.ok()) return bad("budget: " + bytes.status().message());
      if (*bytes <= 0) return bad("budget must be > 0");
      r.budget = *bytes;
    } else if (auto i = SmallInt(p); i && r.kind == DeviceKind::kCuda && !r.cuda_indices.empty()) {
      if (r.budget) return bad("GPU indices come before budget=");
      r.cuda_indices.push_back(*i);
    } else {
      return bad("unknown option '" + p + "'");
    }
  }
  std::set<int> seen;
  for (int i : r.cuda_indices) {
    if (!seen.insert(i).second) return bad("GPU " + std::to_string(i) + " named twice");
  }
  return r;
}

namespace {

std::string VisibleList(const std::vector<GpuInfo>& gpus) {
  std::string out;
  for (const auto& g : gpus)
    out += (out.empty() ? "" : ", ") + std::string("cuda:") + std::to_string(g.index);
  return out;
}

StatusOr<DeviceSpec> CudaDevice(const GpuInfo& g, const std::optional<int64_t>& budget) {
  DeviceSpec d;
  d.kind = DeviceKind::kCuda;
  d.name = "cuda:" + std::to_string(g.index);
  d.index = g.index;
  d.uuid = g.uuid;
  d.model = g.name;
  if (budget && *budget > g.total_bytes) {
    return InvalidArgumentError("--devices: budget " + FormatBytes(*budget) + " is more than " +
                                d.name + " (" + g.name + ") has: " + FormatBytes(g.total_bytes));
  }
  const int64_t free = g.free_from == GpuInfo::FreeMemorySource::kNvml
                           ? std::max<int64_t>(0, g.free_bytes - kCudaContextBytes)
                           : g.free_bytes;
  d.memory_bytes =
      budget ? *budget : static_cast<int64_t>(kDefaultGpuBudgetShare * static_cast<double>(free));
  if (d.memory_bytes <= 0) {
    return FailedPreconditionError("--devices: " + d.name + " (" + g.name +
                                   ") has no free memory; other processes hold all " +
                                   FormatBytes(g.total_bytes));
  }
  return d;
}

}  // namespace

StatusOr<std::vector<DeviceSpec>> ResolveDevices(const DevicesRequest& request,
                                                 int64_t default_cpu_budget,
                                                 const StatusOr<std::vector<GpuInfo>>& gpus) {
  std::vector<DeviceSpec> out;
  if (request.kind == DeviceKind::kCpu) {
    for (int i = 0; i < request.cpu_count; ++i) {
      out.push_back(CpuDevice(i, request.budget.value_or(default_cpu_budget)));
    }
    return out;
  }
  if (!gpus.ok()) {
    return Status(gpus.status().code(), "--devices: " + gpus.status().message());
  }
  if (gpus->empty()) {
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    return FailedPreconditionError(
        "--devices: no GPU is visible to CUDA (CUDA_VISIBLE_DEVICES=" +
        std::string(visible ? "'" + std::string(visible) + "'" : "unset") +
        "); is the NVIDIA driver loaded and the GPU given to this container "
        "(resources.limits nvidia.com/gpu)?");
  }
  std::vector<int> wanted = request.cuda_indices;
  if (wanted.empty()) {
    for (const auto& g : *gpus) wanted.push_back(g.index);
  }
  for (int i : wanted) {
    auto it =
        std::find_if(gpus->begin(), gpus->end(), [&](const GpuInfo& g) { return g.index == i; });
    if (it == gpus->end()) {
      return InvalidArgumentError("--devices: there is no cuda:" + std::to_string(i) +
                                  "; the visible GPUs are " + VisibleList(*gpus));
    }
    ASSIGN_OR_RETURN(auto d, CudaDevice(*it, request.budget));
    out.push_back(std::move(d));
  }
  return out;
}

std::string FormatGpuUuid(const unsigned char (&bytes)[16]) {
  static const char kHex[] = "0123456789abcdef";
  std::string out = "GPU-";
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    out += kHex[bytes[i] >> 4];
    out += kHex[bytes[i] & 0xf];
  }
  return out;
}

std::vector<int64_t> DiscreteDeviceMemory(const std::vector<DeviceSpec>& devices) {
  std::vector<int64_t> out;
  for (const auto& d : devices) out.push_back(d.kind == DeviceKind::kCuda ? d.memory_bytes : 0);
  return out;
}

std::string CpuModelName() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    const auto start = line.find_first_not_of(" \t", colon + 1);
    return start == std::string::npos ? "" : line.substr(start);
  }
  return "";
}

}  // namespace hydra
