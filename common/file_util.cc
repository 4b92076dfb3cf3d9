#include "common/file_util.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <sstream>

namespace hydra {

Status WriteFileAtomically(const std::string& path, const std::string& content) {
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError("creating " + tmp, errno);
  const char* p = content.data();
  size_t left = content.size();
  Status s;
  while (left > 0) {
    ssize_t w = ::write(fd, p, left);
    if (w < 0) {
      if (errno == EINTR) continue;
      s = ErrnoError("writing " + tmp, errno);
      break;
    }
    p += w;
    left -= static_cast<size_t>(w);
  }
  if (s.ok() && ::fsync(fd) != 0) s = ErrnoError("fsync of " + tmp, errno);
  if (::close(fd) != 0 && s.ok()) s = ErrnoError("closing " + tmp, errno);
  if (s.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    s = ErrnoError("renaming " + tmp + " to " + path, errno);
  }
  if (!s.ok()) ::unlink(tmp.c_str());
  return s;
}

StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return ErrnoError("reading " + path, errno);
  std::stringstream buf;
  buf << in.rdbuf();
  return buf.str();
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
