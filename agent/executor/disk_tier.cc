#include "agent/executor/disk_tier.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

namespace hydra::executor {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kSpillMagic = 0x31334858'4c4c5053;  // "SPLLXH31"

Status WriteFully(int fd, const void* p, size_t n, off_t offset, const std::string& path) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t w = ::pwrite(fd, c, n, offset);
    if (w < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("writing spill file " + path, errno);
    }
    c += w;
    n -= static_cast<size_t>(w);
    offset += w;
  }
  return OkStatus();
}

Status ReadFully(int fd, void* p, size_t n, off_t offset, const std::string& path) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    ssize_t r = ::pread(fd, c, n, offset);
    if (r < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("reading spill file " + path, errno);
    }
    if (r == 0) return DataLossError("spill file " + path + " is shorter than expected");
    c += r;
    n -= static_cast<size_t>(r);
    offset += r;
  }
  return OkStatus();
}

}  // namespace

DiskTier::DiskTier(std::string dir) : dir_(std::move(dir)) {}

DiskTier::~DiskTier() {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& k : keys_) ::unlink(PathFor(k).c_str());
  std::error_code ec;
  fs::remove(dir_, ec);  // only if empty: the directory may be shared
}

Status DiskTier::Init() {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) return InternalError("cannot create spill directory " + dir_ + ": " + ec.message());
  if (::access(dir_.c_str(), W_OK) != 0) return ErrnoError("spill directory " + dir_, errno);
  return OkStatus();
}

std::string DiskTier::PathFor(const std::string& key) const {
  return (fs::path(dir_) / (key + ".spill")).string();
}

Status DiskTier::WriteSync(const std::string& key, std::vector<ConstBytes> parts) {
  const std::string path = PathFor(key);
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoError("creating spill file " + tmp, errno);
  // XXH3-64 rather than CRC-32: at tens of GB/s it costs the training cores almost nothing
  // (zlib's CRC-32 runs at ~2 GB/s here, a second of CPU per step of GPT-2 small from disk).
  XXH3_state_t* hash = XXH3_createState();
  XXH3_64bits_reset(hash);
  off_t offset = 0;
  Status s;
  for (const auto& p : parts) {
    if (p.size == 0) continue;
    XXH3_64bits_update(hash, p.data, p.size);
    s = WriteFully(fd, p.data, p.size, offset, tmp);
    if (!s.ok()) break;
    offset += static_cast<off_t>(p.size);
  }
  const uint64_t trailer[2] = {XXH3_64bits_digest(hash), kSpillMagic};
  XXH3_freeState(hash);
  if (s.ok()) s = WriteFully(fd, trailer, sizeof(trailer), offset, tmp);
  // Flush and drop the pages: spilled state must leave memory, and later reads must measure
  // the disk rather than the page cache.
  if (s.ok() && ::fdatasync(fd) != 0) s = ErrnoError("flushing spill file " + tmp, errno);
  if (s.ok()) ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
  if (s.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    s = ErrnoError("renaming spill file " + tmp, errno);
  }
  if (!s.ok()) {
    ::unlink(tmp.c_str());
    return s;
  }
  bytes_written_ += offset;
  std::lock_guard<std::mutex> lock(mu_);
  keys_.insert(key);
  sizes_[key] = offset + static_cast<off_t>(sizeof(trailer));
  return OkStatus();
}

Status DiskTier::ReadSync(const std::string& key, std::vector<MutableBytes> parts) {
  const std::string path = PathFor(key);
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("opening spill file " + path, errno);
  struct stat st {};
  ::fstat(fd, &st);
  size_t expected = 0;
  for (const auto& p : parts) expected += p.size;
  Status s;
  if (static_cast<size_t>(st.st_size) != expected + 16) {
    s = DataLossError("spill file " + path + " has " + std::to_string(st.st_size) +
                      " bytes, expected " + std::to_string(expected + 16));
  }
  XXH3_state_t* hash = XXH3_createState();
  XXH3_64bits_reset(hash);
  off_t offset = 0;
  for (const auto& p : parts) {
    if (!s.ok()) break;
    if (p.size == 0) continue;
    s = ReadFully(fd, p.data, p.size, offset, path);
    if (s.ok()) XXH3_64bits_update(hash, p.data, p.size);
    offset += static_cast<off_t>(p.size);
  }
  uint64_t trailer[2] = {0, 0};
  if (s.ok()) s = ReadFully(fd, trailer, sizeof(trailer), offset, path);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
  const uint64_t digest = XXH3_64bits_digest(hash);
  XXH3_freeState(hash);
  if (s.ok() && (trailer[1] != kSpillMagic || trailer[0] != digest)) {
    s = DataLossError("spill file " + path + " is corrupt: checksum mismatch");
  }
  if (s.ok()) bytes_read_ += offset;
  return s;
}

std::future<Status> DiskTier::Write(const std::string& key, std::vector<ConstBytes> parts) {
  return std::async(std::launch::async,
                    [this, key, parts = std::move(parts)]() { return WriteSync(key, parts); });
}

std::future<Status> DiskTier::Read(const std::string& key, std::vector<MutableBytes> parts) {
  return std::async(std::launch::async,
                    [this, key, parts = std::move(parts)]() { return ReadSync(key, parts); });
}

void DiskTier::Remove(const std::string& key) {
  ::unlink(PathFor(key).c_str());
  std::lock_guard<std::mutex> lock(mu_);
  keys_.erase(key);
  sizes_.erase(key);
}

bool DiskTier::Exists(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  return keys_.count(key) > 0;
}

int64_t DiskTier::bytes_on_disk() const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t total = 0;
  for (const auto& [k, v] : sizes_) total += v;
  return total;
}

}  // namespace hydra::executor
