#include "agent/executor/checkpoint.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <optional>

#include "tests/fakes/temp_dir_test.h"

namespace hydra::executor {
namespace {

namespace fs = std::filesystem;

class CheckpointTest : public fakes::TempDirTest {
 protected:
  CheckpointTest() : TempDirTest("hydra_ckpt_test") {}

  static CheckpointData Sample(int64_t step) {
    CheckpointData d;
    d.meta = {{"step", step}, {"fingerprint", "abc"}};
    NamedBuffer a{"w", "float32", {2, 3}, std::vector<char>(24)};
    for (size_t i = 0; i < a.data.size(); ++i) a.data[i] = static_cast<char>(i * 7 + step);
    NamedBuffer b{"empty", "float32", {0}, {}};
    d.buffers = {a, b};
    return d;
  }
};

std::string Slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void Spit(const fs::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

/// A checkpoint file laid out by hand: magic, `header_len` (the real length unless given),
/// the header text, `data`, a correct CRC-32 of all that, and the end marker. What the writer
/// never produces, yet a reader must survive.
std::string RawCheckpoint(const std::string& header, const std::string& data,
                          std::optional<uint64_t> header_len = std::nullopt) {
  std::string out = "HYDRACK1";
  const uint64_t len = header_len.value_or(header.size());
  out.append(reinterpret_cast<const char*>(&len), sizeof(len));
  out += header + data;
  const uint32_t crc = static_cast<uint32_t>(
      crc32_z(crc32_z(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(out.data()), out.size()));
  out.append(reinterpret_cast<const char*>(&crc), sizeof(crc));
  return out + "HYDRAEND";
}

/// A header with one table entry per element of `buffers` (JSON objects).
std::string Header(const std::vector<nlohmann::json>& buffers) {
  return nlohmann::json{{"meta", {{"step", 1}}}, {"buffers", buffers}}.dump();
}

nlohmann::json Entry(const std::string& name, std::vector<int64_t> shape, uint64_t offset,
                     uint64_t bytes) {
  return {
      {"name", name}, {"dtype", "float32"}, {"shape", shape}, {"offset", offset}, {"bytes", bytes}};
}

/// ReadCheckpointFile of `bytes`, which must be DATA_LOSS naming the file and `problem`.
void ExpectCorrupt(const fs::path& path, const std::string& bytes, const std::string& problem) {
  Spit(path, bytes);
  auto read = ReadCheckpointFile(path.string());
  ASSERT_FALSE(read.ok()) << "accepted a file with: " << problem;
  EXPECT_EQ(read.status().code(), StatusCode::kDataLoss) << read.status();
  EXPECT_NE(read.status().message().find(path.string()), std::string::npos) << read.status();
  EXPECT_NE(read.status().message().find(problem), std::string::npos) << read.status();
}

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

TEST_F(CheckpointTest, ReadsTheFilesOfEarlierVersions) {
  // Written by CheckpointStore before the reader was rewritten (tests/fuzz/make_seeds.cc);
  // the format is unchanged, so it must load as it did.
  auto read =
      ReadCheckpointFile(HYDRA_SOURCE_DIR "/tests/fuzz/corpus/checkpoint/ckpt-0000000007.hck");
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->meta["step"], 7);
  ASSERT_EQ(read->buffers.size(), 4u);
  EXPECT_EQ(read->buffers[0].name, "wte.weight");
  EXPECT_EQ(read->buffers[0].shape, (std::vector<int64_t>{4, 3}));
  EXPECT_EQ(read->buffers[3].dtype, "int64");
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

TEST_F(CheckpointTest, EveryTruncationIsDataLoss) {
  const fs::path path = dir_ / "c.hck";
  ASSERT_TRUE(WriteCheckpointFile(path.string(), Sample(3)).ok());
  const std::string whole = Slurp(path);
  for (size_t n = 0; n < whole.size(); ++n) {
    Spit(path, whole.substr(0, n));
    auto read = ReadCheckpointFile(path.string());
    ASSERT_EQ(read.status().code(), StatusCode::kDataLoss) << n << " bytes: " << read.status();
  }
  ExpectCorrupt(path, whole.substr(0, 20), "truncated (20 bytes");
}

TEST_F(CheckpointTest, HeaderLengthBeyondTheFileOrTheLimitIsRefused) {
  const std::string header = Header({Entry("w", {2}, 0, 8)});
  const std::string data(8, 'd');
  const fs::path path = dir_ / "c.hck";
  ExpectCorrupt(path, RawCheckpoint(header, data, header.size() + data.size() + 1),
                "is larger than the file");
  ExpectCorrupt(path, RawCheckpoint(header, data, std::numeric_limits<uint64_t>::max()),
                "exceeds the limit");
  ExpectCorrupt(path, RawCheckpoint(header, data, kMaxCheckpointHeaderBytes + 1),
                "exceeds the limit");
  Spit(path, RawCheckpoint(header, data));
  EXPECT_TRUE(ReadCheckpointFile(path.string()).ok()) << "the hand-made file itself is valid";
}

TEST_F(CheckpointTest, BufferWhoseOffsetPlusSizeOverflowsIsRefused) {
  const fs::path path = dir_ / "c.hck";
  const uint64_t int64_max = std::numeric_limits<int64_t>::max();
  // Offset + size past INT64_MAX, and past UINT64_MAX (wrapping to a small number).
  ExpectCorrupt(path, RawCheckpoint(Header({Entry("w", {2}, int64_max - 3, 8)}), "12345678"),
                "lies outside");
  ExpectCorrupt(
      path,
      RawCheckpoint(Header({Entry("w", {2}, std::numeric_limits<uint64_t>::max() - 3, 8)}),
                    "12345678"),
      "lies outside");
  // A shape whose element count overflows 64 bits.
  ExpectCorrupt(path,
                RawCheckpoint(Header({Entry("w", {int64_t{1} << 40, 1 << 30}, 0, 8)}), "12345678"),
                "overflows 64 bits");
}

TEST_F(CheckpointTest, OverlappingBuffersAreRefused) {
  const fs::path path = dir_ / "c.hck";
  ExpectCorrupt(path,
                RawCheckpoint(Header({Entry("a", {6}, 0, 24), Entry("b", {6}, 16, 24)}),
                              std::string(40, 'd')),
                "buffer 'b' overlaps buffer 'a'");
  // Listed in any order, and a second buffer at the very same place.
  ExpectCorrupt(
      path,
      RawCheckpoint(Header({Entry("b", {2}, 0, 8), Entry("a", {2}, 0, 8)}), std::string(8, 'd')),
      "overlaps");
}

TEST_F(CheckpointTest, TrailingGarbageAndGapsAreRefused) {
  const fs::path path = dir_ / "c.hck";
  ExpectCorrupt(path, RawCheckpoint(Header({Entry("w", {2}, 0, 8)}), std::string(9, 'd')),
                "1 bytes of trailing garbage after the last buffer");
  ExpectCorrupt(
      path,
      RawCheckpoint(Header({Entry("a", {2}, 0, 8), Entry("b", {2}, 12, 8)}), std::string(20, 'd')),
      "4 bytes before buffer 'b' belong to no buffer");
  // Bytes appended after a whole file leave it without its end marker.
  const std::string whole = RawCheckpoint(Header({Entry("w", {2}, 0, 8)}), std::string(8, 'd'));
  ExpectCorrupt(path, whole + "x", "no end marker");
}

TEST_F(CheckpointTest, DtypeShapeAndSizeMustAgree) {
  const fs::path path = dir_ / "c.hck";
  ExpectCorrupt(path, RawCheckpoint(Header({Entry("w", {3}, 0, 8)}), std::string(8, 'd')),
                "holds 8 bytes, but its dtype and shape need 12");
  nlohmann::json odd = Entry("w", {2}, 0, 8);
  odd["dtype"] = "float128";
  ExpectCorrupt(path, RawCheckpoint(Header({odd}), std::string(8, 'd')), "unknown dtype");
  odd = Entry("w", {2}, 0, 8);
  odd["shape"] = {-2, -1};
  ExpectCorrupt(path, RawCheckpoint(Header({odd}), std::string(8, 'd')), "has no shape");
  odd = Entry("w", {2}, 0, 8);
  odd["offset"] = 0.5;
  ExpectCorrupt(path, RawCheckpoint(Header({odd}), std::string(8, 'd')), "has no offset");
  ExpectCorrupt(
      path,
      RawCheckpoint(Header({Entry("w", {2}, 0, 8), Entry("w", {2}, 8, 8)}), std::string(16, 'd')),
      "two buffers are named 'w'");
}

TEST_F(CheckpointTest, MalformedHeadersAreRefused) {
  const fs::path path = dir_ / "c.hck";
  ExpectCorrupt(path, RawCheckpoint("{\"meta\": 1, \"buffers\": [}", ""), "not valid JSON");
  ExpectCorrupt(path, RawCheckpoint("[1, 2]", ""), "header has no meta");
  ExpectCorrupt(path, RawCheckpoint("{\"meta\": {}, \"buffers\": {}}", ""), "no buffer table");
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  ExpectCorrupt(path, RawCheckpoint("{\"meta\": " + deep + ", \"buffers\": []}", ""),
                "nests deeper than");
  std::string bad_magic = RawCheckpoint(Header({}), "");
  bad_magic[0] = 'X';
  ExpectCorrupt(path, bad_magic, "bad magic");
}

TEST_F(CheckpointTest, AHugeDeclaredBufferIsRefusedBeforeItIsAllocated) {
  // 4 TiB declared in a file of a few hundred bytes. Were it allocated first, the allocation
  // would fail (std::bad_alloc, or an ASan abort) instead of this DATA_LOSS.
  const uint64_t huge = uint64_t{1} << 42;
  const fs::path path = dir_ / "c.hck";
  ExpectCorrupt(path,
                RawCheckpoint(Header({Entry("w", {static_cast<int64_t>(huge / 4)}, 0, huge)}),
                              std::string(8, 'd')),
                "lies outside the file's 8 data bytes");
}

TEST_F(CheckpointTest, ReadsFromAnOpenFileWithoutMovingItsOffset) {
  const std::string path = (dir_ / "c.hck").string();
  ASSERT_TRUE(WriteCheckpointFile(path, Sample(4)).ok());
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::lseek(fd, 5, SEEK_SET), 5);
  auto read = ReadCheckpointFd(fd, "the-name");
  EXPECT_EQ(::lseek(fd, 0, SEEK_CUR), 5);
  ::close(fd);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->buffers[0].data, Sample(4).buffers[0].data);
}

TEST_F(CheckpointTest, StoreKeepsNewestAndFallsBackPastCorruption) {
  CheckpointStore store((dir_ / "trial").string(), 2);
  EXPECT_EQ(store.LoadLatest(nullptr).status().code(), StatusCode::kNotFound);
  for (int64_t step : {10, 20, 30}) ASSERT_TRUE(store.Save(step, Sample(step)).ok());
  EXPECT_EQ(*store.Steps(), (std::vector<int64_t>{20, 30}));
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
  EXPECT_EQ(*store.Steps(), (std::vector<int64_t>{15}));
  ASSERT_TRUE(store.Save(16, Sample(16)).ok());
  EXPECT_EQ(*store.Steps(), (std::vector<int64_t>{15, 16}));
}

TEST_F(CheckpointTest, ADirectoryThatCannotBeListedIsNotAnEmptyOne) {
  // Once read as "no checkpoints": the trial started over from step 0, and a later save,
  // with the listing working again, removed the run's newer checkpoints as leftovers.
  std::ofstream(dir_ / "not-a-directory") << "x";
  CheckpointStore store((dir_ / "not-a-directory").string());
  auto steps = store.Steps();
  EXPECT_EQ(steps.status().code(), StatusCode::kUnavailable) << steps.status();
  EXPECT_NE(steps.status().message().find("not-a-directory"), std::string::npos);
  EXPECT_EQ(store.LoadLatest(nullptr).status().code(), StatusCode::kUnavailable);
  EXPECT_TRUE(CheckpointStore((dir_ / "missing").string()).Steps()->empty()) << "none yet";
}

TEST_F(CheckpointTest, ANewestCheckpointThatCannotBeReadForNowIsNotSkipped) {
  // Only a corrupt newest checkpoint (DATA_LOSS) gives way to an older one. Another error (here
  // ENXIO: a socket where the newest is; in life EMFILE, ENOMEM) once did too, and the next
  // save at the older step then removed the newer file as a leftover.
  CheckpointStore store((dir_ / "trial").string(), 3);
  for (int64_t step : {10, 20}) ASSERT_TRUE(store.Save(step, Sample(step)).ok());
  const std::string newest = store.PathFor(30);
  const int sock = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(sock, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  ASSERT_LT(newest.size(), sizeof(addr.sun_path));
  std::strncpy(addr.sun_path, newest.c_str(), sizeof(addr.sun_path) - 1);
  ASSERT_EQ(::bind(sock, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)), 0);
  std::vector<std::string> warnings;
  auto latest = store.LoadLatest(&warnings);
  ::close(sock);
  ASSERT_FALSE(latest.ok());
  EXPECT_EQ(latest.status().code(), StatusCode::kUnavailable) << latest.status();
  EXPECT_NE(latest.status().message().find("ckpt-0000000030.hck"), std::string::npos);
  EXPECT_NE(latest.status().message().find("older checkpoints are not used"), std::string::npos);
  EXPECT_TRUE(warnings.empty());
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

TEST_F(CheckpointTest, APlantedSymlinkAtTheTemporaryPathIsNotWrittenThrough) {
  // The write succeeds: O_EXCL | O_NOFOLLOW refuse the link, which is then unlinked (the link,
  // not its target) and the temporary file created afresh.
  const fs::path victim = dir_ / "victim";
  Spit(victim, "precious");
  const std::string path = (dir_ / "c.hck").string();
  fs::create_symlink(victim, path + ".tmp");
  ASSERT_TRUE(WriteCheckpointFile(path, Sample(2)).ok());
  EXPECT_EQ(Slurp(victim), "precious");
  EXPECT_FALSE(fs::exists(fs::symlink_status(path + ".tmp")));
  auto back = ReadCheckpointFile(path);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->meta["step"], 2);
  // The same through the store, with a link to a device that would fail every write.
  if (fs::exists("/dev/full")) {
    CheckpointStore store((dir_ / "trial").string());
    ASSERT_TRUE(store.Save(1, Sample(1)).ok());
    fs::create_symlink("/dev/full", store.PathFor(2) + ".tmp");
    ASSERT_TRUE(store.Save(2, Sample(2)).ok());
    EXPECT_EQ(*store.Steps(), (std::vector<int64_t>{1, 2}));
  }
}

TEST_F(CheckpointTest, ALinkOrAFifoPlantedAsACheckpointIsCorruptAndNeverFollowed) {
  // A real checkpoint elsewhere, linked in as step 3: not read through the link.
  const fs::path elsewhere = dir_ / "elsewhere.hck";
  ASSERT_TRUE(WriteCheckpointFile(elsewhere.string(), Sample(3)).ok());
  const fs::path link = dir_ / "link.hck";
  fs::create_symlink(elsewhere, link);
  auto linked = ReadCheckpointFile(link.string());
  EXPECT_EQ(linked.status().code(), StatusCode::kDataLoss) << linked.status();
  EXPECT_NE(linked.status().message().find("symbolic link"), std::string::npos);
  // A FIFO would block a plain open forever.
  const fs::path fifo = dir_ / "fifo.hck";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto piped = ReadCheckpointFile(fifo.string());
  EXPECT_EQ(piped.status().code(), StatusCode::kDataLoss) << piped.status();
  EXPECT_NE(piped.status().message().find("not a regular file"), std::string::npos);
}

TEST_F(CheckpointTest, ASymlinkAtTheFinalPathIsReplacedNotFollowed) {
  // The write succeeds: rename replaces the link itself; its target is untouched.
  const fs::path victim = dir_ / "victim";
  Spit(victim, "precious");
  const fs::path path = dir_ / "c.hck";
  fs::create_symlink(victim, path);
  ASSERT_TRUE(WriteCheckpointFile(path.string(), Sample(2)).ok());
  EXPECT_EQ(Slurp(victim), "precious");
  EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(path)));
  EXPECT_TRUE(ReadCheckpointFile(path.string()).ok());
}

