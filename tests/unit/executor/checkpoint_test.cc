#include "agent/executor/checkpoint.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace hydra::executor {
namespace {

namespace fs = std::filesystem;

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("hydra_ckpt_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  static CheckpointData Sample(int64_t step) {
    CheckpointData d;
    d.meta = {{"step", step}, {"fingerprint", "abc"}};
    NamedBuffer a{"w", "float32", {2, 3}, std::vector<char>(24)};
    for (size_t i = 0; i < a.data.size(); ++i) a.data[i] = static_cast<char>(i * 7 + step);
    NamedBuffer b{"empty", "float32", {0}, {}};
    d.buffers = {a, b};
    return d;
  }
  fs::path dir_;
};

TEST_F(CheckpointTest, RoundTripIsExact) {
  const std::string path = (dir_ / "c.hck").string();
  ASSERT_TRUE(WriteCheckpointFile(path, Sample(3)).ok());
  auto back = ReadCheckpointFile(path);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->meta["step"], 3);
  ASSERT_EQ(back->buffers.size(), 2u);
  EXPECT_EQ(back->buffers[0].name, "w");
  EXPECT_EQ(back->buffers[0].shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(back->buffers[0].data, Sample(3).buffers[0].data);
  EXPECT_TRUE(back->buffers[1].data.empty());
  EXPECT_FALSE(fs::exists(path + ".tmp"));
}

TEST_F(CheckpointTest, DetectsCorruptionAndTruncation) {
  const std::string path = (dir_ / "c.hck").string();
  ASSERT_TRUE(WriteCheckpointFile(path, Sample(3)).ok());
  const auto size = fs::file_size(path);
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(size - 20));
    f.put('\x55');
  }
  auto flipped = ReadCheckpointFile(path);
  EXPECT_EQ(flipped.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(flipped.status().message().find("checksum"), std::string::npos);
  ASSERT_TRUE(WriteCheckpointFile(path, Sample(3)).ok());
  fs::resize_file(path, size / 2);
  EXPECT_EQ(ReadCheckpointFile(path).status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(ReadCheckpointFile((dir_ / "none").string()).status().code(), StatusCode::kNotFound);
}

TEST_F(CheckpointTest, StoreKeepsNewestAndFallsBackPastCorruption) {
  CheckpointStore store((dir_ / "trial").string(), 2);
  EXPECT_EQ(store.LoadLatest(nullptr).status().code(), StatusCode::kNotFound);
  for (int64_t step : {10, 20, 30}) ASSERT_TRUE(store.Save(step, Sample(step)).ok());
  EXPECT_EQ(store.Steps(), (std::vector<int64_t>{20, 30}));
  std::vector<std::string> warnings;
  auto latest = store.LoadLatest(&warnings);
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(latest->meta["step"], 30);
  EXPECT_TRUE(warnings.empty());
  fs::resize_file(store.PathFor(30), 10);
  latest = store.LoadLatest(&warnings);
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(latest->meta["step"], 20);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("ckpt-0000000030.hck"), std::string::npos);
}

TEST_F(CheckpointTest, SavingAnOlderStepRemovesLaterLeftovers) {
  // Resumed from step 10 because 20 and 30 were unusable: the next save must not let those
  // leftovers push out the intact checkpoint of step 10.
  CheckpointStore store((dir_ / "trial").string(), 2);
  for (int64_t step : {10, 20, 30}) ASSERT_TRUE(store.Save(step, Sample(step)).ok());
  ASSERT_TRUE(store.Save(15, Sample(15)).ok());
  EXPECT_EQ(store.Steps(), (std::vector<int64_t>{15}));
  ASSERT_TRUE(store.Save(16, Sample(16)).ok());
  EXPECT_EQ(store.Steps(), (std::vector<int64_t>{15, 16}));
}

TEST_F(CheckpointTest, UnwritableDirectoryIsAClearError) {
  if (::geteuid() == 0) {
    // root ignores permissions; use a path under a regular file instead.
    std::ofstream(dir_ / "file") << "x";
    auto s = WriteCheckpointFile((dir_ / "file" / "c.hck").string(), Sample(1));
    EXPECT_FALSE(s.ok());
    return;
  }
  fs::create_directories(dir_ / "ro");
  fs::permissions(dir_ / "ro", fs::perms::owner_read | fs::perms::owner_exec);
  auto s = WriteCheckpointFile((dir_ / "ro" / "c.hck").string(), Sample(1));
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("previous one is intact"), std::string::npos);
}

TEST_F(CheckpointTest, FullDiskLeavesThePreviousCheckpoint) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  // Writing through /dev/full fails with ENOSPC; the store's earlier file must survive.
  const std::string path = (dir_ / "c.hck").string();
  ASSERT_TRUE(WriteCheckpointFile(path, Sample(1)).ok());
  fs::create_symlink("/dev/full", path + ".tmp");
  Status s = WriteCheckpointFile(path, Sample(2));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s;
  auto back = ReadCheckpointFile(path);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->meta["step"], 1);
}

}  // namespace
}  // namespace hydra::executor
