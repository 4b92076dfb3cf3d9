#include "common/random_search.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace hydra {
namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

/// FNV-1a of the field's name: a stream per field, whatever other fields are searched.
uint64_t NameHash(const std::string& name) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : name) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

/// A uniform integer in [0, n) from 64 random bits (multiply-shift; n <= 2^63).
uint64_t Below(uint64_t bits, uint64_t n) {
  return static_cast<uint64_t>((static_cast<unsigned __int128>(bits) * n) >> 64);
}

/// [0, 1) from the top 53 bits.
double Unit(uint64_t bits) { return static_cast<double>(bits >> 11) * 0x1.0p-53; }

double RoundTo6Digits(double v, double low, double high) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.6g", v);
  return std::clamp(std::strtod(buf, nullptr), low, high);
}

double AsDouble(const ParamValue& v) {
  if (const auto* d = std::get_if<double>(&v)) return *d;
  if (const auto* i = std::get_if<int64_t>(&v)) return static_cast<double>(*i);
  return 0;
}

}  // namespace

const char* DistributionName(Distribution d) {
  switch (d) {
    case Distribution::kUniform: return "uniform";
    case Distribution::kLogUniform: return "logUniform";
    case Distribution::kIntUniform: return "intUniform";
    case Distribution::kChoice: return "choice";
  }
  return "choice";
}

ParamValue DrawValue(const RandomAxis& axis, int64_t seed, int64_t index) {
  uint64_t x = SplitMix64(static_cast<uint64_t>(seed));
  x = SplitMix64(x ^ static_cast<uint64_t>(index));
  x = SplitMix64(x ^ NameHash(axis.field));
  switch (axis.distribution) {
    case Distribution::kChoice:
      if (axis.choices.empty()) return int64_t{0};
      return axis.choices[Below(x, axis.choices.size())];
    case Distribution::kIntUniform: {
      const int64_t low = std::get<int64_t>(axis.low), high = std::get<int64_t>(axis.high);
      // high - low + 1 fits in uint64: the parser keeps both within a field's range (the
      // widest, seed, is 0..9.2e18 < 2^63), and Below takes n <= 2^63.
      const uint64_t n = static_cast<uint64_t>(high - low) + 1;
      return low + static_cast<int64_t>(Below(x, n));
    }
    case Distribution::kUniform: {
      const double low = AsDouble(axis.low), high = AsDouble(axis.high);
      return RoundTo6Digits(low + Unit(x) * (high - low), low, high);
    }
    case Distribution::kLogUniform: {
      const double low = AsDouble(axis.low), high = AsDouble(axis.high);
      const double v = std::exp(std::log(low) + Unit(x) * (std::log(high) - std::log(low)));
      return RoundTo6Digits(v, low, high);
    }
  }
  return int64_t{0};
}

}  // namespace hydra
