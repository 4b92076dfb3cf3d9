// compute_device's torch-facing helpers that run on any machine (the GPU ones are in
// cuda_executor_test): how a LibTorch error becomes a Status.
#include "agent/executor/compute_device.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace hydra::executor {
namespace {

using ::testing::HasSubstr;

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

}  // namespace
}  // namespace hydra::executor
