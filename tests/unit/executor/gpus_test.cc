// GPU discovery and the devices the executors accept. Runs in every build: the CPU build
// (no CUDA compiled in), the CUDA build on a machine without a GPU (CI), and on a GPU
// (scripts/gpu-check.sh), asserting what each must do.
#include "agent/executor/gpus.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>

#include "agent/executor/executor.h"
#include "common/nvml.h"

#ifdef HYDRA_WITH_CUDA
#include <c10/cuda/CUDAAllocatorConfig.h>
#endif

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
  // Where the driver's NVML is (every NVIDIA GPU node), it measured the free memory, so no CUDA
  // context was created for discovery: CUDA's and NVML's UUIDs agree. (A MIG instance, named
  // "... MIG 1g.10gb", is not in NVML's GPU list; it falls back to the CUDA runtime.)
  if (Nvml::Open().ok()) {
    for (const auto& g : *gpus) {
      if (g.name.find(" MIG ") != std::string::npos) continue;
      EXPECT_EQ(g.free_from, GpuInfo::FreeMemorySource::kNvml) << g.name << " " << g.uuid;
    }
  }
  auto d = FindDevices(*ParseDevicesRequest("cuda"), 1000);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->size(), gpus->size());
  EXPECT_EQ(d->front().uuid, gpus->front().uuid);
}

TEST(GpusTest, ExpandableSegmentsApplyAfterTheAllocatorReadItsSettings) {
#ifdef HYDRA_WITH_CUDA
  // As after a first CUDA allocation (bench/spill's pilot came before the factories): LibTorch
  // read its settings, without expandable segments, and reads the variable no more.
  ::unsetenv("PYTORCH_CUDA_ALLOC_CONF");
  ::unsetenv("PYTORCH_ALLOC_CONF");
  c10::cuda::CUDACachingAllocator::setAllocatorSettings("expandable_segments:False");
  ASSERT_FALSE(CudaExpandableSegments());
  ConfigureCudaAllocator();
  EXPECT_TRUE(CudaExpandableSegments());
  // A user's own setting wins.
  c10::cuda::CUDACachingAllocator::setAllocatorSettings("expandable_segments:False");
  ::setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:False", 1);
  ConfigureCudaAllocator();
  EXPECT_FALSE(CudaExpandableSegments());
  ::unsetenv("PYTORCH_CUDA_ALLOC_CONF");
  ConfigureCudaAllocator();  // as the other tests had it
  EXPECT_TRUE(CudaExpandableSegments());
#else
  ConfigureCudaAllocator();
  EXPECT_FALSE(CudaExpandableSegments()) << "no CUDA allocator in this build";
#endif
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

TEST(GpusTest, ExecutorDevicesNameTheDeviceABuildIsFor) {
  ExecutorDevices none;  // the CPU devices of however many workers the scheduler runs
  ASSERT_TRUE(none.At(3).ok());
  EXPECT_EQ(none.At(3)->name, "cpu:3");
  EXPECT_FALSE(none.Discrete(*none.At(0)));
  EXPECT_EQ(none.DiscreteMemoryBytes(), 0);
  EXPECT_EQ(none.At(-1).status().code(), StatusCode::kInvalidArgument);

  DeviceSpec gpu;
  gpu.kind = DeviceKind::kCuda;
  gpu.name = "cuda:0";
  gpu.memory_bytes = int64_t{40} << 30;
  DeviceSpec small = gpu;
  small.name = "cuda:1";
  small.index = 1;
  small.memory_bytes = int64_t{20} << 30;
  ExecutorDevices gpus{{gpu, small}};
  EXPECT_EQ(gpus.At(1)->name, "cuda:1");
  const auto missing = gpus.At(2);
  EXPECT_EQ(missing.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(missing.status().message(), HasSubstr("no device 2 among the 2"));
  EXPECT_TRUE(gpus.Discrete(gpu));
  EXPECT_EQ(gpus.DiscreteMemoryBytes(), int64_t{20} << 30) << "the smallest GPU";

  EXPECT_TRUE(gpus.HasGpus());
  EXPECT_FALSE(none.HasGpus());
  // Host memory of an admitted trial on a GPU: its state in the host tier, or three shards'.
  Admission a;
  a.plan.state_tier = StateTier::kHost;
  a.plan.total_state_bytes = 1000;
  a.plan.peak_device_bytes = 400;
  a.host_bytes = 1400;  // as on a CPU device, whose device tier is host memory
  HostBytesOnGpus(none, &a);
  EXPECT_EQ(a.host_bytes, 1400);
  HostBytesOnGpus(gpus, &a);
  EXPECT_EQ(a.host_bytes, 1000);
  a.plan.state_tier = StateTier::kDisk;
  a.plan.shards.resize(5);
  for (auto& s : a.plan.shards) s.state_bytes = 200;
  HostBytesOnGpus(gpus, &a);
  EXPECT_EQ(a.host_bytes, 600);

  // A trial that names no budget gets the GPUs' memory; one that names one keeps it.
  Trial t;
  EXPECT_EQ(WithDeviceBudget(t, gpus).resources.device_memory_budget, int64_t{20} << 30);
  EXPECT_FALSE(WithDeviceBudget(t, none).resources.device_memory_budget.has_value());
  t.resources.device_memory_budget = 1 << 30;
  EXPECT_EQ(WithDeviceBudget(t, gpus).resources.device_memory_budget, 1 << 30);
}

}  // namespace
}  // namespace hydra::executor
