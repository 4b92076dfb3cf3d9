#include "agent/executor/disk_tier.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <numeric>

#include "agent/executor/tier_ledger.h"

namespace hydra::executor {
namespace {

namespace fs = std::filesystem;

class DiskTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("hydra_disk_tier_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(DiskTierTest, RoundTripAsyncAndCleanup) {
  std::vector<float> a(1000), b(37);
  std::iota(a.begin(), a.end(), 1.0f);
  std::iota(b.begin(), b.end(), -5.0f);
  {
    DiskTier disk((dir_ / "t").string());
    ASSERT_TRUE(disk.Init().ok());
    auto w = disk.Write("s0", {{a.data(), a.size() * 4}, {b.data(), b.size() * 4}});
    ASSERT_TRUE(w.get().ok());
    EXPECT_TRUE(disk.Exists("s0"));
    // The data and the 16-byte hash trailer.
    EXPECT_EQ(disk.bytes_on_disk(), static_cast<int64_t>((a.size() + b.size()) * 4 + 16));
    std::vector<float> a2(a.size()), b2(b.size());
    auto r = disk.Read("s0", {{a2.data(), a2.size() * 4}, {b2.data(), b2.size() * 4}});
    ASSERT_TRUE(r.get().ok());
    EXPECT_EQ(a, a2);
    EXPECT_EQ(b, b2);
    EXPECT_EQ(disk.bytes_read(), disk.bytes_written());
    // Wrong sizes are a clear error, not a silent partial read.
    Status s = disk.ReadSync("s0", {{a2.data(), 8}});
    EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  }
  EXPECT_FALSE(fs::exists(dir_ / "t")) << "spill files are removed with the tier";
}

TEST_F(DiskTierTest, CorruptionIsDetected) {
  DiskTier disk((dir_ / "t").string());
  ASSERT_TRUE(disk.Init().ok());
  std::vector<char> data(4096, 'x');
  ASSERT_TRUE(disk.WriteSync("k", {{data.data(), data.size()}}).ok());
  {
    std::fstream f(dir_ / "t" / "k.spill", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put('y');
  }
  Status s = disk.ReadSync("k", {{data.data(), data.size()}});
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("checksum"), std::string::npos);
  EXPECT_EQ(disk.ReadSync("missing", {{data.data(), 1}}).code(), StatusCode::kNotFound);
}

TEST_F(DiskTierTest, FullDiskIsResourceExhaustedAndKeepsTheOldFile) {
  if (!fs::exists("/dev/full")) GTEST_SKIP();
  DiskTier disk((dir_ / "t").string());
  ASSERT_TRUE(disk.Init().ok());
  std::vector<char> v1(100, '1'), v2(100, '2');
  ASSERT_TRUE(disk.WriteSync("k", {{v1.data(), v1.size()}}).ok());
  fs::create_symlink("/dev/full", dir_ / "t" / "k.spill.tmp");
  Status s = disk.WriteSync("k", {{v2.data(), v2.size()}});
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find("k.spill.tmp"), std::string::npos);
  std::vector<char> back(100);
  ASSERT_TRUE(disk.ReadSync("k", {{back.data(), back.size()}}).ok());
  EXPECT_EQ(back, v1);
}

TEST_F(DiskTierTest, UnusableDirectoryIsAClearError) {
  std::ofstream(dir_.string() + ".file") << "x";
  DiskTier disk(dir_.string() + ".file/sub");
  EXPECT_FALSE(disk.Init().ok());
  fs::remove(dir_.string() + ".file");
}

TEST(TierLedgerTest, EnforcesTheDeviceBudgetAndTracksPeaks) {
  TierLedger ledger(100);
  ASSERT_TRUE(ledger.Acquire(Tier::kDevice, 60, "a").ok());
  Status s = ledger.Acquire(Tier::kDevice, 50, "b");
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("b needs 50 B"), std::string::npos);
  EXPECT_EQ(ledger.current(Tier::kDevice), 60);
  ASSERT_TRUE(ledger.Acquire(Tier::kHost, 1000, "host is unbounded").ok());
  ledger.Release(Tier::kDevice, 60);
  ASSERT_TRUE(ledger.Acquire(Tier::kDevice, 100, "c").ok());
  EXPECT_EQ(ledger.peak(Tier::kDevice), 100);
  EXPECT_EQ(ledger.peak(Tier::kHost), 1000);
}

}  // namespace
}  // namespace hydra::executor
