// GPU discovery and the devices the executors accept. Runs in every build: the CPU build
// (no CUDA compiled in), the CUDA build on a machine without a GPU (CI), and on a GPU
// (scripts/gpu-check.sh), asserting what each must do.
#include "agent/executor/gpus.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace hydra::executor {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

TEST(GpusTest, CpuDevicesNeverLookForAGpu) {
  auto d = FindDevices(*ParseDevicesRequest("cpu:2,budget=1Gi"), 1000);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->size(), 2u);
  EXPECT_TRUE(CheckExecutorsCanUse(*d).ok());
}

TEST(GpusTest, DiscoveryMatchesTheBuildAndTheMachine) {
  auto gpus = DiscoverGpus();
  if (!CudaCompiledIn()) {
    ASSERT_EQ(gpus.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_THAT(gpus.status().message(), HasSubstr("scripts/build-cuda.sh"));
    auto d = FindDevices(*ParseDevicesRequest("cuda"), 1000);
    EXPECT_EQ(d.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_THAT(d.status().message(), HasSubstr("--devices: this build has no CUDA"));
    return;
  }
  if (!gpus.ok()) {  // the CUDA build where no driver is installed (CI)
    EXPECT_EQ(gpus.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_THAT(gpus.status().message(), HasSubstr("driver"));
    GTEST_SKIP() << "no usable CUDA driver here: " << gpus.status();
  }
  if (gpus->empty()) {
    auto d = FindDevices(*ParseDevicesRequest("cuda"), 1000);
    EXPECT_EQ(d.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_THAT(d.status().message(), HasSubstr("no GPU is visible"));
    GTEST_SKIP() << "the driver sees no GPU";
  }
  for (const auto& g : *gpus) {
    EXPECT_FALSE(g.name.empty());
    EXPECT_THAT(g.uuid, StartsWith("GPU-"));
    EXPECT_EQ(g.uuid.size(), 40u) << g.uuid;
    EXPECT_GT(g.total_bytes, 0);
    EXPECT_GT(g.free_bytes, 0);
    EXPECT_LE(g.free_bytes, g.total_bytes);
  }
  auto d = FindDevices(*ParseDevicesRequest("cuda"), 1000);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->size(), gpus->size());
  EXPECT_EQ(d->front().uuid, gpus->front().uuid);
}

TEST(GpusTest, TheExecutorsTrainOnCudaDevicesOnlyInACudaBuild) {
  DeviceSpec gpu;
  gpu.kind = DeviceKind::kCuda;
  gpu.name = "cuda:0";
  gpu.model = "NVIDIA H100 80GB HBM3";
  gpu.memory_bytes = int64_t{70} << 30;
  const Status s = CheckExecutorsCanUse({gpu});
  if (CudaCompiledIn()) {
    EXPECT_TRUE(s.ok()) << s;
    return;
  }
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("cuda:0 (NVIDIA H100 80GB HBM3"));
  EXPECT_THAT(s.message(), HasSubstr("scripts/build-cuda.sh"));
  EXPECT_THAT(s.message(), HasSubstr("--devices cpu:N"));
}

}  // namespace
}  // namespace hydra::executor
