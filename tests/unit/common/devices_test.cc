#include "common/devices.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace hydra {
namespace {

using ::testing::HasSubstr;

TEST(DevicesFlagTest, CpuDevicesWithAndWithoutBudget) {
  auto d = ParseDevicesFlag("cpu:2", 1000);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->size(), 2u);
  EXPECT_EQ((*d)[1].name, "cpu:1");
  EXPECT_EQ((*d)[1].memory_bytes, 1000);
  auto b = ParseDevicesFlag("cpu:1,budget=4Gi", 1000);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*b)[0].memory_bytes, int64_t{4} << 30);
}

TEST(DevicesFlagTest, MistakesAreNamed) {
  for (const char* bad : {"gpu:1", "cpu:", "cpu:0", "cpu:x", "cpu:2,budget=", "cpu:2,budget=-1Gi",
                          "cpu:2,size=1Gi", "cpu:5000"}) {
    auto d = ParseDevicesFlag(bad, 1000);
    EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(d.status().message(), HasSubstr("--devices")) << bad;
  }
}

}  // namespace
}  // namespace hydra
