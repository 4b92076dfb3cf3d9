// compute_device's torch-facing helpers that run on any machine (the GPU ones are in
// cuda_executor_test): how a LibTorch error becomes a Status; the host tensor pool.
#include "agent/executor/compute_device.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace hydra::executor {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

Status Caught(const std::function<void()>& f, const torch::Device& device) {
  try {
    f();
  } catch (const c10::Error& e) {
    return TorchErrorStatus(e, "training step 3 of t-1", device);
  }
  return OkStatus();
}

TEST(TorchErrorStatusTest, RunningOutOfGpuMemoryIsResourceExhaustedWithWhatToChange) {
  // As CUDA's caching allocator throws it.
  const Status s = Caught(
      [] { C10_THROW_ERROR(OutOfMemoryError, "CUDA out of memory. Tried to allocate 2.00 GiB"); },
      torch::Device(torch::kCUDA, 1));
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(s.message(), HasSubstr("training step 3 of t-1 ran out of memory on cuda:1"));
  EXPECT_THAT(s.message(), HasSubstr("Tried to allocate 2.00 GiB"));
  EXPECT_THAT(s.message(), HasSubstr("spec.resources.deviceMemoryBudget"));
}

TEST(TorchErrorStatusTest, RunningOutOfHostMemoryIsResourceExhausted) {
  // A real failure of the CPU allocator: 2^50 floats (4 PiB).
  const Status s = Caught([] { (void)torch::empty({int64_t{1} << 50}); }, torch::kCPU);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(s.message(), HasSubstr("training step 3 of t-1 ran out of host memory"));
  EXPECT_THAT(s.message(), HasSubstr("--host-memory"));
}

TEST(TorchErrorStatusTest, HostMemoryRunningOutUnderAGpuTrialIsNotCalledTheGpus) {
  // The pinned host pool refusing memory (the system is out of it), for a trial on a GPU.
  HostTensorPool pool(torch::kCPU, 0);
  const Status s = Caught([&] { (void)pool.GetOne({int64_t{1} << 60}, torch::kFloat); },
                          torch::Device(torch::kCUDA, 0));
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(s.message(), HasSubstr("ran out of host memory"));
  EXPECT_THAT(s.message(), Not(HasSubstr("deviceMemoryBudget")));
  // The CPU allocator's failure too.
  const Status t =
      Caught([] { (void)torch::empty({int64_t{1} << 50}); }, torch::Device(torch::kCUDA, 0));
  EXPECT_EQ(t.code(), StatusCode::kResourceExhausted) << t;
  EXPECT_THAT(t.message(), HasSubstr("ran out of host memory"));
}

TEST(TorchErrorStatusTest, OtherErrorsAreInternal) {
  const Status s = Caught(
      [] {
        (void)torch::ones({2, 3}).matmul(torch::ones({2, 3}));
      },
      torch::kCPU);
  EXPECT_EQ(s.code(), StatusCode::kInternal) << s;
  EXPECT_THAT(s.message(), HasSubstr("training step 3 of t-1: "));
  EXPECT_THAT(s.message(), HasSubstr("cannot be multiplied"));
}

TEST(HostTensorPoolTest, CarvesTensorsOfTheirShapesAndTypesFromOneSlabOfTheirSize) {
  HostTensorPool pool(torch::kCPU, size_t{1} << 20);
  auto ts = pool.Get({{3, 5}, {7}, {2, 2, 2}}, {torch::kFloat, torch::kBFloat16, torch::kDouble});
  ASSERT_EQ(ts.size(), 3u);
  EXPECT_EQ(ts[0].sizes().vec(), (std::vector<int64_t>{3, 5}));
  EXPECT_EQ(ts[1].scalar_type(), torch::kBFloat16);
  EXPECT_EQ(ts[2].scalar_type(), torch::kDouble);
  for (const auto& t : ts) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data_ptr()) % 64, 0u) << "each at a 64-byte boundary";
  }
  // End to end in one slab, none overlapping: 60 bytes -> 64, 14 -> 64, then the doubles.
  const auto* base = static_cast<const char*>(ts[0].data_ptr());
  EXPECT_EQ(static_cast<const char*>(ts[1].data_ptr()) - base, 64);
  EXPECT_EQ(static_cast<const char*>(ts[2].data_ptr()) - base, 128);
  ts[0].fill_(1);
  ts[1].fill_(2);
  ts[2].fill_(3);
  EXPECT_TRUE(ts[0].eq(1).all().item<bool>());
  EXPECT_TRUE(ts[1].eq(2).all().item<bool>());
  EXPECT_EQ(pool.stats().made, 1);
  // A page (the slab's granule), not the next power of two of what was asked.
  EXPECT_EQ(pool.stats().pooled_bytes, 4096u);
}

TEST(HostTensorPoolTest, ASlabReturnsWhenItsLastTensorGoesAndServesTheSameSizeAgain) {
  HostTensorPool pool(torch::kCPU, size_t{64} << 20);
  const std::vector<std::vector<int64_t>> shapes = {{1024, 1024}, {1024}};
  const std::vector<torch::ScalarType> types = {torch::kFloat, torch::kFloat};
  auto grads = pool.Get(shapes, types);
  const void* first = grads[0].data_ptr();
  torch::Tensor kept = grads[1];
  grads.clear();
  EXPECT_EQ(pool.stats().idle_bytes, 0u) << "one tensor of the slab is still alive";
  kept = torch::Tensor();
  EXPECT_GT(pool.stats().idle_bytes, 0u);
  auto again = pool.Get(shapes, types);  // the next step's gradients
  EXPECT_EQ(again[0].data_ptr(), first);
  EXPECT_EQ(pool.stats().reused, 1);
  EXPECT_EQ(pool.stats().made, 1);
}

TEST(HostTensorPoolTest, PastItsLimitTheMemoryIsPlainAndNotKept) {
  HostTensorPool pool(torch::kCPU, 8192);
  auto a = pool.GetOne({2048}, torch::kFloat);  // 8 KiB: the whole limit
  auto b = pool.GetOne({2048}, torch::kFloat);
  b.fill_(5);
  EXPECT_TRUE(b.eq(5).all().item<bool>());
  EXPECT_EQ(pool.stats().made, 1);
  EXPECT_EQ(pool.stats().unpooled, 1);
  b = torch::Tensor();
  EXPECT_EQ(pool.stats().idle_bytes, 0u);
}

}  // namespace
}  // namespace hydra::executor
