#include "common/devices.h"

#include <cstdlib>
#include <fstream>

#include "common/units.h"

namespace hydra {

StatusOr<std::vector<DeviceSpec>> ParseDevicesFlag(const std::string& flag,
                                                   int64_t default_budget) {
  auto bad = [&](const std::string& why) {
    return InvalidArgumentError("--devices: " + why +
                                " (expected cpu:N or cpu:N,budget=4Gi; got '" + flag + "')");
  };
  if (flag.rfind("cpu:", 0) != 0) return bad("only CPU devices are supported by this build");
  std::string count_text = flag.substr(4), options;
  if (auto comma = count_text.find(','); comma != std::string::npos) {
    options = count_text.substr(comma + 1);
    count_text = count_text.substr(0, comma);
  }
  char* end = nullptr;
  const long count = std::strtol(count_text.c_str(), &end, 10);
  if (count_text.empty() || *end != '\0' || count < 1 || count > 1024) {
    return bad("N must be an integer from 1 to 1024");
  }
  int64_t budget = default_budget;
  if (!options.empty()) {
    if (options.rfind("budget=", 0) != 0) return bad("unknown option '" + options + "'");
    auto bytes = ParseByteQuantity(options.substr(7));
    if (!bytes.ok()) return bad("budget: " + bytes.status().message());
    if (*bytes <= 0) return bad("budget must be > 0");
    budget = *bytes;
  }
  std::vector<DeviceSpec> out;
  for (long i = 0; i < count; ++i) out.push_back({"cpu:" + std::to_string(i), budget});
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
