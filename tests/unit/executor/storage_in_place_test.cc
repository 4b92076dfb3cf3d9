#include "agent/executor/storage_in_place.h"

#include <gtest/gtest.h>

namespace hydra::executor {
namespace {

/// A linear layer's loss on a 3-D input (the GEMM saves a transposed view of the weight) and a
/// LayerNorm's (it saves the weight itself).
torch::Tensor Loss(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& g) {
  auto h = torch::nn::functional::linear(x, w, torch::zeros({w.size(0)}));
  return torch::layer_norm(h, {w.size(0)}, g).tanh().sum();
}

TEST(StorageInPlaceTest, AGraphReadsTheRefilledStorageOfWhatItSaved) {
  torch::manual_seed(1);
  const auto x = torch::randn({2, 5, 4});
  auto w = torch::randn({3, 4}).requires_grad_(true);
  auto g = torch::randn({3}).requires_grad_(true);
  Loss(x, w, g).backward();
  const auto expected_w = w.grad().clone(), expected_g = g.grad().clone();
  w.mutable_grad() = torch::Tensor();
  g.mutable_grad() = torch::Tensor();

  const auto values_w = w.detach().clone(), values_g = g.detach().clone();
  auto loss = Loss(x, w, g);
  const auto version = w._version();
  for (const auto& t : {w, g}) {
    FreeStorageInPlace(t);
    EXPECT_TRUE(StorageFreedInPlace(t));
    EXPECT_EQ(t.storage().nbytes(), 0u);
    EXPECT_EQ(t.storage().data(), nullptr);
  }
  EXPECT_EQ(w.sizes(), (std::vector<int64_t>{3, 4}));
  RefillStorage(w);
  RefillStorage(g);
  EXPECT_FALSE(StorageFreedInPlace(w));
  {
    torch::NoGradGuard no_grad;
    w.variable_data().copy_(values_w);
    g.variable_data().copy_(values_g);
  }
  EXPECT_EQ(w._version(), version);
  loss.backward();  // would throw had the refill bumped the saved tensors' versions
  EXPECT_TRUE(torch::equal(w.grad(), expected_w));
  EXPECT_TRUE(torch::equal(g.grad(), expected_g));
}

TEST(StorageInPlaceTest, OnlyAFreedStorageIsRefilled) {
  auto t = torch::ones({2, 2});
  EXPECT_FALSE(StorageFreedInPlace(t));
  EXPECT_FALSE(StorageFreedInPlace(torch::empty({0})));
  EXPECT_FALSE(StorageFreedInPlace(torch::Tensor()));
  EXPECT_THROW(RefillStorage(t), c10::Error);
  EXPECT_THROW(FreeStorageInPlace(t.t()), c10::Error);  // not contiguous
}

}  // namespace
}  // namespace hydra::executor
