#include "agent/executor/disk_tier.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>
#include <xxhash.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <iterator>
#include <memory>
#include <numeric>
#include <stdexcept>

#include "agent/executor/tier_ledger.h"
#include "tests/fakes/temp_dir_test.h"

namespace hydra::executor {
namespace {

namespace fs = std::filesystem;

class DiskTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fakes::TestDirPath("hydra_disk_tier");
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
  size_t total_ = 0;
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
    // Each part on a 4 KiB boundary, then the 4 KiB trailer block with the hash.
    EXPECT_EQ(disk.bytes_on_disk(), 3 * 4096);
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

TEST_F(DiskTierTest, AWriteWaitsOnItsIoThreadUntilItsBytesAreReady) {
  // As a GPU's copy out fills the host buffer after Write returns: the I/O thread waits for
  // `ready`, then writes what the buffer holds by then; the caller never waited.
  std::vector<float> a(1000, 1.0f);
  DiskTier disk((dir_ / "t").string());
  ASSERT_TRUE(disk.Init().ok());
  std::promise<void> copied;
  std::shared_future<void> done = copied.get_future().share();
  auto w = disk.Write("s0", {{a.data(), a.size() * 4}}, nullptr, [done] { done.wait(); });
  EXPECT_EQ(w.wait_for(std::chrono::milliseconds(200)), std::future_status::timeout);
  EXPECT_FALSE(disk.Exists("s0"));
  std::fill(a.begin(), a.end(), 2.0f);  // the copy out lands
  copied.set_value();
  ASSERT_TRUE(w.get().ok());
  std::vector<float> back(a.size());
  ASSERT_TRUE(disk.ReadSync("s0", {{back.data(), back.size() * 4}}).ok());
  EXPECT_EQ(back, a);
  // A copy out that failed (the wait throws): nothing is written, the old file stays.
  std::fill(a.begin(), a.end(), 3.0f);
  auto failed = disk.Write("s0", {{a.data(), a.size() * 4}}, nullptr, [] {
    throw std::runtime_error("CUDA error: an illegal memory access");
  });
  const Status st = failed.get();
  EXPECT_EQ(st.code(), StatusCode::kInternal);
  EXPECT_NE(st.message().find("illegal memory access"), std::string::npos) << st;
  ASSERT_TRUE(disk.ReadSync("s0", {{back.data(), back.size() * 4}}).ok());
  EXPECT_EQ(back, std::vector<float>(a.size(), 2.0f));
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

TEST_F(DiskTierTest, AFullDiskIsUnavailableAndKeepsTheOldFile) {
  // UNAVAILABLE: the trial is interrupted and resumes from its last checkpoint once there is
  // room (RESOURCE_EXHAUSTED once failed it for good, as if it were the trial's fault).
  if (!fs::exists("/dev/full")) GTEST_SKIP();
  DiskTier disk((dir_ / "t").string());
  ASSERT_TRUE(disk.Init().ok());
  std::vector<char> v1(100, '1'), v2(100, '2');
  ASSERT_TRUE(disk.WriteSync("k", {{v1.data(), v1.size()}}).ok());
  fs::create_symlink("/dev/full", dir_ / "t" / "k.spill.tmp");
  Status s = disk.WriteSync("k", {{v2.data(), v2.size()}});
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find("k.spill.tmp"), std::string::npos);
  EXPECT_NE(s.message().find("spill directory is full"), std::string::npos);
  std::vector<char> back(100);
  ASSERT_TRUE(disk.ReadSync("k", {{back.data(), back.size()}}).ok());
  EXPECT_EQ(back, v1);
}

/// Whether the file system under `dir` takes O_DIRECT transfers (ext4 and xfs do; tmpfs does
/// not open such files; some file systems open them and refuse the transfer).
bool TakesDirectIo(const fs::path& dir) {
  const std::string probe = (dir / "probe").string();
  int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_DIRECT, 0600);
  bool ok = fd >= 0;
  if (ok) {
    auto block = AlignedSlab::Allocate(4096);
    ok = ::pwrite(fd, block->data(), 4096, 0) == 4096;
    ::close(fd);
  }
  ::unlink(probe.c_str());
  return ok;
}

TEST_F(DiskTierTest, SlabsGoThroughDirectIoAndMixWithPlainBuffers) {
  EXPECT_EQ(SpillLayout({10, 0, 4096, 1}, &total_), (std::vector<size_t>{0, 4096, 4096, 8192}));
  EXPECT_EQ(total_, 3u * 4096);
  DiskTier disk((dir_ / "t").string());
  ASSERT_TRUE(disk.Init().ok());
  const bool direct = TakesDirectIo(dir_ / "t");
  // Parts in a slab at their layout offsets: the slab is written and read whole.
  const std::vector<size_t> sizes = {4000, 0, 9000, 3};
  size_t total = 0;
  const auto offsets = SpillLayout(sizes, &total);
  auto slab = AlignedSlab::Allocate(total);
  ASSERT_NE(slab, nullptr);
  ASSERT_EQ(reinterpret_cast<uintptr_t>(slab->data()) % 4096, 0u);
  std::vector<ConstBytes> out;
  std::vector<std::vector<char>> plain;
  for (size_t i = 0; i < sizes.size(); ++i) {
    for (size_t j = 0; j < sizes[i]; ++j) slab->data()[offsets[i] + j] = static_cast<char>(i + j);
    out.push_back({slab->data() + offsets[i], sizes[i]});
    plain.emplace_back(slab->data() + offsets[i], slab->data() + offsets[i] + sizes[i]);
  }
  ASSERT_TRUE(disk.Write("slab", out, slab).get().ok());
  EXPECT_EQ(disk.direct_bytes(), direct ? static_cast<int64_t>(total) : 0);
  // ... read back into plain buffers through the page cache,
  std::vector<std::vector<char>> back(sizes.size());
  std::vector<MutableBytes> in;
  for (size_t i = 0; i < sizes.size(); ++i) {
    back[i].resize(sizes[i]);
    in.push_back({back[i].data(), sizes[i]});
  }
  ASSERT_TRUE(disk.ReadSync("slab", in).ok());
  EXPECT_EQ(back, plain);
  // ... and plain buffers written are read into a fresh slab directly.
  std::vector<ConstBytes> from_plain;
  for (const auto& v : plain) from_plain.push_back({v.data(), v.size()});
  ASSERT_TRUE(disk.WriteSync("plain", from_plain).ok());
  auto slab2 = AlignedSlab::Allocate(total);
  std::vector<MutableBytes> into;
  for (size_t i = 0; i < sizes.size(); ++i) into.push_back({slab2->data() + offsets[i], sizes[i]});
  const int64_t before = disk.direct_bytes();
  ASSERT_TRUE(disk.Read("plain", into, slab2).get().ok());
  EXPECT_EQ(disk.direct_bytes() - before, direct ? static_cast<int64_t>(total) : 0);
  EXPECT_EQ(std::memcmp(slab2->data(), slab->data(), total), 0);
  // A flipped byte is caught on the direct path too.
  {
    std::fstream f(dir_ / "t" / "plain.spill", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(offsets[2] + 17));
    f.put('\x7f');
  }
  Status s = disk.ReadSync("plain", into, slab2.get());
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find("checksum"), std::string::npos);
  // Parts that do not lie at their offsets in the slab take the page cache, correctly.
  std::vector<MutableBytes> shifted = into;
  shifted[0].data = slab2->data() + 8;
  const int64_t before_shift = disk.direct_bytes();
  ASSERT_TRUE(disk.ReadSync("slab", shifted, slab2.get()).ok());
  EXPECT_EQ(disk.direct_bytes(), before_shift);
  EXPECT_EQ(std::memcmp(slab2->data() + 8, plain[0].data(), sizes[0]), 0);
}

