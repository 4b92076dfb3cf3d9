#include "agent/rpc/trial_paths.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <system_error>

namespace hydra::agent {
namespace {

namespace fs = std::filesystem;

/// The files a trial writes into its checkpoint directory start with one of these (their
/// temporary copies add a suffix, or a leading dot).
constexpr const char* kTrialFilePrefixes[] = {"ckpt-", "ATTEMPT", "model.pt", "model.safetensors",
                                              "config.json"};

bool IsTrialFile(const std::string& name) {
  const std::string bare = !name.empty() && name[0] == '.' ? name.substr(1) : name;
  for (const char* prefix : kTrialFilePrefixes) {
    if (bare.rfind(prefix, 0) == 0) return true;
  }
  return false;
}

/// The real path of an open file descriptor, from /proc.
StatusOr<std::string> RealPathOf(int fd) {
  std::error_code ec;
  const fs::path real = fs::read_symlink("/proc/self/fd/" + std::to_string(fd), ec);
  if (ec) return InternalError("reading the path of an open directory: " + ec.message());
  return real.string();
}

/// Opens `dir` as a directory without following a symlink in its last component and checks
/// that its real path is `dir`. NOT_FOUND if it does not exist.
StatusOr<int> OpenCheckedDirectory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return NotFoundError(dir + " does not exist");
    if (err == ELOOP || err == ENOTDIR) {
      return PermissionDeniedError(dir + " is not a directory (a symlink or a file)");
    }
    return ErrnoError("opening " + dir, err);
  }
  auto real = RealPathOf(fd);
  if (!real.ok() || *real != dir) {
    ::close(fd);
    if (!real.ok()) return real.status();
    return PermissionDeniedError(dir + " resolves to " + *real +
                                 " after opening (a symlink along the path changed)");
  }
  return fd;
}

}  // namespace

StatusOr<std::string> ResolvePath(const std::string& path) {
  std::error_code ec;
  const fs::path resolved = fs::weakly_canonical(fs::path(path), ec);
  if (ec) return InvalidArgumentError("cannot resolve " + path + ": " + ec.message());
  return resolved.string();
}

bool PathsNest(const std::string& a, const std::string& b) {
  auto under = [](const std::string& x, const std::string& root) {
    return x == root || x.rfind(root + "/", 0) == 0;
  };
  return under(a, b) || under(b, a);
}

Status CheckCheckpointLayout(const Trial& trial, const std::string& resolved,
                             const std::vector<std::string>& roots) {
  std::string expected;
  for (const auto& root : roots) {
    const std::string dir = root + "/" + trial.namespace_ + "/" + trial.job + "/" + trial.name;
    if (resolved == dir || resolved.rfind(dir + "/", 0) == 0) return OkStatus();
    expected += (expected.empty() ? "" : " or ") + dir;
  }
  return InvalidArgumentError("checkpoint_dir: " + resolved + " is not the directory of trial " +
                              TrialDisplayName(trial) + " (must be " + expected +
                              ", or a directory below it)");
}

Status CreateCheckedDirectory(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return ErrnoError("creating " + dir, ec.value());
  ASSIGN_OR_RETURN(int fd, OpenCheckedDirectory(dir));
  ::close(fd);
  return OkStatus();
}

Status RemoveTrialFiles(const std::string& dir) {
  auto opened = OpenCheckedDirectory(dir);
  if (!opened.ok() && opened.status().code() == StatusCode::kNotFound) return OkStatus();
  if (!opened.ok()) return opened.status();
  const int fd = *opened;
  DIR* listing = ::fdopendir(::dup(fd));
  if (listing == nullptr) {
    const int err = errno;
    ::close(fd);
    return ErrnoError("listing " + dir, err);
  }
  Status result;
  while (const dirent* entry = ::readdir(listing)) {
    const std::string name = entry->d_name;
    if (!IsTrialFile(name)) continue;
    struct stat st {};
    if (::fstatat(fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 || S_ISDIR(st.st_mode)) continue;
    // unlinkat removes a symlink itself, never its target.
    if (::unlinkat(fd, name.c_str(), 0) != 0 && errno != ENOENT && result.ok()) {
      result = ErrnoError("removing " + dir + "/" + name, errno);
    }
  }
  ::closedir(listing);
  ::close(fd);
  if (result.ok() && ::rmdir(dir.c_str()) != 0 && errno != ENOTEMPTY && errno != EEXIST &&
      errno != ENOENT) {
    result = ErrnoError("removing " + dir, errno);
  }
  return result;
}

}  // namespace hydra::agent