TEST_F(CheckpointTest, ASymlinkedDirectoryIsRefused) {
  // The write fails: the directory itself may have been swapped for a link to anywhere.
  fs::create_directories(dir_ / "real");
  fs::create_directory_symlink(dir_ / "real", dir_ / "link");
  CheckpointStore store((dir_ / "link").string());
  Status s = store.Save(1, Sample(1));
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("symbolic link"), std::string::npos) << s;
  EXPECT_TRUE(fs::is_empty(dir_ / "real"));
}

TEST_F(CheckpointTest, ALeftoverTemporaryFileIsReplaced) {
  const std::string path = (dir_ / "c.hck").string();
  Spit(path + ".tmp", "a crashed write's leftover");
  ASSERT_TRUE(WriteCheckpointFile(path, Sample(5)).ok());
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  EXPECT_TRUE(ReadCheckpointFile(path).ok());
}

/// Checks what a store whose second Save ran out of space (`s`) left behind.
void ExpectOutOfSpace(const Status& s, const CheckpointStore& store) {
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find("directory " + store.dir()), std::string::npos) << s;
  EXPECT_NE(s.message().find("previous one is intact"), std::string::npos) << s;
  EXPECT_FALSE(fs::exists(store.PathFor(2) + ".tmp"));
  EXPECT_EQ(*store.Steps(), (std::vector<int64_t>{1}));
  auto back = store.LoadLatest(nullptr);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->meta["step"], 1);
}

