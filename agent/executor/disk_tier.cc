#include "agent/executor/disk_tier.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <filesystem>

namespace hydra::executor {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kSpillMagic = 0x31334858'4c4c5053;  // "SPLLXH31"

/// `what` failed with errno `err`. A full disk or quota is UNAVAILABLE, not the trial's fault:
/// its step stops, and it resumes from its last checkpoint once there is room (or elsewhere).
Status SpillWriteError(const std::string& what, int err) {
  if (err != ENOSPC && err != EDQUOT) return ErrnoError(what, err);
  return UnavailableError(what + ": " + std::strerror(err) +
                          " (the spill directory is full; the trial can resume from its last "
                          "checkpoint)");
}

Status WriteFully(int fd, const void* p, size_t n, off_t offset, const std::string& path,
                  int* err = nullptr) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t w = ::pwrite(fd, c, n, offset);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (err) *err = errno;
      return SpillWriteError("writing spill file " + path, errno);
    }
    c += w;
    n -= static_cast<size_t>(w);
    offset += w;
  }
  return OkStatus();
}

Status ReadFully(int fd, void* p, size_t n, off_t offset, const std::string& path,
                 int* err = nullptr) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    ssize_t r = ::pread(fd, c, n, offset);
    if (r < 0) {
      if (errno == EINTR) continue;
      if (err) *err = errno;
      return ErrnoError("reading spill file " + path, errno);
    }
    if (r == 0) return DataLossError("spill file " + path + " is shorter than expected");
    c += r;
    n -= static_cast<size_t>(r);
    offset += r;
  }
  return OkStatus();
}

size_t RoundUp(size_t n) { return (n + kSpillAlignment - 1) / kSpillAlignment * kSpillAlignment; }

/// Padding between parts hashes as zeros.
const char kZeros[kSpillAlignment] = {};

/// The last block of a spill file: XXH3-64 of the data (padding included), the magic, and the
/// data's length. Aligned so that O_DIRECT can read and write it.
struct alignas(kSpillAlignment) TrailerBlock {
  uint64_t words[kSpillAlignment / sizeof(uint64_t)] = {};
};

template <class Part>
std::vector<size_t> Sizes(const std::vector<Part>& parts) {
  std::vector<size_t> sizes;
  for (const auto& p : parts) sizes.push_back(p.size);
  return sizes;
}

/// Whether every part lies in `slab` at its layout offset (so the slab's first `total` bytes
/// are the file's data, padding zero).
template <class Part>
bool InSlab(const std::vector<Part>& parts, const std::vector<size_t>& offsets, size_t total,
            const AlignedSlab& slab) {
  if (total > slab.size()) return false;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (parts[i].size != 0 && static_cast<const char*>(parts[i].data) != slab.data() + offsets[i]) {
      return false;
    }
  }
  return true;
}

/// Opens a spill file, with O_DIRECT when `*direct` and the file system takes it (else
/// `*direct` becomes false and the page cache is used).
int OpenSpill(const std::string& path, int flags, bool* direct) {
  if (*direct) {
    int fd = ::open(path.c_str(), flags | O_CLOEXEC | O_DIRECT, 0600);
    if (fd >= 0 || errno != EINVAL) return fd;
    *direct = false;
  }
  return ::open(path.c_str(), flags | O_CLOEXEC, 0600);
}

}  // namespace

std::vector<size_t> SpillLayout(const std::vector<size_t>& sizes, size_t* total) {
  std::vector<size_t> offsets;
  offsets.reserve(sizes.size());
  size_t at = 0;
  for (size_t n : sizes) {
    offsets.push_back(at);
    at = RoundUp(at + n);
  }
  *total = at;
  return offsets;
}

Status CheckSpillTrailer(ConstBytes block, uint64_t digest, uint64_t total,
                         const std::string& path) {
  uint64_t words[3] = {};
  if (block.size != kSpillAlignment) {
    return DataLossError("spill file " + path + " is corrupt: its trailer has " +
                         std::to_string(block.size) + " bytes, expected " +
                         std::to_string(kSpillAlignment));
  }
  std::memcpy(words, block.data, sizeof(words));  // the block need not be aligned
  if (words[1] != kSpillMagic || words[0] != digest || words[2] != total) {
    return DataLossError("spill file " + path + " is corrupt: checksum mismatch");
  }
  return OkStatus();
}

size_t AlignedSlab::SizeFor(size_t bytes) { return std::max(RoundUp(bytes), kSpillAlignment); }