TEST_F(DiskTierTest, AUniqueFolderIsTheTiersOwn) {
  // Two tiers of one stem (two trials of one name, in two namespaces or two processes): each
  // reads back what it wrote, and removing one leaves the other's files.
  std::vector<char> mine(100, 'a'), theirs(100, 'b'), back(100);
  auto a = std::make_unique<DiskTier>((dir_ / "t").string(), 1, DiskTier::Folder::kUnique);
  DiskTier b((dir_ / "t").string(), 1, DiskTier::Folder::kUnique);
  ASSERT_TRUE(a->Init().ok());
  ASSERT_TRUE(b.Init().ok());
  EXPECT_NE(a->dir(), b.dir());
  EXPECT_EQ(fs::path(a->dir()).parent_path(), dir_);
  EXPECT_EQ(fs::path(a->dir()).filename().string().rfind("t.", 0), 0u) << a->dir();
  ASSERT_TRUE(a->WriteSync("shard0", {{mine.data(), mine.size()}}).ok());
  ASSERT_TRUE(b.WriteSync("shard0", {{theirs.data(), theirs.size()}}).ok());
  ASSERT_TRUE(a->ReadSync("shard0", {{back.data(), back.size()}}).ok());
  EXPECT_EQ(back, mine);
  const std::string gone = a->dir();
  a.reset();
  EXPECT_FALSE(fs::exists(gone));
  ASSERT_TRUE(b.ReadSync("shard0", {{back.data(), back.size()}}).ok());
  EXPECT_EQ(back, theirs);
}

TEST_F(DiskTierTest, UnusableDirectoryIsAClearError) {
  std::ofstream(dir_.string() + ".file") << "x";
  DiskTier disk(dir_.string() + ".file/sub");
  EXPECT_FALSE(disk.Init().ok());
  DiskTier unique(dir_.string() + ".file/sub", 1, DiskTier::Folder::kUnique);
  EXPECT_FALSE(unique.Init().ok());
  fs::remove(dir_.string() + ".file");
}

TEST_F(DiskTierTest, TheTrailerCheckAgreesWithTheWriter) {
  DiskTier disk((dir_ / "t").string());
  ASSERT_TRUE(disk.Init().ok());
  std::vector<char> a(5000, 'a');
  ASSERT_TRUE(disk.WriteSync("k", {{a.data(), a.size()}}).ok());
  std::ifstream in(dir_ / "t" / "k.spill", std::ios::binary);
  // One spare byte in front, so that the block is not 8-byte aligned.
  std::string file = " " + std::string(std::istreambuf_iterator<char>(in), {});
  ASSERT_EQ(file.size(), 1 + 3 * kSpillAlignment);
  const char* data = file.data() + 1;
  const uint64_t total = 2 * kSpillAlignment;
  const uint64_t digest = XXH3_64bits(data, total);
  const ConstBytes block{data + total, kSpillAlignment};
  EXPECT_TRUE(CheckSpillTrailer(block, digest, total, "k").ok());
  for (const Status& s :
       {CheckSpillTrailer(block, digest + 1, total, "k"),
        CheckSpillTrailer(block, digest, total - kSpillAlignment, "k"),
        CheckSpillTrailer({data + total, kSpillAlignment - 1}, digest, total, "k"),
        CheckSpillTrailer({data, kSpillAlignment}, digest, total, "k")}) {
    EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s;
    EXPECT_NE(s.message().find("spill file k is corrupt"), std::string::npos) << s;
  }
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
