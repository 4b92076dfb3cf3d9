#include "common/units.h"

#include <cmath>
#include <cstdio>
#include <limits>

namespace hydra {

StatusOr<int64_t> ParseByteQuantity(const std::string& text) {
  if (text.empty()) return InvalidArgumentError("empty quantity");
  size_t pos = 0;
  double number = 0;
  try {
    number = std::stod(text, &pos);
  } catch (...) {
    return InvalidArgumentError("'" + text + "' is not a quantity (examples: 512Mi, 4Gi, 1G)");
  }
  std::string suffix = text.substr(pos);
  // std::stod accepts "1e9" already; suffixes follow Kubernetes' resource.Quantity.
  static const struct {
    const char* suffix;
    double factor;
  } kSuffixes[] = {{"", 1},
                   {"Ki", 1024.0},
                   {"Mi", 1024.0 * 1024},
                   {"Gi", 1024.0 * 1024 * 1024},
                   {"Ti", 1024.0 * 1024 * 1024 * 1024},
                   {"Pi", 1024.0 * 1024 * 1024 * 1024 * 1024},
                   {"Ei", 1024.0 * 1024 * 1024 * 1024 * 1024 * 1024},
                   {"k", 1e3},
                   {"M", 1e6},
                   {"G", 1e9},
                   {"T", 1e12},
                   {"P", 1e15},
                   {"E", 1e18}};
  for (const auto& s : kSuffixes) {
    if (suffix == s.suffix) {
      double bytes = number * s.factor;
      if (!std::isfinite(bytes) || bytes < 0 ||
          bytes > static_cast<double>(std::numeric_limits<int64_t>::max())) {
        return InvalidArgumentError("'" + text + "' is out of range");
      }
      return static_cast<int64_t>(std::llround(bytes));
    }
  }
  return InvalidArgumentError("'" + text + "' has an unknown suffix '" + suffix +
                              "' (use Ki, Mi, Gi, Ti or k, M, G, T)");
}

std::string FormatBytes(int64_t bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (std::fabs(value) >= 1024.0 && unit < 5) {
    value /= 1024.0;
    ++unit;
  }
  char buf[32];
  if (unit == 0) {
    std::snprintf(buf, sizeof(buf), "%lld B", static_cast<long long>(bytes));
  } else {
    std::snprintf(buf, sizeof(buf), value < 10 ? "%.2f %s" : "%.1f %s", value, kUnits[unit]);
  }
  return buf;
}

std::string FormatDuration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "-";
  long long s = std::llround(seconds);
  char buf[32];
  if (s < 60) {
    std::snprintf(buf, sizeof(buf), "%llds", s);
  } else if (s < 3600) {
    std::snprintf(buf, sizeof(buf), "%lldm%02llds", s / 60, s % 60);
  } else {
    std::snprintf(buf, sizeof(buf), "%lldh%02lldm", s / 3600, (s % 3600) / 60);
  }
  return buf;
}

}  // namespace hydra
