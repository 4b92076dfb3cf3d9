// common/nvml against a fake libnvidia-ml.so.1 (tests/fakes/fake_nvml.cc, built as a shared
// library), and against the real driver's where the machine has one (scripts/gpu-check.sh).
#include "common/nvml.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <iostream>

namespace hydra {
namespace {

using ::testing::HasSubstr;

class NvmlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ::setenv("HYDRA_FAKE_NVML_GPUS",
             "GPU-11111111-2222-3333-4444-555555555555,NVIDIA H100 80GB HBM3,85899345920,"
             "84000000000,1899345920;"
             "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee,NVIDIA H100 80GB HBM3,85899345920,"
             "40000000000,45899345920",
             1);
  }
  void TearDown() override {
    ::unsetenv("HYDRA_FAKE_NVML_GPUS");
    ::unsetenv("HYDRA_FAKE_NVML_INIT_ERROR");
    ::unsetenv("HYDRA_FAKE_NVML_LOST_GPU");
  }
};

TEST_F(NvmlTest, AMachineWithoutTheDriverIsNotFound) {
  auto nvml = Nvml::Open("/nonexistent/libnvidia-ml.so.1");
  ASSERT_EQ(nvml.status().code(), StatusCode::kNotFound) << nvml.status();
  EXPECT_THAT(nvml.status().message(), HasSubstr("/nonexistent/libnvidia-ml.so.1"));
  EXPECT_THAT(nvml.status().message(), HasSubstr("no NVIDIA driver"));
}

TEST_F(NvmlTest, ListsEveryGpuWithItsMemory) {
  auto nvml = Nvml::Open(FAKE_NVML_PATH);
  ASSERT_TRUE(nvml.ok()) << nvml.status();
  auto gpus = (*nvml)->Gpus();
  ASSERT_TRUE(gpus.ok()) << gpus.status();
  ASSERT_EQ(gpus->size(), 2u);
  EXPECT_EQ((*gpus)[0].index, 0u);
  EXPECT_EQ((*gpus)[0].name, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ((*gpus)[0].uuid, "GPU-11111111-2222-3333-4444-555555555555");
  EXPECT_EQ((*gpus)[0].total_bytes, 85899345920);
  EXPECT_EQ((*gpus)[0].free_bytes, 84000000000);
  EXPECT_EQ((*gpus)[0].used_bytes, 1899345920);
  EXPECT_EQ((*gpus)[1].index, 1u);
  EXPECT_EQ((*gpus)[1].free_bytes, 40000000000);
  EXPECT_EQ(*(*nvml)->DriverVersion(), "580.95.05");
  EXPECT_EQ(DescribeNvmlGpus(*gpus),
            "NVIDIA H100 80GB HBM3 (GPU-11111111-2222-3333-4444-555555555555), "
            "NVIDIA H100 80GB HBM3 (GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee)");
}

TEST_F(NvmlTest, TwoUsersInOneProcessEachInitialiseAndShutDown) {
  auto first = Nvml::Open(FAKE_NVML_PATH);
  auto second = Nvml::Open(FAKE_NVML_PATH);
  ASSERT_TRUE(first.ok() && second.ok());
  first->reset();  // nvmlShutdown once: NVML stays up for the other
  auto gpus = (*second)->Gpus();
  ASSERT_TRUE(gpus.ok()) << gpus.status();
  EXPECT_EQ(gpus->size(), 2u);
}

TEST_F(NvmlTest, AFailedInitialisationNamesTheCause) {
  ::setenv("HYDRA_FAKE_NVML_INIT_ERROR", "9", 1);
  auto nvml = Nvml::Open(FAKE_NVML_PATH);
  ASSERT_EQ(nvml.status().code(), StatusCode::kFailedPrecondition) << nvml.status();
  EXPECT_THAT(nvml.status().message(), HasSubstr("nvmlInit_v2: Driver Not Loaded (error 9)"));
}

TEST_F(NvmlTest, ALostGpuIsLeftOutAndNamedWhileTheOthersAreDescribed) {
  ::setenv("HYDRA_FAKE_NVML_LOST_GPU", "0", 1);
  auto nvml = Nvml::Open(FAKE_NVML_PATH);
  ASSERT_TRUE(nvml.ok()) << nvml.status();
  std::vector<Status> skipped;
  auto gpus = (*nvml)->Gpus(&skipped);
  ASSERT_TRUE(gpus.ok()) << gpus.status();
  ASSERT_EQ(gpus->size(), 1u);
  EXPECT_EQ(gpus->front().uuid, "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee");
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_EQ(skipped[0].code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(skipped[0].message(), HasSubstr("nvmlDeviceGetMemoryInfo(GPU 0): GPU is lost"));
  EXPECT_EQ((*nvml)->Gpus()->size(), 1u) << "without a list for the skipped";
}

TEST_F(NvmlTest, ALibraryMissingAFunctionIsRefusedByName) {
  auto nvml = Nvml::Open(FAKE_NVML_WITHOUT_MEMORY_INFO_PATH);
  ASSERT_EQ(nvml.status().code(), StatusCode::kFailedPrecondition) << nvml.status();
  EXPECT_THAT(nvml.status().message(), HasSubstr("has no nvmlDeviceGetMemoryInfo"));
}

TEST(TakeFreeMemoryFromNvmlTest, JoinsByUuidWhateverTheOrder) {
  // CUDA_VISIBLE_DEVICES=1,0 numbers the GPUs the other way round; a MIG instance has its own
  // UUID, which NVML's GPU list does not hold.
  NvmlGpu a{0, "H100", "GPU-a", 80, 70, 10}, b{1, "H100", "GPU-b", 80, 30, 50};
  std::vector<GpuInfo> cuda(3);
  cuda[0].uuid = "GPU-b";
  cuda[1].uuid = "GPU-a";
  cuda[2].uuid = "MIG-c";
  cuda[2].free_bytes = 5;
  const auto unfilled = TakeFreeMemoryFromNvml({a, b}, &cuda);
  EXPECT_EQ(unfilled, std::vector<size_t>{2});
  EXPECT_EQ(cuda[0].free_bytes, 30);
  EXPECT_EQ(cuda[0].free_from, GpuInfo::FreeMemorySource::kNvml);
  EXPECT_EQ(cuda[1].free_bytes, 70);
  EXPECT_EQ(cuda[2].free_bytes, 5);
  EXPECT_EQ(cuda[2].free_from, GpuInfo::FreeMemorySource::kCudaRuntime);
}

// Runs for real on a machine with an NVIDIA driver (scripts/gpu-check.sh); skips elsewhere.
TEST(NvmlDriverTest, TheDriversGpusAreDescribed) {
  auto nvml = Nvml::Open();
  if (nvml.status().code() == StatusCode::kNotFound) GTEST_SKIP() << nvml.status();
  ASSERT_TRUE(nvml.ok()) << nvml.status();
  auto gpus = (*nvml)->Gpus();
  ASSERT_TRUE(gpus.ok()) << gpus.status();
  auto driver = (*nvml)->DriverVersion();
  ASSERT_TRUE(driver.ok()) << driver.status();
  std::cout << "driver " << *driver << ": " << DescribeNvmlGpus(*gpus) << "\n";
  for (const auto& g : *gpus) {
    EXPECT_EQ(g.uuid.rfind("GPU-", 0), 0u) << g.uuid;
    EXPECT_GT(g.total_bytes, 0);
    EXPECT_LE(g.free_bytes, g.total_bytes);
  }
}

}  // namespace
}  // namespace hydra
