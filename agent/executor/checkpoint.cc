#include "agent/executor/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

namespace hydra::executor {
namespace {

namespace fs = std::filesystem;

constexpr char kMagic[8] = {'H', 'Y', 'D', 'R', 'A', 'C', 'K', '1'};
constexpr char kTrailer[8] = {'H', 'Y', 'D', 'R', 'A', 'E', 'N', 'D'};

/// Writes through a file descriptor, accumulating the CRC of every byte.
class CrcWriter {
 public:
  explicit CrcWriter(int fd) : fd_(fd) {}
  Status Write(const void* p, size_t n, const std::string& what) {
    // crc32_z(crc, NULL, 0) returns the initial value, so skip empty writes.
    if (n > 0) crc_ = crc32_z(crc_, static_cast<const Bytef*>(p), n);
    return WriteRaw(p, n, what);
  }
  Status WriteRaw(const void* p, size_t n, const std::string& what) {
    const char* c = static_cast<const char*>(p);
    while (n > 0) {
      ssize_t w = ::write(fd_, c, n);
      if (w < 0) {
        if (errno == EINTR) continue;
        return ErrnoError("writing " + what, errno);
      }
      c += w;
      n -= static_cast<size_t>(w);
    }
    return OkStatus();
  }
  uLong crc() const { return crc_; }

 private:
  int fd_;
  uLong crc_ = crc32_z(0L, Z_NULL, 0);
};

Status FsyncDir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("opening directory " + dir, errno);
  int rc = ::fsync(fd);
  int e = errno;
  ::close(fd);
  if (rc != 0) return ErrnoError("fsync of directory " + dir, e);
  return OkStatus();
}

Status WriteAll(int fd, const CheckpointData& data, const std::string& what) {
  nlohmann::json header;
  header["meta"] = data.meta;
  nlohmann::json table = nlohmann::json::array();
  uint64_t offset = 0;
  for (const auto& b : data.buffers) {
    table.push_back({{"name", b.name},
                     {"dtype", b.dtype},
                     {"shape", b.shape},
                     {"offset", offset},
                     {"bytes", b.data.size()}});
    offset += b.data.size();
  }
  header["buffers"] = table;
  const std::string text = header.dump();
  const uint64_t len = text.size();
  CrcWriter w(fd);
  RETURN_IF_ERROR(w.Write(kMagic, sizeof(kMagic), what));
  RETURN_IF_ERROR(w.Write(&len, sizeof(len), what));
  RETURN_IF_ERROR(w.Write(text.data(), text.size(), what));
  for (const auto& b : data.buffers) RETURN_IF_ERROR(w.Write(b.data.data(), b.data.size(), what));
  const uint32_t crc = static_cast<uint32_t>(w.crc());
  RETURN_IF_ERROR(w.WriteRaw(&crc, sizeof(crc), what));
  return w.WriteRaw(kTrailer, sizeof(kTrailer), what);
}

}  // namespace

Status WriteCheckpointFile(const std::string& path, const CheckpointData& data) {
  const fs::path target(path);
  const std::string dir = target.parent_path().empty() ? "." : target.parent_path().string();
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return InternalError("creating checkpoint directory " + dir + ": " + ec.message());
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError("creating " + tmp, errno);
  Status s = WriteAll(fd, data, tmp);
  if (s.ok() && ::fsync(fd) != 0) s = ErrnoError("fsync of " + tmp, errno);
  if (::close(fd) != 0 && s.ok()) s = ErrnoError("closing " + tmp, errno);
  if (s.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    s = ErrnoError("renaming " + tmp + " to " + path, errno);
  }
  if (!s.ok()) {
    ::unlink(tmp.c_str());
    return s.WithContext("checkpoint not written (the previous one is intact)");
  }
  return FsyncDir(dir);
}

