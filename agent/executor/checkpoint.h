#pragma once

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

/// Writes `data` to `path` atomically: a temporary file in the same directory, fsync, rename,
/// fsync of the directory. The file ends with a CRC-32 of everything before it. A failure
/// (full disk, I/O error) leaves any previous file at `path` untouched.
Status WriteCheckpointFile(const std::string& path, const CheckpointData& data);

/// Reads and verifies a file written by WriteCheckpointFile; DATA_LOSS if it is truncated or
/// its checksum does not match.
StatusOr<CheckpointData> ReadCheckpointFile(const std::string& path);

/// The checkpoints of one trial in a directory: ckpt-<step>.hck, newest kept with `keep - 1`
/// predecessors. Not thread-safe.
class CheckpointStore {
 public:
  explicit CheckpointStore(std::string dir, int keep = 2) : dir_(std::move(dir)), keep_(keep) {}

  /// Writes the checkpoint of `step`, then removes all but the newest `keep` checkpoints.
  Status Save(int64_t step, const CheckpointData& data);

  /// The newest checkpoint that reads back intact. Corrupt newer files are skipped and named in
  /// `warnings`. NOT_FOUND if there is none.
  StatusOr<CheckpointData> LoadLatest(std::vector<std::string>* warnings) const;

  /// Steps of the checkpoints on disk, ascending.
  std::vector<int64_t> Steps() const;
  std::string PathFor(int64_t step) const;
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  int keep_;
};

}  // namespace hydra::executor
