#include "common/file_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <filesystem>

namespace hydra {
namespace {

namespace fs = std::filesystem;

/// Opens `dir` without following a symlink in its place and checks it is a directory; -1 with
/// `*status` set otherwise.
int OpenDirectory(const std::string& dir, Status* status) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    *status = err == ELOOP || err == ENOTDIR
                  ? FailedPreconditionError("directory " + dir +
                                            " is a symbolic link or not a directory; not writing "
                                            "there")
                  : ErrnoError("opening directory " + dir, err);
    return -1;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISDIR(st.st_mode)) {
    *status = FailedPreconditionError("directory " + dir + " is not a directory");
    ::close(fd);
    return -1;
  }
  return fd;
}

/// Creates `name` in `dir_fd` with O_EXCL | O_NOFOLLOW; an entry already there (a crashed
/// write's leftover, or a planted symlink) is unlinked first. -1 with errno on failure.
int CreateExclusive(int dir_fd, const std::string& name) {
  constexpr int kFlags = O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC;
  const int fd = ::openat(dir_fd, name.c_str(), kFlags, 0644);
  if (fd >= 0 || errno != EEXIST) return fd;
  if (::unlinkat(dir_fd, name.c_str(), 0) != 0 && errno != ENOENT) return -1;
  return ::openat(dir_fd, name.c_str(), kFlags, 0644);
}

Status WriteFully(int fd, const std::string& content, const std::string& what) {
  const char* p = content.data();
  size_t left = content.size();
  while (left > 0) {
    const ssize_t w = ::write(fd, p, left);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return ErrnoError("writing " + what, errno);
    p += w;
    left -= static_cast<size_t>(w);
  }
  return OkStatus();
}

/// Writes `content` to `tmp` in `dir_fd`, flushes it and renames it to `name`; on failure
/// removes `tmp`. `tmp_path` names it in errors.
Status WriteAndRename(int dir_fd, const std::string& tmp, const std::string& name,
                      const std::string& content, const std::string& tmp_path) {
  const int fd = CreateExclusive(dir_fd, tmp);
  if (fd < 0) return ErrnoError("creating " + tmp_path, errno);
  Status s = WriteFully(fd, content, tmp_path);
  if (s.ok() && ::fsync(fd) != 0) s = ErrnoError("fsync of " + tmp_path, errno);
  if (::close(fd) != 0 && s.ok()) s = ErrnoError("closing " + tmp_path, errno);
  if (s.ok() && ::renameat(dir_fd, tmp.c_str(), dir_fd, name.c_str()) != 0) {
    s = ErrnoError("renaming " + tmp_path + " to " + name, errno);
  }
  if (!s.ok()) ::unlinkat(dir_fd, tmp.c_str(), 0);
  return s;
}

}  // namespace

Status WriteFileAtomically(const std::string& path, const std::string& content) {
  const fs::path target(path);
  const std::string dir = target.parent_path().empty() ? "." : target.parent_path().string();
  const std::string name = target.filename().string();
  if (name.empty() || name == "." || name == "..") {
    return InvalidArgumentError(path + " names no file");
  }
  Status s;
  const int dir_fd = OpenDirectory(dir, &s);
  if (dir_fd < 0) return s;
  s = WriteAndRename(dir_fd, name + ".tmp", name, content, path + ".tmp");
  if (s.ok() && ::fsync(dir_fd) != 0) s = ErrnoError("fsync of directory " + dir, errno);
  ::close(dir_fd);
  return s;
}

StatusOr<std::string> ReadFile(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return ErrnoError("reading " + path, errno);
  // To its end, checking every read: an error partway (EIO; EISDIR for a directory) is the
  // error, never the bytes read before it. (Files of /proc and /sys report no true size.)
  std::string out;
  char chunk[1 << 16];
  while (true) {
    const ssize_t n = ::read(fd.get(), chunk, sizeof(chunk));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoError("reading " + path, errno);
    if (n == 0) return out;
    out.append(chunk, static_cast<size_t>(n));
  }
}

StatusOr<std::string> ReadOwnFile(const std::string& path, size_t max_bytes) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (fd.get() < 0) {
    if (errno == ELOOP) return FailedPreconditionError(path + " is a symbolic link");
    return ErrnoError("opening " + path, errno);
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return ErrnoError("stat of " + path, errno);
  if (!S_ISREG(st.st_mode)) return FailedPreconditionError(path + " is not a regular file");
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    return FailedPreconditionError(path + " holds " + std::to_string(st.st_size) +
                                   " bytes, more than the " + std::to_string(max_bytes) +
                                   " expected");
  }
  std::string out(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < out.size()) {
    const ssize_t n = ::read(fd.get(), out.data() + got, out.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoError("reading " + path, errno);
    if (n == 0) break;  // shrank meanwhile
    got += static_cast<size_t>(n);
  }
  out.resize(got);
  return out;
}

StatusOr<std::string> ReadPemFile(const std::string& what, const std::string& path) {
  auto text = ReadFile(path);
  if (!text.ok()) return text.status().WithContext(what);
  if (text->find("-----BEGIN") == std::string::npos) {
    return InvalidArgumentError(what + ": " + path + " is not a PEM file");
  }
  return text;
}

}  // namespace hydra
