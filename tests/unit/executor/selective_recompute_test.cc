#include "agent/executor/selective_recompute.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <set>
#include <string>
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
  Inputs(const Case& c, const torch::Device& device) {
    torch::manual_seed(5);
    auto on = [&](const torch::Tensor& t) { return t.to(device).requires_grad_(true); };
    x = on(torch::randn({4, 8, c.in}));
    if (c.pre == Recomputed::kLayerNorm) {
      pre_w = on(1 + 0.1 * torch::randn({c.in}));
      pre_b = on(0.1 * torch::randn({c.in}));
    }
    w = on(0.1 * torch::randn({c.out, c.in}));
    b = on(0.1 * torch::randn({c.out}));
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

/// The devices to compare on: the CPU, and the first GPU where there is one.
std::vector<torch::Device> Devices() {
  std::vector<torch::Device> d = {torch::kCPU};
  if (torch::cuda::is_available()) d.emplace_back(torch::kCUDA, 0);
  return d;
}

TEST(SelectiveRecomputeTest, OutputsAndGradientsAreThoseOfTheLayersThemselves) {
  // On the CPU the function's backward makes the calls autograd makes for the layers (the same
  // products of the same operands in the same layouts), so its gradients are the layers' own
  // bit for bit, in bf16 autocast too. On a GPU gpu-check.sh reports the largest differences (in
  // bf16 on an H200 training with the function drifted from training without it).
  for (const torch::Device& device : Devices()) {
    for (const Precision precision : {Precision::kFp32, Precision::kBf16}) {
      for (const Case& c : kCases) {
        const std::string what = device.str() + " " + PrecisionName(precision) +
                                 (c.pre == Recomputed::kLayerNorm ? " LayerNorm" : " GELU");
        SCOPED_TRACE(what);
        auto run = [&](bool selective) {
          Inputs in(c, device);
          torch::Tensor y;
          {
            PrecisionScope scope(precision, device.type());
            y = selective ? Selective(c, in) : Plain(c, in);
          }
          const auto weights = torch::linspace(-1, 1, y.numel()).view(y.sizes()).to(device);
          (y.to(torch::kFloat) * weights).sum().backward();
          std::vector<torch::Tensor> out = {y.detach()};
          for (const auto& g : in.Grads()) out.push_back(g);
          return out;
        };
        const auto got = run(true), want = run(false);
        ASSERT_EQ(got.size(), want.size());
        EXPECT_EQ(got[0].scalar_type(), want[0].scalar_type());
        EXPECT_TRUE(torch::equal(got[0], want[0]));
        const double tol = device.is_cpu() ? 0 : precision == Precision::kFp32 ? 1e-5 : 1e-2;
        std::string largest;
        for (size_t k = 1; k < got.size(); ++k) {
          ASSERT_TRUE(got[k].defined()) << k;
          EXPECT_EQ(got[k].scalar_type(), want[k].scalar_type()) << k;
          const double diff = (got[k] - want[k]).abs().max().item<double>();
          largest += " " + std::to_string(diff);
          EXPECT_TRUE(device.is_cpu() ? torch::equal(got[k], want[k])
                                      : torch::allclose(got[k], want[k], tol, tol))
              << k << ": largest difference " << diff;
        }
        if (!device.is_cpu())
          std::printf("compute selective recompute %s: largest gradient differences%s\n",
                      what.c_str(), largest.c_str());
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
      Inputs in(c, torch::kCPU);
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