std::shared_ptr<AlignedSlab> AlignedSlab::Allocate(size_t bytes) {
  const size_t size = SizeFor(bytes);
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  return std::shared_ptr<AlignedSlab>(new AlignedSlab(static_cast<char*>(p), size));
}

AlignedSlab::~AlignedSlab() { ::munmap(data_, size_); }

DiskTier::DiskTier(std::string dir, int io_threads, Folder folder)
    : dir_(std::move(dir)), folder_(folder), io_(io_threads) {}

DiskTier::~DiskTier() {
  io_.Shutdown();  // the transfers under way finish before their files go
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& k : keys_) ::unlink(PathFor(k).c_str());
  std::error_code ec;
  fs::remove(dir_, ec);  // only if empty: the directory may be shared
}

Status DiskTier::Init() {
  std::error_code ec;
  const fs::path made = folder_ == Folder::kUnique ? fs::path(dir_).parent_path() : fs::path(dir_);
  fs::create_directories(made, ec);
  if (ec)
    return InternalError("cannot create spill directory " + made.string() + ": " + ec.message());
  if (folder_ == Folder::kUnique) {
    std::string name = dir_ + ".XXXXXX";
    if (::mkdtemp(name.data()) == nullptr) return ErrnoError("spill directory " + name, errno);
    dir_ = name;
    folder_ = Folder::kExact;  // made: a second Init checks it again
  }
  if (::access(dir_.c_str(), W_OK) != 0) return ErrnoError("spill directory " + dir_, errno);
  return OkStatus();
}

std::string DiskTier::PathFor(const std::string& key) const {
  return (fs::path(dir_) / (key + ".spill")).string();
}

Status DiskTier::WriteSync(const std::string& key, std::vector<ConstBytes> parts,
                           const AlignedSlab* slab) {
  if (slab != nullptr && direct_io_.load()) {
    int err = 0;
    Status s = WriteFile(key, parts, slab, &err);
    if (err != EINVAL) return s;
    direct_io_ = false;  // opened with O_DIRECT, yet the transfer was refused: page cache
  }
  return WriteFile(key, parts, nullptr, nullptr);
}

Status DiskTier::ReadSync(const std::string& key, std::vector<MutableBytes> parts,
                          const AlignedSlab* slab) {
  if (slab != nullptr && direct_io_.load()) {
    int err = 0;
    Status s = ReadFile(key, parts, slab, &err);
    if (err != EINVAL) return s;
    direct_io_ = false;
  }
  return ReadFile(key, parts, nullptr, nullptr);
}

Status DiskTier::WriteFile(const std::string& key, const std::vector<ConstBytes>& parts,
                           const AlignedSlab* slab, int* direct_errno) {
  const std::string path = PathFor(key);
  const std::string tmp = path + ".tmp";
  size_t total = 0;
  const auto offsets = SpillLayout(Sizes(parts), &total);
  bool direct = slab != nullptr && InSlab(parts, offsets, total, *slab);
  const bool wanted_direct = direct;
  int fd = OpenSpill(tmp, O_WRONLY | O_CREAT | O_TRUNC, &direct);
  if (wanted_direct && !direct) direct_io_ = false;  // the file system has no O_DIRECT
  if (fd < 0) return SpillWriteError("creating spill file " + tmp, errno);
  // XXH3-64 rather than CRC-32: at tens of GB/s it costs the training cores almost nothing
  // (zlib's CRC-32 runs at ~2 GB/s here, a second of CPU per step of GPT-2 small from disk).
  // The hash covers the padding between parts (zeros) as well.
  Status s;
  uint64_t digest = 0;
  if (direct) {
    digest = XXH3_64bits(slab->data(), total);
    s = WriteFully(fd, slab->data(), total, 0, tmp, direct_errno);
  } else {
    XXH3_state_t* hash = XXH3_createState();
    if (hash == nullptr) {
      ::close(fd);
      ::unlink(tmp.c_str());
      return ResourceExhaustedError("no memory to hash spill file " + tmp);
    }
    XXH3_64bits_reset(hash);
    for (size_t i = 0; i < parts.size() && s.ok(); ++i) {
      if (parts[i].size == 0) continue;
      XXH3_64bits_update(hash, parts[i].data, parts[i].size);
      XXH3_64bits_update(hash, kZeros, RoundUp(parts[i].size) - parts[i].size);
      s = WriteFully(fd, parts[i].data, parts[i].size, static_cast<off_t>(offsets[i]), tmp);
    }
    digest = XXH3_64bits_digest(hash);
    XXH3_freeState(hash);
  }
  TrailerBlock trailer;
  trailer.words[0] = digest;
  trailer.words[1] = kSpillMagic;
  trailer.words[2] = total;
  if (s.ok())
    s = WriteFully(fd, trailer.words, kSpillAlignment, static_cast<off_t>(total), tmp,
                   direct ? direct_errno : nullptr);
  // Through the page cache: flush and drop the pages, since spilled state must leave memory
  // and later reads must measure the disk rather than the page cache.
  if (s.ok() && !direct && ::fdatasync(fd) != 0) {
    s = SpillWriteError("flushing spill file " + tmp, errno);
  }
  if (s.ok() && !direct) ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
  if (s.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    s = SpillWriteError("renaming spill file " + tmp, errno);
  }
  if (!s.ok()) {
    ::unlink(tmp.c_str());
    return s;
  }
  bytes_written_ += static_cast<int64_t>(total);
  if (direct) direct_bytes_ += static_cast<int64_t>(total);
  std::lock_guard<std::mutex> lock(mu_);
  keys_.insert(key);
  sizes_[key] = static_cast<int64_t>(total + kSpillAlignment);
  return OkStatus();
}

