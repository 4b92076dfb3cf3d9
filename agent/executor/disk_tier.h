#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

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

/// The disk tier: moves byte buffers to and from files in a spill directory, on I/O threads.
/// Knows nothing of tensors (the executor turns tensors into buffers). Each file ends with a
/// XXH3-64 hash of its contents, checked on every read. After a write the file's pages are flushed
/// and dropped from the page cache, so reads really come from the disk and spilled state does not
/// linger in memory. Files are removed by Remove() and by the destructor.
/// Thread-safe; the buffers passed to Write/Read must stay valid until the future is ready.
class DiskTier {
 public:
  /// Creates `dir` if needed. Files are named <dir>/<key>.spill.
  explicit DiskTier(std::string dir);
  ~DiskTier();
  DiskTier(const DiskTier&) = delete;
  DiskTier& operator=(const DiskTier&) = delete;

  /// Checks that the directory is usable (created, writable).
  Status Init();

  /// Writes the concatenation of `parts` as file `key`, replacing it atomically. A full disk or
  /// I/O error is RESOURCE_EXHAUSTED / DATA_LOSS naming the file.
  std::future<Status> Write(const std::string& key, std::vector<ConstBytes> parts);
  /// Reads file `key` into `parts` (sizes must add up to the file's); DATA_LOSS on a checksum
  /// mismatch or short file.
  std::future<Status> Read(const std::string& key, std::vector<MutableBytes> parts);
  Status WriteSync(const std::string& key, std::vector<ConstBytes> parts);
  Status ReadSync(const std::string& key, std::vector<MutableBytes> parts);

  void Remove(const std::string& key);
  bool Exists(const std::string& key) const;

  int64_t bytes_written() const { return bytes_written_.load(); }
  int64_t bytes_read() const { return bytes_read_.load(); }
  /// Bytes currently held in spill files.
  int64_t bytes_on_disk() const;
  const std::string& dir() const { return dir_; }

 private:
  std::string PathFor(const std::string& key) const;
  std::string dir_;
  std::atomic<int64_t> bytes_written_{0};
  std::atomic<int64_t> bytes_read_{0};
  mutable std::mutex mu_;
  std::set<std::string> keys_;            // guarded by mu_
  std::map<std::string, int64_t> sizes_;  // guarded by mu_
};

}  // namespace hydra::executor
