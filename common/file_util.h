#pragma once

#include <unistd.h>

#include <string>
#include <utility>

#include "common/status.h"

namespace hydra {

/// Replaces `path` with `content` atomically (temporary file, fsync, rename, fsync of the
/// directory): readers see the old or the new file, never a torn one. Nothing is written
/// through a symlink: the directory is opened with O_DIRECTORY | O_NOFOLLOW (FAILED_PRECONDITION
/// if it is a symlink or not a directory) and checked with fstat, and the temporary file is
/// created relative to it with openat(O_CREAT | O_EXCL | O_NOFOLLOW); a leftover or planted
/// entry at the temporary path is unlinked (the entry itself, never its target) first, and a
/// symlink at `path` is replaced by the rename, not followed. A failure removes the temporary
/// file and leaves `path` as it was.
Status WriteFileAtomically(const std::string& path, const std::string& content);

/// Reads a whole file.
StatusOr<std::string> ReadFile(const std::string& path);

/// A file descriptor, closed when destroyed.
class UniqueFd {
 public:
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&&) = delete;
  ~UniqueFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }
  /// Closes now; close's result.
  int Close() { return ::close(std::exchange(fd_, -1)); }

 private:
  int fd_;
};

/// Reads a small file the caller wrote itself (e.g. a trial's ATTEMPT file), trusting nothing
/// planted in its place: the file is opened with O_NOFOLLOW | O_NONBLOCK (a symlink or a FIFO
/// never redirects or blocks the read) and must be a regular file of at most `max_bytes`;
/// FAILED_PRECONDITION otherwise, NOT_FOUND if it is not there.
StatusOr<std::string> ReadOwnFile(const std::string& path, size_t max_bytes);

/// Reads a PEM file (certificate, key or CA bundle); INVALID_ARGUMENT if it holds no PEM block,
/// errors name `what` (e.g. the flag) and the path.
StatusOr<std::string> ReadPemFile(const std::string& what, const std::string& path);

}  // namespace hydra
