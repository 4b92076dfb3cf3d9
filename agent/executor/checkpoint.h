#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "agent/executor/executor.h"
#include "common/status.h"

namespace hydra::executor {

/// The contents of one checkpoint: free-form metadata and the state buffers.
struct CheckpointData {
  nlohmann::json meta;  ///< step, fingerprint, loss history, ...
  std::vector<NamedBuffer> buffers;
};

/// The largest JSON header (metadata and buffer table) a checkpoint may have: far above what the
/// agent writes (the loss curves of a million steps), far below what would exhaust memory.
inline constexpr uint64_t kMaxCheckpointHeaderBytes = uint64_t{256} << 20;

/// How WriteCheckpointFile puts bytes into the file, with ::write's contract (bytes written, or
/// -1 with errno set). Empty means ::write; tests inject a full disk or quota through it.
using CheckpointWriteFn = std::function<ssize_t(int fd, const void* data, size_t size)>;

/// Writes `data` to `path` atomically: a temporary file in the same directory, fsync, rename,
/// fsync of the directory. The file ends with a CRC-32 of everything before it. The directory
/// is opened without following a symlink in its place, and the temporary file is created in it
/// with openat(O_CREAT | O_EXCL | O_NOFOLLOW), so no planted or swapped-in symlink is written
/// through. A failure leaves any previous file at `path` untouched and removes the temporary
/// file; a full disk or quota (ENOSPC, EDQUOT) is RESOURCE_EXHAUSTED naming the directory.
Status WriteCheckpointFile(const std::string& path, const CheckpointData& data,
                           const CheckpointWriteFn& write_fn = {});

/// Reads and verifies a file written by WriteCheckpointFile in one streaming pass: the CRC is
/// computed as the bytes arrive, and every header field is checked (header size, buffer
/// offsets and sizes within the file, buffers tiling the data with no overlap, gap or trailing
/// bytes, dtype and shape consistent with each size) before any buffer is allocated, so no
/// allocation exceeds the file's real size. DATA_LOSS naming the file and the problem otherwise.
StatusOr<CheckpointData> ReadCheckpointFile(const std::string& path);

/// ReadCheckpointFile on an open file (read with pread; its offset is left alone). `path` names
/// it in errors.
StatusOr<CheckpointData> ReadCheckpointFd(int fd, const std::string& path);

/// The checkpoints of one trial in a directory: ckpt-<step>.hck, newest kept with `keep - 1`
/// predecessors. Not thread-safe.
class CheckpointStore {
 public:
  /// `write_fn` as for WriteCheckpointFile.
  explicit CheckpointStore(std::string dir, int keep = 2, CheckpointWriteFn write_fn = {})
      : dir_(std::move(dir)), keep_(keep), write_fn_(std::move(write_fn)) {}

  /// Writes the checkpoint of `step`, then removes all but the newest `keep` checkpoints (and
  /// later ones, leftovers a resume skipped), where the directory can be listed.
  Status Save(int64_t step, const CheckpointData& data);

  /// The newest checkpoint that reads back intact. Corrupt newer files (DATA_LOSS) are skipped
  /// and named in `warnings`; any other error reading one (a file that cannot be opened, no
  /// memory) is UNAVAILABLE, as the directory's listing's is: the older checkpoint is not taken
  /// for the newest, and the next Save does not remove a newer file that may well be intact.
  /// NOT_FOUND if there is none.
  StatusOr<CheckpointData> LoadLatest(std::vector<std::string>* warnings) const;

  /// Steps of the checkpoints on disk, ascending; none if the directory does not exist.
  /// UNAVAILABLE naming the directory when it cannot be listed (EIO, a stale NFS handle, not
  /// a directory): nothing is known of its checkpoints then, and none may be taken as missing.
  StatusOr<std::vector<int64_t>> Steps() const;
  std::string PathFor(int64_t step) const;
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  int keep_;
  CheckpointWriteFn write_fn_;
};

}  // namespace hydra::executor