CheckpointData Large(int64_t step, size_t bytes) {
  CheckpointData d;
  d.meta = {{"step", step}};
  d.buffers.push_back(
      {"big", "Byte", {static_cast<int64_t>(bytes)}, std::vector<char>(bytes, 'b')});
  return d;
}

TEST_F(CheckpointTest, AFullDiskIsResourceExhaustedAndKeepsThePreviousCheckpoint) {
  // A real ENOSPC: a 256 KiB tmpfs mounted for the test (needs root and mount(2); skipped
  // otherwise, the injected failures below still run).
  const fs::path mnt = dir_ / "tmpfs";
  fs::create_directories(mnt);
  if (::mount("hydra-test", mnt.c_str(), "tmpfs", 0, "size=256k") != 0) {
    GTEST_SKIP() << "cannot mount a tmpfs here (" << std::strerror(errno) << ")";
  }
  struct Unmount {
    ~Unmount() { ::umount2(path.c_str(), MNT_DETACH); }
    std::string path;
  } unmount{mnt.string()};
  CheckpointStore store((mnt / "trial").string());
  ASSERT_TRUE(store.Save(1, Sample(1)).ok());
  Status s = store.Save(2, Large(2, 1 << 20));
  ExpectOutOfSpace(s, store);
  EXPECT_NE(s.message().find("No space left"), std::string::npos) << s;
}

