#include "agent/executor/selective_recompute.h"

#include <gtest/gtest.h>

#include <set>
#include <vector>

#include "agent/executor/offloaded_graph.h"
#include "agent/executor/precision.h"

namespace hydra::executor {
namespace {

struct Case {
  Recomputed pre;
  int64_t in, out;
};

/// The inputs of one case, seeded: x [4, 8, in], pre's weight and bias (LayerNorm), the
/// product's weight and bias.
struct Inputs {
  torch::Tensor x, pre_w, pre_b, w, b;
  explicit Inputs(const Case& c) {
    torch::manual_seed(5);
    x = torch::randn({4, 8, c.in}).requires_grad_(true);
    if (c.pre == Recomputed::kLayerNorm) {
      pre_w = (1 + 0.1 * torch::randn({c.in})).requires_grad_(true);
      pre_b = (0.1 * torch::randn({c.in})).requires_grad_(true);
    }
    w = (0.1 * torch::randn({c.out, c.in})).requires_grad_(true);
    b = (0.1 * torch::randn({c.out})).requires_grad_(true);
  }
  std::vector<torch::Tensor> Grads() const {
    std::vector<torch::Tensor> g;
    for (const auto* t : {&x, &pre_w, &pre_b, &w, &b}) {
      if (t->defined()) g.push_back(t->grad());
    }
    return g;
  }
};

torch::Tensor Plain(const Case& c, const Inputs& i) {
  const torch::Tensor p = c.pre == Recomputed::kLayerNorm
                              ? torch::layer_norm(i.x, {c.in}, i.pre_w, i.pre_b, 1e-5)
                              : torch::gelu(i.x, "tanh");
  return torch::linear(p, i.w, i.b);
}

torch::Tensor Selective(const Case& c, const Inputs& i) {
  return LinearOfRecomputed(c.pre, i.x, i.pre_w, i.pre_b, 1e-5, i.w, i.b);
}

const std::vector<Case> kCases = {{Recomputed::kLayerNorm, 32, 96},
                                  {Recomputed::kGeluTanh, 64, 16}};

TEST(SelectiveRecomputeTest, OutputsAndGradientsAreThoseOfTheLayersThemselves) {
  for (const Precision precision : {Precision::kFp32, Precision::kBf16}) {
    for (const Case& c : kCases) {
      SCOPED_TRACE(std::string(PrecisionName(precision)) +
                   (c.pre == Recomputed::kLayerNorm ? " LayerNorm" : " GELU"));
      auto run = [&](bool selective) {
        Inputs in(c);
        torch::Tensor y;
        {
          PrecisionScope scope(precision, torch::kCPU);
          y = selective ? Selective(c, in) : Plain(c, in);
        }
        (y.to(torch::kFloat) * torch::linspace(-1, 1, y.numel()).view(y.sizes())).sum().backward();
        std::vector<torch::Tensor> out = {y.detach()};
        for (const auto& g : in.Grads()) out.push_back(g);
        return out;
      };
      const auto got = run(true), want = run(false);
      ASSERT_EQ(got.size(), want.size());
      EXPECT_EQ(got[0].scalar_type(), want[0].scalar_type());
      EXPECT_TRUE(torch::equal(got[0], want[0]));
      const double tol = precision == Precision::kFp32 ? 1e-6 : 1e-2;
      for (size_t k = 1; k < got.size(); ++k) {
        ASSERT_TRUE(got[k].defined()) << k;
        EXPECT_EQ(got[k].scalar_type(), want[k].scalar_type()) << k;
        EXPECT_TRUE(torch::allclose(got[k], want[k], tol, tol))
            << k << ": largest difference " << (got[k] - want[k]).abs().max().item<double>();
      }
    }
  }
}

/// Bytes of the distinct storages a forward saves for backward, other than `params`'.
int64_t SavedActivationBytes(const std::vector<torch::Tensor>& saved,
                             const std::vector<torch::Tensor>& params) {
  std::set<const c10::StorageImpl*> seen;
  for (const auto& p : params) {
    if (p.defined()) seen.insert(p.storage().unsafeGetStorageImpl());
  }
  int64_t bytes = 0;
  for (const auto& t : saved) {
    if (seen.insert(t.storage().unsafeGetStorageImpl()).second) {
      bytes += static_cast<int64_t>(t.storage().nbytes());
    }
  }
  return bytes;
}

TEST(SelectiveRecomputeTest, TheGraphKeepsTheInputNotTheElementwiseOutput) {
  ASSERT_TRUE(SavedTensorCaptureAvailable());
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.pre == Recomputed::kLayerNorm ? "LayerNorm" : "GELU");
    auto saved_bytes = [&](bool selective) {
      Inputs in(c);
      std::vector<torch::Tensor> saved;
      torch::Tensor y;
      {
        SavedTensorCapture capture(&saved);
        y = selective ? Selective(c, in) : Plain(c, in);
      }
      return SavedActivationBytes(saved, {in.pre_w, in.pre_b, in.w, in.b});
    };
    const int64_t elementwise_output = 4 * 8 * c.in * 4;  // what pre produces, fp32
    const int64_t plain = saved_bytes(false), selective = saved_bytes(true);
    EXPECT_GE(plain - selective, elementwise_output) << plain << " against " << selective;
    EXPECT_GE(selective, elementwise_output);  // x itself stays
  }
}

}  // namespace
}  // namespace hydra::executor
