#include "common/devices.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace hydra {
namespace {

using ::testing::HasSubstr;

const std::vector<GpuInfo> kTwoGpus = {
    {0, "NVIDIA H100 80GB HBM3", "GPU-5f6c0f5e-1b1e-3c0a-9b4e-0a1b2c3d4e5f", int64_t{80} << 30,
     int64_t{79} << 30},
    {2, "NVIDIA H100 80GB HBM3", "GPU-0000aaaa-1b1e-3c0a-9b4e-0a1b2c3d4e5f", int64_t{80} << 30,
     int64_t{10} << 30}};

StatusOr<std::vector<DeviceSpec>> Resolve(const std::string& flag,
                                          const StatusOr<std::vector<GpuInfo>>& gpus = kTwoGpus) {
  auto request = ParseDevicesRequest(flag);
  if (!request.ok()) return request.status();
  return ResolveDevices(*request, 1000, gpus);
}

TEST(DevicesFlagTest, CpuDevicesWithAndWithoutBudget) {
  auto d = Resolve("cpu:2");
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->size(), 2u);
  EXPECT_EQ((*d)[1].name, "cpu:1");
  EXPECT_EQ((*d)[1].kind, DeviceKind::kCpu);
  EXPECT_EQ((*d)[1].memory_bytes, 1000);
  auto b = Resolve("cpu:1,budget=4Gi", Status(StatusCode::kFailedPrecondition, "no CUDA"));
  ASSERT_TRUE(b.ok()) << "CPU devices never look at GPUs: " << b.status();
  EXPECT_EQ((*b)[0].memory_bytes, int64_t{4} << 30);
}

TEST(DevicesFlagTest, EveryVisibleGpuOrTheNamedOnes) {
  auto all = Resolve("cuda");
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ((*all)[1].name, "cuda:2");
  EXPECT_EQ((*all)[1].kind, DeviceKind::kCuda);
  EXPECT_EQ((*all)[1].index, 2);
  EXPECT_EQ((*all)[1].uuid, kTwoGpus[1].uuid);
  EXPECT_EQ((*all)[1].model, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ((*all)[1].memory_bytes, static_cast<int64_t>(0.9 * (int64_t{10} << 30)))
      << "by default 90% of what is free now";
  auto named = Resolve("cuda:2,0,budget=20Gi");
  ASSERT_TRUE(named.ok()) << named.status();
  ASSERT_EQ(named->size(), 2u);
  EXPECT_EQ((*named)[0].name, "cuda:2") << "in the order given";
  EXPECT_EQ((*named)[0].memory_bytes, int64_t{20} << 30);
  EXPECT_EQ((*named)[1].memory_bytes, int64_t{20} << 30);
  auto one = Resolve("cuda:0");
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->size(), 1u);
}

TEST(DevicesFlagTest, FreeMemoryReadByNvmlLeavesRoomForThisProcesssContext) {
  // NVML reads it before this process has a CUDA context on the GPU; cudaMemGetInfo after.
  std::vector<GpuInfo> gpus = kTwoGpus;
  gpus[1].free_from = GpuInfo::FreeMemorySource::kNvml;
  auto d = Resolve("cuda", gpus);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ((*d)[0].memory_bytes, static_cast<int64_t>(0.9 * (int64_t{79} << 30)));
  EXPECT_EQ(
      (*d)[1].memory_bytes,
      static_cast<int64_t>(0.9 * static_cast<double>((int64_t{10} << 30) - kCudaContextBytes)));
}

TEST(DevicesFlagTest, MistakesAreNamed) {
  for (const char* bad :
       {"gpu:1", "cpu:", "cpu:0", "cpu:x", "cpu:2,budget=", "cpu:2,budget=-1Gi", "cpu:2,size=1Gi",
        "cpu:5000", "", "cpu:2,", "cuda:", "cuda:-1", "cuda:0,0", "cuda,1", "cpu:2,1",
        "cuda:0,budget=1Gi,1", "cuda,budget=1Gi,budget=2Gi", "cuda:x"}) {
    auto d = ParseDevicesRequest(bad);
    EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(d.status().message(), HasSubstr("--devices")) << bad;
    EXPECT_THAT(d.status().message(), HasSubstr("expected cpu:N")) << bad;
  }
}

TEST(DevicesFlagTest, GpusThatAreNotThereOrTooSmallAreNamed) {
  auto missing = Resolve("cuda:1");
  EXPECT_EQ(missing.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(missing.status().message(),
              HasSubstr("no cuda:1; the visible GPUs are cuda:0, cuda:2"));
  auto big = Resolve("cuda:0,budget=81Gi");
  EXPECT_EQ(big.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(big.status().message(), HasSubstr("more than cuda:0 (NVIDIA H100 80GB HBM3) has"));
  auto none = Resolve("cuda", std::vector<GpuInfo>{});
  EXPECT_EQ(none.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(none.status().message(), HasSubstr("no GPU is visible"));
  auto no_cuda = Resolve("cuda", Status(StatusCode::kFailedPrecondition, "built without CUDA"));
  EXPECT_EQ(no_cuda.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(no_cuda.status().message(), HasSubstr("--devices: built without CUDA"));
  std::vector<GpuInfo> full = kTwoGpus;
  full[0].free_bytes = 0;
  auto busy = Resolve("cuda:0", full);
  EXPECT_EQ(busy.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(busy.status().message(), HasSubstr("no free memory"));
}

TEST(DevicesFlagTest, GpuUuidsAreWrittenAsNvidiaSmiWritesThem) {
  const unsigned char bytes[16] = {0x5f, 0x6c, 0x0f, 0x5e, 0x1b, 0x1e, 0x3c, 0x0a,
                                   0x9b, 0x4e, 0x0a, 0x1b, 0x2c, 0x3d, 0x4e, 0xff};
  EXPECT_EQ(FormatGpuUuid(bytes), "GPU-5f6c0f5e-1b1e-3c0a-9b4e-0a1b2c3d4eff");
}

}  // namespace
}  // namespace hydra