TEST_F(CheckpointTest, AnInjectedQuotaOrFullDiskIsResourceExhausted) {
  for (int err : {EDQUOT, ENOSPC}) {
    // Writes go through until 100 bytes, then fail with `err`.
    auto budget = std::make_shared<size_t>(100);
    CheckpointWriteFn write_fn = [budget, err](int fd, const void* p, size_t n) -> ssize_t {
      if (*budget == 0) {
        errno = err;
        return -1;
      }
      const ssize_t w = ::write(fd, p, std::min(n, *budget));
      if (w > 0) *budget -= static_cast<size_t>(w);
      return w;
    };
    const fs::path dir = dir_ / ("trial" + std::to_string(err));
    CheckpointStore store(dir.string(), 2, write_fn);
    ASSERT_TRUE(CheckpointStore(dir.string()).Save(1, Sample(1)).ok());
    ExpectOutOfSpace(store.Save(2, Large(2, 4096)), store);
  }
}

TEST_F(CheckpointTest, OtherWriteErrorsKeepTheirCode) {
  CheckpointWriteFn eio = [](int, const void*, size_t) -> ssize_t {
    errno = EIO;
    return -1;
  };
  CheckpointStore store((dir_ / "trial").string(), 2, eio);
  Status s = store.Save(1, Sample(1));
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s;
  EXPECT_FALSE(fs::exists(store.PathFor(1) + ".tmp"));
  EXPECT_TRUE(store.Steps()->empty());
}

}  // namespace
}  // namespace hydra::executor
