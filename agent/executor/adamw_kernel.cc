#include "agent/executor/adamw_kernel.h"

#include <cmath>

// Built with -O3 -fno-math-errno -ffp-contract=off (CMakeLists.txt): the loop vectorizes (with
// errno, std::sqrt keeps a branch to the library call per element, and -O2 leaves the loop
// scalar), and no multiply and add are contracted into one rounding, which would change bits
// between the instruction sets.

namespace hydra::executor {
namespace {

/// torch.optim.AdamW's operations on element i, in its order.
inline __attribute__((always_inline)) void Element(float* p, const float* g, float* m, float* v,
                                                   int64_t i, const AdamWScalars& s,
                                                   float one_minus_beta1, float one_minus_beta2) {
  const float gi = g[i];
  float mi = m[i] * s.beta1;
  mi = mi + one_minus_beta1 * gi;
  float vi = v[i] * s.beta2;
  vi = vi + one_minus_beta2 * gi * gi;
  const float denom = std::sqrt(vi) / s.bc2_sqrt + s.eps;
  m[i] = mi;
  v[i] = vi;
  p[i] = p[i] * s.decay_factor + (-s.step_size) * mi / denom;
}

inline __attribute__((always_inline)) void Loop(float* __restrict p, const float* __restrict g,
                                                float* __restrict m, float* __restrict v, int64_t n,
                                                const AdamWScalars& s) {
  const AdamWScalars k = s;  // by value: the stores cannot alias the scalars
  const float one_minus_beta1 = 1.0f - k.beta1;
  const float one_minus_beta2 = 1.0f - k.beta2;
  for (int64_t i = 0; i < n; ++i) Element(p, g, m, v, i, k, one_minus_beta1, one_minus_beta2);
}

/// Not inlined into a loop: the compiler cannot vectorize calls of it.
__attribute__((noinline)) void ScalarElement(float* p, const float* g, float* m, float* v,
                                             int64_t i, const AdamWScalars& s,
                                             float one_minus_beta1, float one_minus_beta2) {
  Element(p, g, m, v, i, s, one_minus_beta1, one_minus_beta2);
}

void UpdateScalar(float* p, const float* g, float* m, float* v, int64_t n, const AdamWScalars& s) {
  for (int64_t i = 0; i < n; ++i) ScalarElement(p, g, m, v, i, s, 1.0f - s.beta1, 1.0f - s.beta2);
}

void UpdateSse2(float* p, const float* g, float* m, float* v, int64_t n, const AdamWScalars& s) {
  Loop(p, g, m, v, n, s);
}

#if defined(__x86_64__) && defined(__GNUC__)
#define HYDRA_ADAMW_X86 1
__attribute__((target("avx2"))) void UpdateAvx2(float* p, const float* g, float* m, float* v,
                                                int64_t n, const AdamWScalars& s) {
  Loop(p, g, m, v, n, s);
}

__attribute__((target("avx512f"))) void UpdateAvx512(float* p, const float* g, float* m, float* v,
                                                     int64_t n, const AdamWScalars& s) {
  Loop(p, g, m, v, n, s);
}
#endif

}  // namespace

const char* AdamWIsaName(AdamWIsa isa) {
  switch (isa) {
    case AdamWIsa::kScalar: return "scalar";
    case AdamWIsa::kSse2: return "sse2";
    case AdamWIsa::kAvx2: return "avx2";
    case AdamWIsa::kAvx512: return "avx512";
  }
  return "?";
}

std::vector<AdamWIsa> SupportedAdamWIsas() {
  std::vector<AdamWIsa> out = {AdamWIsa::kScalar, AdamWIsa::kSse2};
#ifdef HYDRA_ADAMW_X86
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2")) out.push_back(AdamWIsa::kAvx2);
  if (__builtin_cpu_supports("avx512f")) out.push_back(AdamWIsa::kAvx512);
#endif
  return out;
}

AdamWIsa BestAdamWIsa() {
  static const AdamWIsa best = SupportedAdamWIsas().back();
  return best;
}

void AdamWUpdate(AdamWIsa isa, float* p, const float* g, float* m, float* v, int64_t n,
                 const AdamWScalars& s) {
  switch (isa) {
    case AdamWIsa::kScalar: return UpdateScalar(p, g, m, v, n, s);
    case AdamWIsa::kSse2: return UpdateSse2(p, g, m, v, n, s);
#ifdef HYDRA_ADAMW_X86
    case AdamWIsa::kAvx2: return UpdateAvx2(p, g, m, v, n, s);
    case AdamWIsa::kAvx512: return UpdateAvx512(p, g, m, v, n, s);
#else
    case AdamWIsa::kAvx2:
    case AdamWIsa::kAvx512: return UpdateSse2(p, g, m, v, n, s);
#endif
  }
}

void AdamWUpdate(float* p, const float* g, float* m, float* v, int64_t n, const AdamWScalars& s) {
  AdamWUpdate(BestAdamWIsa(), p, g, m, v, n, s);
}

}  // namespace hydra::executor
