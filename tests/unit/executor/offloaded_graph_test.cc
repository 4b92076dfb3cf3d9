#include "agent/executor/offloaded_graph.h"

#include <gtest/gtest.h>

#include <memory>
#include <set>
#include <vector>

#include "agent/executor/storage_in_place.h"

namespace hydra::executor {
namespace {

/// A LayerNorm -> Linear -> GELU -> Linear forward, the shape of a transformer's MLP.
struct Mlp {
  torch::nn::LayerNorm ln{torch::nn::LayerNormOptions({64})};
  torch::nn::Linear fc{64, 256}, proj{256, 64};
  Mlp() { torch::manual_seed(3); }
  torch::Tensor operator()(const torch::Tensor& x) {
    return proj->forward(torch::gelu(fc->forward(ln->forward(x)), "tanh"));
  }
  std::vector<torch::Tensor> Parameters() {
    std::vector<torch::Tensor> ps;
    for (auto* m :
         {static_cast<torch::nn::Module*>(ln.get()), static_cast<torch::nn::Module*>(fc.get()),
          static_cast<torch::nn::Module*>(proj.get())}) {
      for (auto& p : m->parameters()) ps.push_back(p);
    }
    return ps;
  }
  std::vector<torch::Tensor> Grads() {
    std::vector<torch::Tensor> gs;
    for (auto& p : Parameters()) {
      gs.push_back(p.grad().clone());
      p.mutable_grad() = torch::Tensor();
    }
    return gs;
  }
};

torch::Tensor Input() {
  torch::manual_seed(7);
  return torch::randn({8, 16, 64});
}

/// Whether `t` shares its storage with one of `others`.
bool SharesStorage(const torch::Tensor& t, const std::vector<torch::Tensor>& others) {
  for (const auto& o : others) {
    if (t.storage().unsafeGetStorageImpl() == o.storage().unsafeGetStorageImpl()) return true;
  }
  return false;
}

void ExpectEqual(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << i;
}

/// `mlp`'s forward on `x` inside a SavedTensorCapture: what autograd saved, the output, and
/// what an executor keeps anyway (the parameters, the input and the output).
struct CapturedForward {
  std::vector<torch::Tensor> saved, keep;
  torch::Tensor y;
  CapturedForward(Mlp& mlp, const torch::Tensor& x) {
    {
      SavedTensorCapture capture(&saved);
      y = mlp(x);
    }
    keep = mlp.Parameters();
    keep.push_back(x);
    keep.push_back(y);
  }
};

/// `mlp`'s parameter gradients of the plain forward and backward on `x0`.
std::vector<torch::Tensor> PlainGrads(Mlp& mlp, const torch::Tensor& x0) {
  mlp(x0.clone().requires_grad_(true)).sum().backward();
  return mlp.Grads();
}

class OffloadedGraphTest : public ::testing::Test {
 protected:
  DeviceStreams streams_{torch::kCPU};
  HostTensorPool pool_{torch::kCPU, size_t{64} << 20};
};

TEST_F(OffloadedGraphTest, TheProcessEnginesHooksAreInstalled) {
  EXPECT_TRUE(SavedTensorCaptureAvailable());
}

TEST_F(OffloadedGraphTest, ACapturedForwardMovedOutAndBackGivesTheSameGradients) {
  Mlp mlp;
  const auto x0 = Input();
  const auto expected = PlainGrads(mlp, x0);
  auto x = x0.clone().requires_grad_(true);
  CapturedForward f(mlp, x);
  EXPECT_GT(f.saved.size(), 5u);  // inputs, weights and intermediate values of four operations
  OffloadedGraph graph(f.saved, f.keep, torch::kCPU);
  // LayerNorm's output, fc's output, GELU's output (its statistics too): not the weights.
  EXPECT_GE(graph.storages(), 3u);
  EXPECT_GE(graph.bytes(), 3 * 8 * 16 * 64 * 4);
  graph.MoveOut(streams_, pool_);
  size_t freed = 0;
  for (const auto& t : f.saved) freed += StorageFreedInPlace(t) ? 1 : 0;
  EXPECT_GE(freed, 3u);
  for (const auto& p : mlp.Parameters()) EXPECT_FALSE(StorageFreedInPlace(p));
  EXPECT_FALSE(StorageFreedInPlace(x));
  graph.MoveIn(streams_);
  f.y.sum().backward();
  ExpectEqual(mlp.Grads(), expected);
}

TEST_F(OffloadedGraphTest, WhatTheBackwardReadsIsWhatCameBack) {
  // The same, but the storages come back zeroed instead of copied: the gradients change, so
  // the backward reads the storages the graph saved, not copies of its own.
  Mlp mlp;
  const auto x0 = Input();
  const auto expected = PlainGrads(mlp, x0);
  CapturedForward f(mlp, x0.clone().requires_grad_(true));
  OffloadedGraph graph(f.saved, f.keep, torch::kCPU);
  graph.MoveOut(streams_, pool_);
  graph.MoveIn(streams_);
  {
    torch::NoGradGuard g;
    for (const auto& t : f.saved) {
      if (!SharesStorage(t, f.keep)) t.variable_data().zero_();
    }
  }
  f.y.sum().backward();
  const auto got = mlp.Grads();
  bool differs = false;
  for (size_t i = 0; i < got.size(); ++i) differs = differs || !torch::equal(got[i], expected[i]);
  EXPECT_TRUE(differs);
}

TEST_F(OffloadedGraphTest, OutsideTheScopeNothingIsCapturedAndInsideEveryStorageMoves) {
  Mlp mlp;
  auto x = Input().requires_grad_(true);
  std::vector<torch::Tensor> saved;
  { SavedTensorCapture capture(&saved); }
  mlp(x);  // after the scope: saves as usual
  EXPECT_TRUE(saved.empty());
  CapturedForward f(mlp, x);
  // Every distinct storage, however small (LayerNorm's statistics), moves: the plan counts
  // the whole graph gone from the device.
  std::set<const c10::StorageImpl*> distinct;
  int64_t bytes = 0;
  for (const auto& t : f.saved) {
    if (distinct.insert(t.storage().unsafeGetStorageImpl()).second) {
      bytes += static_cast<int64_t>(t.storage().nbytes());
    }
  }
  OffloadedGraph all(f.saved, {}, torch::kCPU);
  EXPECT_EQ(all.storages(), distinct.size());
  EXPECT_EQ(all.bytes(), bytes);
  // Another device's tensors are not this one's to move.
  OffloadedGraph elsewhere(f.saved, {}, torch::Device(torch::kMeta));
  EXPECT_EQ(elsewhere.storages(), 0u);
}

TEST_F(OffloadedGraphTest, ReleasedBeforeTheBackwardItsStoragesGoWithTheGraph) {
  // The host copies wait for the copy in; the device memory must not wait with them. Released
  // once compute waits for the copy in, the graph alone holds the storages, so the backward
  // frees each once it has read it (as the plan counts), not at its end.
  Mlp mlp;
  CapturedForward f(mlp, Input().requires_grad_(true));
  auto graph = std::make_unique<OffloadedGraph>(f.saved, f.keep, torch::kCPU);
  std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>> moved;
  for (const auto& t : f.saved) {
    if (!SharesStorage(t, f.keep)) moved.push_back(t.storage().getWeakStorageImpl());
  }
  ASSERT_FALSE(moved.empty());
  f.saved.clear();
  graph->MoveOut(streams_, pool_);
  graph->MoveIn(streams_);
  graph->ReleaseDevice();
  for (const auto& w : moved) EXPECT_FALSE(w.expired());  // the graph still needs them
  f.y.sum().backward();
  f.y = torch::Tensor();
  for (const auto& w : moved) EXPECT_TRUE(w.expired());  // `graph` (its host copies) lives on
}

}  // namespace
}  // namespace hydra::executor
