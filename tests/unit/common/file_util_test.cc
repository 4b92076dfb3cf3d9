#include "common/file_util.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "tests/fakes/temp_dir_test.h"

namespace hydra {
namespace {

namespace fs = std::filesystem;

class FileUtilTest : public fakes::TempDirTest {
 protected:
  FileUtilTest() : TempDirTest("hydra_file_util_test") {}

  static std::string Slurp(const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
};

TEST_F(FileUtilTest, WritesAndReplacesAtomically) {
  const std::string path = (dir_ / "ATTEMPT").string();
  ASSERT_TRUE(WriteFileAtomically(path, "1\n").ok());
  ASSERT_TRUE(WriteFileAtomically(path, "22\n").ok());
  auto back = ReadFile(path);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, "22\n");
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  EXPECT_EQ(ReadFile((dir_ / "none").string()).status().code(), StatusCode::kNotFound);
}

TEST_F(FileUtilTest, ReadFileFailsOnAReadErrorInsteadOfReturningWhatCameBefore) {
  // A directory opens, and its read fails (EISDIR), as an I/O error partway would: once an
  // empty text and OK (a result.json read so was then deleted as unreadable).
  auto dir = ReadFile(dir_.string());
  EXPECT_FALSE(dir.ok());
  EXPECT_NE(dir.status().message().find(dir_.string()), std::string::npos);
  // Files larger than one read, and empty ones, come back whole.
  const std::string big(200000, 'x');
  ASSERT_TRUE(WriteFileAtomically((dir_ / "big").string(), big).ok());
  EXPECT_EQ(*ReadFile((dir_ / "big").string()), big);
  ASSERT_TRUE(WriteFileAtomically((dir_ / "empty").string(), "").ok());
  EXPECT_EQ(*ReadFile((dir_ / "empty").string()), "");
}

TEST_F(FileUtilTest, ReadOwnFileReadsOnlyARegularFileOfBoundedSize) {
  const fs::path own = dir_ / "ATTEMPT";
  std::ofstream(own) << "3\n";
  auto back = ReadOwnFile(own.string(), 64);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, "3\n");
  EXPECT_EQ(ReadOwnFile(own.string(), 1).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(ReadOwnFile((dir_ / "none").string(), 64).status().code(), StatusCode::kNotFound);
  // Planted in its place: a link to another file, and a FIFO (which would block a plain open).
  std::ofstream(dir_ / "victim") << "4\n";
  fs::create_symlink(dir_ / "victim", dir_ / "link");
  auto link = ReadOwnFile((dir_ / "link").string(), 64);
  EXPECT_EQ(link.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(link.status().message().find("symbolic link"), std::string::npos);
  ASSERT_EQ(::mkfifo((dir_ / "pipe").c_str(), 0600), 0);
  auto pipe = ReadOwnFile((dir_ / "pipe").string(), 64);
  EXPECT_EQ(pipe.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(pipe.status().message().find("not a regular file"), std::string::npos);
}

TEST_F(FileUtilTest, APlantedSymlinkAtTheTemporaryPathIsNotWrittenThrough) {
  // The write succeeds: the link is unlinked (not its target) and the file created afresh.
  std::ofstream(dir_ / "victim") << "precious";
  const std::string path = (dir_ / "ATTEMPT").string();
  fs::create_symlink(dir_ / "victim", path + ".tmp");
  ASSERT_TRUE(WriteFileAtomically(path, "7\n").ok());
  EXPECT_EQ(Slurp(dir_ / "victim"), "precious");
  EXPECT_EQ(Slurp(path), "7\n");
  EXPECT_FALSE(fs::exists(fs::symlink_status(path + ".tmp")));
}

TEST_F(FileUtilTest, ASymlinkAtTheFinalPathIsReplacedNotFollowed) {
  // The write succeeds: the rename replaces the link itself.
  std::ofstream(dir_ / "victim") << "precious";
  const fs::path path = dir_ / "ATTEMPT";
  fs::create_symlink(dir_ / "victim", path);
  ASSERT_TRUE(WriteFileAtomically(path.string(), "8\n").ok());
  EXPECT_EQ(Slurp(dir_ / "victim"), "precious");
  EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(path)));
  EXPECT_EQ(Slurp(path), "8\n");
}

TEST_F(FileUtilTest, ASymlinkedDirectoryIsRefused) {
  // The write fails with FAILED_PRECONDITION: nothing is written through a directory link.
  fs::create_directories(dir_ / "real");
  fs::create_directory_symlink(dir_ / "real", dir_ / "link");
  Status s = WriteFileAtomically((dir_ / "link" / "ATTEMPT").string(), "9\n");
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("symbolic link"), std::string::npos) << s;
  EXPECT_TRUE(fs::is_empty(dir_ / "real"));
}

TEST_F(FileUtilTest, MissingDirectoryAndFileInPlaceOfADirectoryAreErrors) {
  Status missing = WriteFileAtomically((dir_ / "no" / "f").string(), "x");
  EXPECT_EQ(missing.code(), StatusCode::kNotFound) << missing;
  std::ofstream(dir_ / "file") << "x";
  Status not_dir = WriteFileAtomically((dir_ / "file" / "f").string(), "x");
  EXPECT_EQ(not_dir.code(), StatusCode::kFailedPrecondition) << not_dir;
  EXPECT_EQ(WriteFileAtomically(dir_.string() + "/", "x").code(), StatusCode::kInvalidArgument);
}

TEST_F(FileUtilTest, ALeftoverTemporaryFileIsReplaced) {
  const std::string path = (dir_ / "ATTEMPT").string();
  std::ofstream(path + ".tmp") << "a crashed write's leftover";
  ASSERT_TRUE(WriteFileAtomically(path, "3\n").ok());
  EXPECT_EQ(Slurp(path), "3\n");
  EXPECT_FALSE(fs::exists(path + ".tmp"));
}

TEST_F(FileUtilTest, WritesRelativeToTheCurrentDirectory) {
  const fs::path cwd = fs::current_path();
  fs::current_path(dir_);
  Status s = WriteFileAtomically("plain.txt", "here");
  fs::current_path(cwd);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(Slurp(dir_ / "plain.txt"), "here");
}

TEST_F(FileUtilTest, ReadPemFileNeedsAPemBlock) {
  std::ofstream(dir_ / "ca.pem") << "-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n";
  std::ofstream(dir_ / "junk.pem") << "junk";
  EXPECT_TRUE(ReadPemFile("--ca", (dir_ / "ca.pem").string()).ok());
  Status s = ReadPemFile("--ca", (dir_ / "junk.pem").string()).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("--ca"), std::string::npos);
}

}  // namespace
}  // namespace hydra