Status DiskTier::ReadFile(const std::string& key, const std::vector<MutableBytes>& parts,
                          const AlignedSlab* slab, int* direct_errno) {
  const std::string path = PathFor(key);
  size_t total = 0;
  const auto offsets = SpillLayout(Sizes(parts), &total);
  bool direct = slab != nullptr && InSlab(parts, offsets, total, *slab);
  const bool wanted_direct = direct;
  int fd = OpenSpill(path, O_RDONLY, &direct);
  if (wanted_direct && !direct) direct_io_ = false;  // the file system has no O_DIRECT
  if (fd < 0) return ErrnoError("opening spill file " + path, errno);
  struct stat st {};
  ::fstat(fd, &st);
  Status s;
  if (static_cast<size_t>(st.st_size) != total + kSpillAlignment) {
    s = DataLossError("spill file " + path + " has " + std::to_string(st.st_size) +
                      " bytes, expected " + std::to_string(total + kSpillAlignment));
  }
  uint64_t digest = 0;
  if (s.ok() && direct) {
    s = ReadFully(fd, slab->data(), total, 0, path, direct_errno);
    if (s.ok()) digest = XXH3_64bits(slab->data(), total);
  } else if (s.ok()) {
    XXH3_state_t* hash = XXH3_createState();
    if (hash == nullptr) {
      ::close(fd);
      return ResourceExhaustedError("no memory to hash spill file " + path);
    }
    XXH3_64bits_reset(hash);
    for (size_t i = 0; i < parts.size() && s.ok(); ++i) {
      if (parts[i].size == 0) continue;
      s = ReadFully(fd, parts[i].data, parts[i].size, static_cast<off_t>(offsets[i]), path);
      XXH3_64bits_update(hash, parts[i].data, parts[i].size);
      XXH3_64bits_update(hash, kZeros, RoundUp(parts[i].size) - parts[i].size);
    }
    digest = XXH3_64bits_digest(hash);
    XXH3_freeState(hash);
  }
  TrailerBlock trailer;
  if (s.ok())
    s = ReadFully(fd, trailer.words, kSpillAlignment, static_cast<off_t>(total), path,
                  direct ? direct_errno : nullptr);
  if (!direct) ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
  if (s.ok()) s = CheckSpillTrailer({trailer.words, kSpillAlignment}, digest, total, path);
  if (s.ok()) {
    bytes_read_ += static_cast<int64_t>(total);
    if (direct) direct_bytes_ += static_cast<int64_t>(total);
  }
  return s;
}

std::future<Status> DiskTier::Write(const std::string& key, std::vector<ConstBytes> parts,
                                    std::shared_ptr<AlignedSlab> slab,
                                    std::function<void()> ready) {
  return io_.Submit(
      [this, key, parts = std::move(parts), slab = std::move(slab), ready = std::move(ready)]() {
        if (ready) {
          try {
            ready();
          } catch (const std::exception& e) {  // a GPU's failed copy out: nothing to write
            return InternalError("the bytes of spill file " + key + " never arrived: " + e.what());
          }
        }
        return WriteSync(key, parts, slab.get());
      });
}

std::future<Status> DiskTier::Read(const std::string& key, std::vector<MutableBytes> parts,
                                   std::shared_ptr<AlignedSlab> slab) {
  return io_.Submit([this, key, parts = std::move(parts), slab = std::move(slab)]() {
    return ReadSync(key, parts, slab.get());
  });
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