StatusOr<CheckpointData> ReadCheckpointFile(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return ErrnoError("opening checkpoint " + path, errno);
  std::vector<char> bytes;
  {
    char buf[1 << 16];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) bytes.insert(bytes.end(), buf, buf + n);
    bool err = std::ferror(f);
    std::fclose(f);
    if (err) return DataLossError("reading checkpoint " + path + ": I/O error");
  }
  auto corrupt = [&](const std::string& why) {
    return DataLossError("checkpoint " + path + " is corrupt: " + why);
  };
  const size_t fixed = sizeof(kMagic) + sizeof(uint64_t) + sizeof(uint32_t) + sizeof(kTrailer);
  if (bytes.size() < fixed)
    return corrupt("truncated (" + std::to_string(bytes.size()) + " bytes)");
  if (std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) return corrupt("bad magic");
  if (std::memcmp(bytes.data() + bytes.size() - sizeof(kTrailer), kTrailer, sizeof(kTrailer)) !=
      0) {
    return corrupt("truncated (no trailer)");
  }
  const size_t body = bytes.size() - sizeof(kTrailer) - sizeof(uint32_t);
  uint32_t stored = 0;
  std::memcpy(&stored, bytes.data() + body, sizeof(stored));
  const uint32_t actual = static_cast<uint32_t>(
      crc32_z(crc32_z(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(bytes.data()), body));
  if (stored != actual) return corrupt("checksum mismatch");
  uint64_t len = 0;
  std::memcpy(&len, bytes.data() + sizeof(kMagic), sizeof(len));
  const size_t header_begin = sizeof(kMagic) + sizeof(len);
  if (len > body - header_begin) return corrupt("header length out of range");
  CheckpointData out;
  nlohmann::json header;
  try {
    header =
        nlohmann::json::parse(bytes.begin() + header_begin, bytes.begin() + header_begin + len);
    out.meta = header.at("meta");
    const size_t data_begin = header_begin + len;
    for (const auto& t : header.at("buffers")) {
      NamedBuffer b;
      b.name = t.at("name").get<std::string>();
      b.dtype = t.at("dtype").get<std::string>();
      b.shape = t.at("shape").get<std::vector<int64_t>>();
      const uint64_t off = t.at("offset").get<uint64_t>();
      const uint64_t n = t.at("bytes").get<uint64_t>();
      if (off + n > body - data_begin) return corrupt("buffer " + b.name + " out of range");
      b.data.assign(bytes.begin() + data_begin + off, bytes.begin() + data_begin + off + n);
      out.buffers.push_back(std::move(b));
    }
  } catch (const nlohmann::json::exception& e) {
    return corrupt(std::string("bad header: ") + e.what());
  }
  return out;
}

std::string CheckpointStore::PathFor(int64_t step) const {
  char name[64];
  std::snprintf(name, sizeof(name), "ckpt-%010lld.hck", static_cast<long long>(step));
  return (fs::path(dir_) / name).string();
}

std::vector<int64_t> CheckpointStore::Steps() const {
  std::vector<int64_t> steps;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir_, ec)) {
    const std::string name = entry.path().filename().string();
    long long step = 0;
    char tail[8] = {0};
    if (std::sscanf(name.c_str(), "ckpt-%lld.%3s", &step, tail) == 2 &&
        std::string(tail) == "hck" && name.size() == 19) {
      steps.push_back(step);
    }
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

Status CheckpointStore::Save(int64_t step, const CheckpointData& data) {
  RETURN_IF_ERROR(WriteCheckpointFile(PathFor(step), data));
  // Checkpoints of later steps are leftovers that resuming skipped (corrupt, or of a run that
  // went further before this one resumed from an older file): they must not take the place of
  // an intact predecessor.
  std::vector<int64_t> kept;
  for (int64_t s : Steps()) {
    std::error_code ec;
    if (s > step) {
      fs::remove(PathFor(s), ec);
    } else {
      kept.push_back(s);
    }
  }
  for (size_t i = 0; i + keep_ < kept.size(); ++i) {
    std::error_code ec;
    fs::remove(PathFor(kept[i]), ec);  // best effort: an old checkpoint left behind is harmless
  }
  return OkStatus();
}

StatusOr<CheckpointData> CheckpointStore::LoadLatest(std::vector<std::string>* warnings) const {
  std::vector<int64_t> steps = Steps();
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    auto data = ReadCheckpointFile(PathFor(*it));
    if (data.ok()) return data;
    if (warnings) {
      warnings->push_back(data.status().message() + "; falling back to an older checkpoint");
    }
  }
  return NotFoundError("no intact checkpoint in " + dir_);
}

}  // namespace hydra::executor
