#include "agent/rpc/trial_paths.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace hydra::agent {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class TrialPathsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("hydra_trial_paths_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "root");
    root_ = fs::canonical(dir_ / "root").string();
  }
  void TearDown() override { fs::remove_all(dir_); }

  static Trial Identity(const std::string& ns, const std::string& job, const std::string& name) {
    Trial t;
    t.namespace_ = ns;
    t.job = job;
    t.job_uid = "uid-1";
    t.name = name;
    return t;
  }

  fs::path dir_;
  std::string root_;
};

TEST_F(TrialPathsTest, OnlyTheTrialsOwnDirectoryOrBelowIsAccepted) {
  const Trial t = Identity("team-a", "sweep", "sweep-lr1");
  EXPECT_TRUE(CheckCheckpointLayout(t, root_ + "/team-a/sweep/sweep-lr1", {root_}).ok());
  EXPECT_TRUE(CheckCheckpointLayout(t, root_ + "/team-a/sweep/sweep-lr1/run2", {root_}).ok());
  for (const std::string& bad : std::vector<std::string>{
           root_, root_ + "/team-a", root_ + "/team-a/sweep", root_ + "/team-b/sweep/sweep-lr1",
           root_ + "/team-a/other/sweep-lr1", root_ + "/team-a/sweep/sweep-lr10",
           root_ + "/team-a/sweep/sweep-lr"}) {
    Status s = CheckCheckpointLayout(t, bad, {root_});
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(s.message(), HasSubstr(root_ + "/team-a/sweep/sweep-lr1")) << bad;
  }
}

TEST_F(TrialPathsTest, NestingIsAncestryNotAPrefixOfTheName) {
  EXPECT_TRUE(PathsNest("/r/a/b", "/r/a/b"));
  EXPECT_TRUE(PathsNest("/r/a", "/r/a/b/c"));
  EXPECT_TRUE(PathsNest("/r/a/b/c", "/r/a"));
  EXPECT_FALSE(PathsNest("/r/a/b", "/r/a/bc"));
  EXPECT_FALSE(PathsNest("/r/a/b", "/r/x/b"));
}

TEST_F(TrialPathsTest, ResolvingFollowsSymlinksSoAnEscapeIsSeen) {
  fs::create_directories(dir_ / "elsewhere");
  fs::create_directories(dir_ / "root" / "team-a" / "sweep");
  fs::create_directory_symlink(dir_ / "elsewhere", dir_ / "root" / "team-a" / "sweep" / "t1");
  auto resolved = ResolvePath(root_ + "/team-a/sweep/t1/sub");
  ASSERT_TRUE(resolved.ok());
  EXPECT_EQ(*resolved, fs::canonical(dir_ / "elsewhere").string() + "/sub");
  EXPECT_FALSE(CheckCheckpointLayout(Identity("team-a", "sweep", "t1"), *resolved, {root_}).ok());
}

TEST_F(TrialPathsTest, ADirectoryThatIsASymlinkIsRefusedAfterOpening) {
  const std::string good = root_ + "/ns/job/t1";
  ASSERT_TRUE(CreateCheckedDirectory(good).ok());
  EXPECT_TRUE(fs::is_directory(good));
  fs::create_directories(dir_ / "elsewhere");
  fs::create_directories(root_ + "/ns/job");
  fs::create_directory_symlink(dir_ / "elsewhere", root_ + "/ns/job/t2");
  Status s = CreateCheckedDirectory(root_ + "/ns/job/t2");
  EXPECT_EQ(s.code(), StatusCode::kPermissionDenied) << s;
  // A symlink higher up the path: the opened directory's real path differs.
  fs::create_directories(dir_ / "elsewhere" / "job" / "t3");
  fs::create_directory_symlink(dir_ / "elsewhere", root_ + "/ns2");
  s = CreateCheckedDirectory(root_ + "/ns2/job/t3");
  EXPECT_EQ(s.code(), StatusCode::kPermissionDenied) << s;
  EXPECT_THAT(s.message(), HasSubstr("resolves to"));
}

TEST_F(TrialPathsTest, RemovingATrialsFilesLeavesEverythingElse) {
  const fs::path trial = fs::path(root_) / "ns" / "job" / "t1";
  fs::create_directories(trial / "keep-dir");
  for (const char* f : {"ckpt-0000000004.hck", "ckpt-0000000008.hck.tmp", "ATTEMPT", "ATTEMPT.tmp",
                        "model.pt", "model.safetensors", "config.json", "notes.txt"}) {
    std::ofstream(trial / f) << "x";
  }
  // A planted symlink named like a checkpoint: the link goes, its target stays.
  std::ofstream(dir_ / "victim") << "precious";
  fs::create_symlink(dir_ / "victim", trial / "ckpt-0000000012.hck");
  ASSERT_TRUE(RemoveTrialFiles(trial.string()).ok());
  EXPECT_TRUE(fs::exists(trial / "notes.txt"));
  EXPECT_TRUE(fs::exists(trial / "keep-dir"));
  EXPECT_FALSE(fs::exists(trial / "ATTEMPT"));
  EXPECT_FALSE(fs::exists(trial / "model.pt"));
  EXPECT_FALSE(fs::exists(trial / "model.safetensors")) << "a gpt2 trial's Hugging Face export";
  EXPECT_FALSE(fs::exists(trial / "config.json"));
  EXPECT_FALSE(fs::exists(trial / "ckpt-0000000004.hck"));
  EXPECT_FALSE(fs::is_symlink(trial / "ckpt-0000000012.hck"));
  std::ifstream victim(dir_ / "victim");
  std::string text;
  victim >> text;
  EXPECT_EQ(text, "precious");
  // Only trial files left: the directory goes too; its parents stay.
  fs::remove(trial / "notes.txt");
  fs::remove(trial / "keep-dir");
  ASSERT_TRUE(RemoveTrialFiles(trial.string()).ok());
  EXPECT_FALSE(fs::exists(trial));
  EXPECT_TRUE(fs::exists(trial.parent_path()));
  EXPECT_TRUE(RemoveTrialFiles(trial.string()).ok()) << "a missing directory is fine";
}

TEST_F(TrialPathsTest, RemovingThroughASymlinkedDirectoryIsRefused) {
  fs::create_directories(dir_ / "elsewhere");
  std::ofstream(dir_ / "elsewhere" / "ckpt-0000000001.hck") << "other";
  fs::create_directories(root_ + "/ns/job");
  fs::create_directory_symlink(dir_ / "elsewhere", root_ + "/ns/job/t1");
  Status s = RemoveTrialFiles(root_ + "/ns/job/t1");
  EXPECT_EQ(s.code(), StatusCode::kPermissionDenied) << s;
  EXPECT_TRUE(fs::exists(dir_ / "elsewhere" / "ckpt-0000000001.hck"));
}

}  // namespace
}  // namespace hydra::agent
