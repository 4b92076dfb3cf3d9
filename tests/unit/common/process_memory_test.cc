#include "common/process_memory.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <thread>

namespace hydra {
namespace {

TEST(ProcessMemoryTest, SamplerSeesAnAllocationTouched) {
  const int64_t before = ResidentBytes();
  ASSERT_GT(before, 0);
  ResidentPeakSampler sampler(std::chrono::milliseconds(1));
  {
    const size_t n = 64 << 20;
    std::unique_ptr<char[]> block(new char[n]);
    std::memset(block.get(), 1, n);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_GT(block[n - 1], 0);
  }
  sampler.Stop();
  sampler.Stop();  // idempotent
  EXPECT_GE(sampler.peak() - before, 60 << 20);
}

}  // namespace
}  // namespace hydra
