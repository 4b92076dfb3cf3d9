#include "common/units.h"

#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>

namespace hydra {

namespace {

struct Suffix {
  const char* suffix;
  uint64_t factor;
};
// Kubernetes' resource.Quantity suffixes (binary and decimal).
constexpr Suffix kSuffixes[] = {{"", 1},
                                {"Ki", uint64_t{1} << 10},
                                {"Mi", uint64_t{1} << 20},
                                {"Gi", uint64_t{1} << 30},
                                {"Ti", uint64_t{1} << 40},
                                {"Pi", uint64_t{1} << 50},
                                {"Ei", uint64_t{1} << 60},
                                {"k", 1000ull},
                                {"M", 1000000ull},
                                {"G", 1000000000ull},
                                {"T", 1000000000000ull},
                                {"P", 1000000000000000ull},
                                {"E", 1000000000000000000ull}};

constexpr double kTwoTo63 = 9223372036854775808.0;

/// Digits times the suffix's factor, exactly; nullopt when it reaches 2^63.
std::optional<int64_t> ExactBytes(const std::string& digits, uint64_t factor) {
  uint64_t n = 0;
  for (char ch : digits) {
    if (__builtin_mul_overflow(n, 10u, &n) ||
        __builtin_add_overflow(n, static_cast<uint64_t>(ch - '0'), &n)) {
      return std::nullopt;
    }
  }
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(n, factor, &bytes) ||
      bytes > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return std::nullopt;
  }
  return static_cast<int64_t>(bytes);
}

}  // namespace

StatusOr<int64_t> ParseByteQuantity(const std::string& text) {
  if (text.empty()) return InvalidArgumentError("empty quantity");
  const size_t digits = text.find_first_not_of("0123456789");
  // Plain digits with an optional suffix: exact integer arithmetic.
  if (digits != 0) {
    const std::string number = text.substr(0, digits);
    const std::string suffix = digits == std::string::npos ? "" : text.substr(digits);
    for (const auto& s : kSuffixes) {
      if (suffix != s.suffix) continue;
      auto bytes = ExactBytes(number, s.factor);
      if (!bytes) return InvalidArgumentError("'" + text + "' is 2^63 bytes (8Ei) or more");
      return *bytes;
    }
  }
  // Anything else (1.5Gi, 1e9, -1): through a double.
  size_t pos = 0;
  double number = 0;
  try {
    number = std::stod(text, &pos);
  } catch (...) {
    return InvalidArgumentError("'" + text + "' is not a quantity (examples: 512Mi, 4Gi, 1G)");
  }
  const std::string suffix = text.substr(pos);
  for (const auto& s : kSuffixes) {
    if (suffix != s.suffix) continue;
    const double bytes = number * static_cast<double>(s.factor);
    if (!std::isfinite(bytes) || bytes < 0) {
      return InvalidArgumentError("'" + text + "' is out of range");
    }
    // 2^63 is the first double an int64 cannot hold (INT64_MAX rounds up to it).
    if (bytes >= kTwoTo63)
      return InvalidArgumentError("'" + text + "' is 2^63 bytes (8Ei) or more");
    return static_cast<int64_t>(std::llround(bytes));
  }
  return InvalidArgumentError("'" + text + "' has an unknown suffix '" + suffix +
                              "' (use Ki, Mi, Gi, Ti, Pi, Ei or k, M, G, T, P, E)");
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
