#include "agent/executor/adamw_kernel.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

namespace hydra::executor {
namespace {

struct Arrays {
  std::vector<float> p, g, m, v;
};

/// n elements of each array, drawn: weights and gradients over several magnitudes (zero, tiny,
/// large), moments as after some steps (v >= 0).
Arrays Draw(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-30, 10);
  Arrays a;
  for (size_t i = 0; i < n; ++i) {
    const float scale = std::ldexp(1.0f, exponent(rng));
    a.p.push_back(normal(rng));
    a.g.push_back(i % 13 == 0 ? 0.0f : normal(rng) * scale);
    a.m.push_back(normal(rng) * 1e-3f);
    a.v.push_back(std::abs(normal(rng)) * 1e-6f);
  }
  return a;
}

/// torch.optim.AdamW's single-tensor update of one element, written out here, independently of
/// the kernel (float operations in torch's order, one rounding each).
void Oracle(Arrays* a, size_t i, const AdamWScalars& s) {
  const float g = a->g[i];
  const float m = a->m[i] * s.beta1 + (1.0f - s.beta1) * g;
  const float v = a->v[i] * s.beta2 + (1.0f - s.beta2) * g * g;
  const float denom = std::sqrt(v) / s.bc2_sqrt + s.eps;
  a->m[i] = m;
  a->v[i] = v;
  a->p[i] = a->p[i] * s.decay_factor + (-s.step_size) * m / denom;
}

bool SameBits(const std::vector<float>& x, const std::vector<float>& y, size_t* first) {
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::memcmp(&x[i], &y[i], sizeof(float)) != 0) {
      *first = i;
      return false;
    }
  }
  return x.size() == y.size();
}

void ExpectSameBits(const Arrays& got, const Arrays& want, const std::string& what) {
  size_t i = 0;
  EXPECT_TRUE(SameBits(got.p, want.p, &i))
      << what << ": weight " << i << " " << got.p[i] << " against " << want.p[i];
  EXPECT_TRUE(SameBits(got.m, want.m, &i)) << what << ": exp_avg " << i;
  EXPECT_TRUE(SameBits(got.v, want.v, &i)) << what << ": exp_avg_sq " << i;
}

AdamWScalars StepScalars(int step, float lr, float weight_decay) {
  AdamWScalars s;
  s.decay_factor = 1.0f - lr * weight_decay;
  s.step_size = lr / static_cast<float>(1.0 - std::pow(0.9, step));
  s.bc2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(0.999, step)));
  return s;
}

TEST(AdamWKernelTest, TheReferenceAndTheScalarIsaAreListedFirst) {
  const auto isas = SupportedAdamWIsas();
  ASSERT_GE(isas.size(), 2u);
  EXPECT_EQ(isas[0], AdamWIsa::kScalar);
  EXPECT_EQ(isas[1], AdamWIsa::kSse2);
  EXPECT_EQ(BestAdamWIsa(), isas.back());
}

// Every length around the vectors' widths (their loops' remainders), and starts off the
// vectors' alignment: every instruction set this CPU runs gives the oracle's bits.
TEST(AdamWKernelTest, EveryInstructionSetGivesTheSameBitsAsTorchsOrderOfOperations) {
  for (const AdamWIsa isa : SupportedAdamWIsas()) {
    for (size_t n : {0u, 1u, 3u, 4u, 7u, 8u, 15u, 16u, 17u, 31u, 33u, 64u, 1000u, 4099u}) {
      for (size_t offset : {0u, 1u, 3u}) {
        Arrays want = Draw(n + offset, static_cast<uint32_t>(n * 7 + offset));
        Arrays got = want;
        for (int step = 1; step <= 3; ++step) {
          const AdamWScalars s = StepScalars(step, 1e-3f * static_cast<float>(step), 0.1f);
          for (size_t i = offset; i < n + offset; ++i) Oracle(&want, i, s);
          AdamWUpdate(isa, got.p.data() + offset, got.g.data() + offset, got.m.data() + offset,
                      got.v.data() + offset, static_cast<int64_t>(n), s);
        }
        ExpectSameBits(got, want,
                       std::string(AdamWIsaName(isa)) + " n=" + std::to_string(n) +
                           " offset=" + std::to_string(offset));
      }
    }
  }
}

TEST(AdamWKernelTest, ElementsOutsideTheRangeAreUntouched) {
  for (const AdamWIsa isa : SupportedAdamWIsas()) {
    Arrays a = Draw(40, 5);
    const Arrays before = a;
    AdamWUpdate(isa, a.p.data() + 4, a.g.data() + 4, a.m.data() + 4, a.v.data() + 4, 19,
                StepScalars(1, 1e-2f, 0.0f));
    for (size_t i = 0; i < 40; ++i) {
      const bool inside = i >= 4 && i < 23;
      EXPECT_EQ(a.p[i] != before.p[i] || a.m[i] != before.m[i], inside)
          << AdamWIsaName(isa) << " element " << i;
    }
  }
}

TEST(AdamWKernelTest, WithoutDecayOrGradientTheWeightsStay) {
  Arrays a = Draw(100, 9);
  for (auto& g : a.g) g = 0.0f;
  for (auto& m : a.m) m = 0.0f;
  const Arrays before = a;
  AdamWUpdate(a.p.data(), a.g.data(), a.m.data(), a.v.data(), 100, StepScalars(1, 1e-2f, 0.0f));
  size_t i = 0;
  EXPECT_TRUE(SameBits(a.p, before.p, &i)) << i;
}

}  // namespace
}  // namespace hydra::executor
