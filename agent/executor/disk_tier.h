#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "agent/executor/io_pool.h"
#include "common/status.h"

namespace hydra::executor {

struct ConstBytes {
  const void* data;
  size_t size;
};
struct MutableBytes {
  void* data;
  size_t size;
};

/// Spill files align their parts: part i starts at offsets[i], a multiple of kSpillAlignment,
/// and the data ends at `*total` (also aligned), where a kSpillAlignment-byte trailer block
/// follows. Zero-byte parts take no room.
constexpr size_t kSpillAlignment = 4096;
std::vector<size_t> SpillLayout(const std::vector<size_t>& sizes, size_t* total);

/// Checks the trailer block that ends a spill file (kSpillAlignment bytes: the XXH3-64 of the
/// data, padding included, then the magic, then the data's length in bytes) against what was
/// read before it: the data's `digest` and its `total` bytes. DATA_LOSS naming `path` when the
/// block has another size or any field disagrees. Pure: reads only `block`.
Status CheckSpillTrailer(ConstBytes block, uint64_t digest, uint64_t total,
                         const std::string& path);

/// Page-aligned anonymous memory (mmap), zero-filled, given back to the system the moment it is
/// destroyed (munmap; no allocator keeps it). When a file's parts lie in one slab at their
/// SpillLayout offsets, the disk tier moves the slab with O_DIRECT: the disk reads and writes
/// it directly, with no copy through the page cache.
class AlignedSlab {
 public:
  /// nullptr when the system refuses the memory.
  static std::shared_ptr<AlignedSlab> Allocate(size_t bytes);
  /// The size of a slab allocated for `bytes`: whole 4 KiB pages, at least one.
  static size_t SizeFor(size_t bytes);
  ~AlignedSlab();
  AlignedSlab(const AlignedSlab&) = delete;
  AlignedSlab& operator=(const AlignedSlab&) = delete;
  char* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  AlignedSlab(char* data, size_t size) : data_(data), size_(size) {}
  char* data_;
  size_t size_;
};

/// The disk tier: moves byte buffers to and from files in a spill directory, on a fixed pool of
/// I/O threads (kDiskIoThreads unless given).
/// Knows nothing of tensors (the executor turns tensors into buffers). Each file ends with a
/// XXH3-64 hash of its contents, checked on every read. Parts laid out in an AlignedSlab go
/// through O_DIRECT; other buffers are written through the page cache, then flushed and dropped
/// from it, so reads really come from the disk and spilled state does not linger in memory.
/// Files are removed by Remove() and by the destructor.
/// Thread-safe; the buffers passed to Write/Read must stay valid until the future is ready.
class DiskTier {
 public:
  /// I/O threads per tier: a prefetch and a write-back at once.
  static constexpr int kDiskIoThreads = 2;
  /// Where the files go: `dir` itself, or a directory of the tier's own that Init creates
  /// beside it, `dir`.XXXXXX (mkdtemp), which no other tier, in this process or another,
  /// writes to: two trials of one name (in two namespaces, or a job created again while its
  /// old copy stops) never share spill files.
  enum class Folder { kExact, kUnique };
  /// Files are named <dir>/<key>.spill (dir(): with Folder::kUnique, the one Init made).
  explicit DiskTier(std::string dir, int io_threads = kDiskIoThreads,
                    Folder folder = Folder::kExact);
  ~DiskTier();
  DiskTier(const DiskTier&) = delete;
  DiskTier& operator=(const DiskTier&) = delete;

  /// Creates the directory (with Folder::kUnique, a new one) and checks that it is usable.
  Status Init();

  /// Writes `parts` as file `key` (at their SpillLayout offsets), replacing it atomically. A
  /// full disk or quota is UNAVAILABLE (the trial resumes from its last checkpoint: not its
  /// fault), an I/O error DATA_LOSS, each naming the file. When `slab` is
  /// given and the parts lie in it at their layout offsets, the slab goes out with O_DIRECT;
  /// the future keeps it alive. `ready`, if given, runs first on the I/O thread and returns
  /// once the parts hold their bytes (a GPU's copy out into them is done): the caller does not
  /// wait for that itself. If it throws, nothing is written and the future holds INTERNAL.
  std::future<Status> Write(const std::string& key, std::vector<ConstBytes> parts,
                            std::shared_ptr<AlignedSlab> slab = nullptr,
                            std::function<void()> ready = nullptr);
  /// Reads file `key` into `parts` (their sizes must match the file's layout); DATA_LOSS on a
  /// checksum mismatch or a file of the wrong size. `slab` as for Write.
  std::future<Status> Read(const std::string& key, std::vector<MutableBytes> parts,
                           std::shared_ptr<AlignedSlab> slab = nullptr);
  Status WriteSync(const std::string& key, std::vector<ConstBytes> parts,
                   const AlignedSlab* slab = nullptr);
  Status ReadSync(const std::string& key, std::vector<MutableBytes> parts,
                  const AlignedSlab* slab = nullptr);

  void Remove(const std::string& key);
  bool Exists(const std::string& key) const;

  int64_t bytes_written() const { return bytes_written_.load(); }
  /// Of the bytes written and read, those that went through O_DIRECT.
  int64_t direct_bytes() const { return direct_bytes_.load(); }
  int64_t bytes_read() const { return bytes_read_.load(); }
  /// Bytes currently held in spill files.
  int64_t bytes_on_disk() const;
  const std::string& dir() const { return dir_; }

 private:
  std::string PathFor(const std::string& key) const;
  /// One attempt, with O_DIRECT when `slab` holds the parts; a refused direct transfer leaves
  /// its errno in `*direct_errno`.
  Status WriteFile(const std::string& key, const std::vector<ConstBytes>& parts,
                   const AlignedSlab* slab, int* direct_errno);
  Status ReadFile(const std::string& key, const std::vector<MutableBytes>& parts,
                  const AlignedSlab* slab, int* direct_errno);
  std::string dir_;  // set before the tier is shared (Init)
  Folder folder_;
  std::atomic<int64_t> bytes_written_{0};
  std::atomic<int64_t> bytes_read_{0};
  std::atomic<int64_t> direct_bytes_{0};
  std::atomic<bool> direct_io_{true};  // false once the file system refused an O_DIRECT transfer
  mutable std::mutex mu_;
  std::set<std::string> keys_;            // guarded by mu_
  std::map<std::string, int64_t> sizes_;  // guarded by mu_
  IoPool io_;                             // shut down first in the destructor
};

}  // namespace hydra::executor
