#include "agent/executor/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <new>
#include <numeric>
#include <optional>
#include <set>
#include <tuple>
#include <utility>

#include "common/file_util.h"

namespace hydra::executor {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// File format: magic, header length (uint64), JSON header ({"meta", "buffers": [{name, dtype,
// shape, offset, bytes}]}), the buffers' bytes back to back, CRC-32 of all that, end marker.
constexpr char kMagic[8] = {'H', 'Y', 'D', 'R', 'A', 'C', 'K', '1'};
constexpr char kTrailer[8] = {'H', 'Y', 'D', 'R', 'A', 'E', 'N', 'D'};
constexpr uint64_t kPrefixBytes = sizeof(kMagic) + sizeof(uint64_t);
constexpr uint64_t kSuffixBytes = sizeof(uint32_t) + sizeof(kTrailer);
/// Deeper than any header the agent writes; deeper ones are refused before parsing, since
/// copying or printing such a value recurses once per level.
constexpr int kMaxHeaderDepth = 64;
constexpr const char* kNotWritten = "checkpoint not written (the previous one is intact)";

/// A failed write into checkpoint directory `dir`: RESOURCE_EXHAUSTED naming the directory
/// when the disk or the quota is full, otherwise by errno.
Status WriteError(const std::string& dir, const std::string& what, int err) {
  if (err == ENOSPC || err == EDQUOT) {
    return ResourceExhaustedError("no space left for checkpoints in directory " + dir + " (" +
                                  what + ": " + std::strerror(err) + ")");
  }
  return ErrnoError(what, err);
}

/// Writes through `write_fn` (or ::write) to a file, accumulating the CRC of every byte.
class CrcWriter {
 public:
  CrcWriter(int fd, const CheckpointWriteFn& write_fn, std::string dir, std::string path)
      : fd_(fd), write_fn_(write_fn), dir_(std::move(dir)), path_(std::move(path)) {}
  Status Write(const void* p, size_t n) {
    // crc32_z(crc, NULL, 0) returns the initial value, so skip empty writes.
    if (n > 0) crc_ = crc32_z(crc_, static_cast<const Bytef*>(p), n);
    return WriteRaw(p, n);
  }
  Status WriteRaw(const void* p, size_t n) {
    const char* c = static_cast<const char*>(p);
    while (n > 0) {
      const ssize_t w = write_fn_ ? write_fn_(fd_, c, n) : ::write(fd_, c, n);
      const int err = errno;
      if (w < 0 && err == EINTR) continue;
      if (w < 0) return WriteError(dir_, "writing " + path_, err);
      if (w == 0) return InternalError("writing " + path_ + ": no progress");
      c += w;
      n -= static_cast<size_t>(w);
    }
    return OkStatus();
  }
  uLong crc() const { return crc_; }

 private:
  int fd_;
  const CheckpointWriteFn& write_fn_;
  std::string dir_;
  std::string path_;
  uLong crc_ = crc32_z(0L, Z_NULL, 0);
};

Status WriteAll(CrcWriter& w, const CheckpointData& data) {
  json header;
  header["meta"] = data.meta;
  json table = json::array();
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
  RETURN_IF_ERROR(w.Write(kMagic, sizeof(kMagic)));
  RETURN_IF_ERROR(w.Write(&len, sizeof(len)));
  RETURN_IF_ERROR(w.Write(text.data(), text.size()));
  for (const auto& b : data.buffers) RETURN_IF_ERROR(w.Write(b.data.data(), b.data.size()));
  const uint32_t crc = static_cast<uint32_t>(w.crc());
  RETURN_IF_ERROR(w.WriteRaw(&crc, sizeof(crc)));
  return w.WriteRaw(kTrailer, sizeof(kTrailer));
}

/// Opens `dir` for the *at() calls without following a symlink in its place, and checks that
/// what was opened is a directory. FAILED_PRECONDITION for a symlink or a non-directory.
StatusOr<UniqueFd> OpenDirectory(const std::string& dir) {
  UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  const int err = errno;
  if (fd.get() < 0 && (err == ELOOP || err == ENOTDIR)) {
    return FailedPreconditionError("checkpoint directory " + dir +
                                   " is a symbolic link or not a directory; not writing there");
  }
  if (fd.get() < 0) return ErrnoError("opening checkpoint directory " + dir, err);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return ErrnoError("stat of checkpoint directory " + dir, errno);
  if (!S_ISDIR(st.st_mode)) {
    return FailedPreconditionError("checkpoint directory " + dir + " is not a directory");
  }
  return StatusOr<UniqueFd>(std::move(fd));
}

/// Creates file `name` in the directory `dir_fd` (`dir`) for writing, never through a symlink:
/// O_EXCL refuses any entry already there, so a leftover (a crashed write's temporary file, or
/// a planted link) is removed (unlinkat removes a link itself, not its target) and the file
/// created afresh.
StatusOr<UniqueFd> CreateExclusive(int dir_fd, const std::string& dir, const std::string& name) {
  constexpr int kFlags = O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC;
  const std::string path = (fs::path(dir) / name).string();
  int fd = ::openat(dir_fd, name.c_str(), kFlags, 0644);
  if (fd < 0 && errno == EEXIST) {
    if (::unlinkat(dir_fd, name.c_str(), 0) != 0 && errno != ENOENT) {
      return ErrnoError("removing the stale " + path, errno);
    }
    fd = ::openat(dir_fd, name.c_str(), kFlags, 0644);
  }
  if (fd < 0) return WriteError(dir, "creating " + path, errno);
  return StatusOr<UniqueFd>(UniqueFd(fd));
}

/// Writes the checkpoint as `name`.tmp in the directory, flushes it and renames it to `name`;
/// on failure removes the temporary file.
Status WriteAndRename(int dir_fd, const std::string& dir, const std::string& name,
                      const CheckpointData& data, const CheckpointWriteFn& write_fn) {
  const std::string tmp = name + ".tmp";
  const std::string tmp_path = (fs::path(dir) / tmp).string();
  ASSIGN_OR_RETURN(UniqueFd fd, CreateExclusive(dir_fd, dir, tmp));
  CrcWriter writer(fd.get(), write_fn, dir, tmp_path);
  Status s = WriteAll(writer, data);
  if (s.ok() && ::fsync(fd.get()) != 0) s = WriteError(dir, "fsync of " + tmp_path, errno);
  if (fd.Close() != 0 && s.ok()) s = WriteError(dir, "closing " + tmp_path, errno);
  if (s.ok() && ::renameat(dir_fd, tmp.c_str(), dir_fd, name.c_str()) != 0) {
    s = WriteError(dir, "renaming " + tmp_path + " to " + name, errno);
  }
  if (!s.ok()) ::unlinkat(dir_fd, tmp.c_str(), 0);
  return s;
}

Status Corrupt(const std::string& path, const std::string& why) {
  return DataLossError("checkpoint " + path + " is corrupt: " + why);
}

/// Reads exactly `n` bytes at `offset`; DATA_LOSS if the file ends first.
Status ReadAt(int fd, const std::string& path, uint64_t offset, void* p, size_t n) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t r = ::pread(fd, c, n, static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return ErrnoError("reading checkpoint " + path, errno);
    if (r == 0)
      return Corrupt(path, "truncated while being read, at byte " + std::to_string(offset));
    c += r;
    n -= static_cast<size_t>(r);
    offset += static_cast<uint64_t>(r);
  }
  return OkStatus();
}

/// Reads a checkpoint front to back, accumulating the CRC of the bytes read.
class CrcReader {
 public:
  CrcReader(int fd, const std::string& path) : fd_(fd), path_(path) {}
  /// Reads the next `n` bytes into `p`.
  Status Next(void* p, size_t n) {
    RETURN_IF_ERROR(ReadAt(fd_, path_, pos_, p, n));
    if (n > 0) crc_ = crc32_z(crc_, static_cast<const Bytef*>(p), n);
    pos_ += n;
    return OkStatus();
  }
  uint64_t pos() const { return pos_; }
  uint32_t crc() const { return static_cast<uint32_t>(crc_); }

 private:
  int fd_;
  const std::string& path_;
  uint64_t pos_ = 0;
  uLong crc_ = crc32_z(0L, Z_NULL, 0);
};

/// Checks the end marker of a file of `size` bytes and returns the CRC stored before it.
StatusOr<uint32_t> ReadStoredCrc(int fd, const std::string& path, uint64_t size) {
  char suffix[kSuffixBytes];
  RETURN_IF_ERROR(ReadAt(fd, path, size - kSuffixBytes, suffix, sizeof(suffix)));
  if (std::memcmp(suffix + sizeof(uint32_t), kTrailer, sizeof(kTrailer)) != 0) {
    return Corrupt(path, "no end marker (truncated, or bytes follow it)");
  }
  uint32_t crc = 0;
  std::memcpy(&crc, suffix, sizeof(crc));
  return crc;
}

/// The deepest nesting of arrays and objects in JSON `text` (strings skipped).
int JsonDepth(const std::string& text) {
  int depth = 0;
  int deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;
      if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

/// Parses the header and checks its outline: an object with "meta" and a "buffers" array.
StatusOr<json> ParseHeader(const std::string& text, const std::string& path) {
  if (JsonDepth(text) > kMaxHeaderDepth) {
    return Corrupt(path, "header nests deeper than " + std::to_string(kMaxHeaderDepth) + " levels");
  }
  json header;
  try {
    header = json::parse(text);
  } catch (const json::exception& e) {
    return Corrupt(path, std::string("header is not valid JSON: ") + e.what());
  }
  if (!header.is_object() || !header.contains("meta")) return Corrupt(path, "header has no meta");
  const auto buffers = header.find("buffers");
  if (buffers == header.end() || !buffers->is_array()) {
    return Corrupt(path, "header has no buffer table");
  }
  return header;
}

/// Reads the magic, the header's length (checked against the limit and the `body` bytes that
/// precede the CRC) and the header.
StatusOr<json> ReadHeader(CrcReader& in, const std::string& path, uint64_t body) {
  char prefix[kPrefixBytes];
  RETURN_IF_ERROR(in.Next(prefix, sizeof(prefix)));
  if (std::memcmp(prefix, kMagic, sizeof(kMagic)) != 0) {
    return Corrupt(path, "bad magic (not a Hydra checkpoint)");
  }
  uint64_t len = 0;
  std::memcpy(&len, prefix + sizeof(kMagic), sizeof(len));
  if (len > kMaxCheckpointHeaderBytes) {
    return Corrupt(path, "header of " + std::to_string(len) + " bytes exceeds the limit of " +
                             std::to_string(kMaxCheckpointHeaderBytes));
  }
  if (len > body - kPrefixBytes) {
    return Corrupt(path, "header of " + std::to_string(len) + " bytes is larger than the file (" +
                             std::to_string(body + kSuffixBytes) + " bytes)");
  }
  std::string text(len, '\0');
  RETURN_IF_ERROR(in.Next(text.data(), text.size()));
  return ParseHeader(text, path);
}

/// One checked entry of the buffer table; `buffer.data` stays empty until it is read.
struct TableEntry {
  NamedBuffer buffer;
  uint64_t offset = 0;
  uint64_t bytes = 0;
};

/// Bytes per element of the dtypes executors write (tensor_buffers.cc: its own names, then
/// c10's for the others).
std::optional<uint64_t> DtypeBytes(const std::string& dtype) {
  static const std::map<std::string, uint64_t> kBytes = {
      {"float32", 4},  {"float64", 8}, {"float16", 2},        {"bfloat16", 2},
      {"int64", 8},    {"int32", 4},   {"Byte", 1},           {"Char", 1},
      {"Short", 2},    {"Bool", 1},    {"ComplexHalf", 4},    {"ComplexFloat", 8},
      {"QInt8", 1},    {"QUInt8", 1},  {"ComplexDouble", 16}, {"QInt32", 4},
      {"QUInt4x2", 1}, {"QUInt2x4", 1}};
  const auto it = kBytes.find(dtype);
  if (it == kBytes.end()) return std::nullopt;
  return it->second;
}

bool GetString(const json& t, const char* key, std::string* out) {
  const auto it = t.find(key);
  if (it == t.end() || !it->is_string()) return false;
  *out = it->get<std::string>();
  return true;
}

bool GetUint(const json& t, const char* key, uint64_t* out) {
  const auto it = t.find(key);
  if (it == t.end() || !it->is_number_unsigned()) return false;
  *out = it->get<uint64_t>();
  return true;
}

bool GetShape(const json& t, std::vector<int64_t>* shape) {
  const auto it = t.find("shape");
  if (it == t.end() || !it->is_array()) return false;
  for (const auto& d : *it) {
    if (!d.is_number_unsigned() || d.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
      return false;
    }
    shape->push_back(static_cast<int64_t>(d.get<uint64_t>()));
  }
  return true;
}

/// Why the entry's size disagrees with its dtype and shape, or "".
std::string SizeProblem(const TableEntry& e, const std::string& what) {
  const std::optional<uint64_t> element = DtypeBytes(e.buffer.dtype);
  if (!element) return what + " has unknown dtype '" + e.buffer.dtype + "'";
  const auto& shape = e.buffer.shape;
  uint64_t need = *element;
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) need = 0;
  for (size_t i = 0; i < shape.size() && need > 0; ++i) {
    if (__builtin_mul_overflow(need, static_cast<uint64_t>(shape[i]), &need)) {
      return what + " has a shape whose size overflows 64 bits";
    }
  }
  if (need == e.bytes) return "";
  return what + " holds " + std::to_string(e.bytes) + " bytes, but its dtype and shape need " +
         std::to_string(need);
}

/// Why buffer table entry `index` is malformed, or "" (and `*e` filled).
std::string ParseEntry(const json& t, size_t index, TableEntry* e) {
  const std::string entry = "buffer table entry " + std::to_string(index);
  if (!t.is_object()) return entry + " is not an object";
  if (!GetString(t, "name", &e->buffer.name)) return entry + " has no name";
  const std::string what = "buffer '" + e->buffer.name + "'";
  if (!GetString(t, "dtype", &e->buffer.dtype)) return what + " has no dtype";
  if (!GetUint(t, "offset", &e->offset)) return what + " has no offset (a non-negative integer)";
  if (!GetUint(t, "bytes", &e->bytes)) return what + " has no size (a non-negative integer)";
  if (!GetShape(t, &e->buffer.shape)) return what + " has no shape (non-negative integers)";
  return SizeProblem(*e, what);
}

StatusOr<std::vector<TableEntry>> ParseTable(const json& buffers, const std::string& path) {
  std::vector<TableEntry> table;
  std::set<std::string> names;
  for (size_t i = 0; i < buffers.size(); ++i) {
    TableEntry e;
    std::string problem = ParseEntry(buffers[i], i, &e);
    if (problem.empty() && !names.insert(e.buffer.name).second) {
      problem = "two buffers are named '" + e.buffer.name + "'";
    }
    if (!problem.empty()) return Corrupt(path, problem);
    table.push_back(std::move(e));
  }
  return table;
}

/// The entries' indices in file order, once checked that the buffers tile the `data_bytes`
/// between header and CRC exactly: each inside them, none overlapping another, no gap and
/// nothing after the last.
StatusOr<std::vector<size_t>> CheckLayout(const std::vector<TableEntry>& table, uint64_t data_bytes,
                                          const std::string& path) {
  for (const auto& e : table) {
    if (e.offset > data_bytes || e.bytes > data_bytes - e.offset) {
      return Corrupt(path, "buffer '" + e.buffer.name + "' (" + std::to_string(e.bytes) +
                               " bytes at offset " + std::to_string(e.offset) +
                               ") lies outside the file's " + std::to_string(data_bytes) +
                               " data bytes");
    }
  }
  std::vector<size_t> order(table.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return std::tie(table[a].offset, table[a].bytes) < std::tie(table[b].offset, table[b].bytes);
  });
  uint64_t end = 0;
  const TableEntry* previous = nullptr;
  for (size_t i : order) {
    const TableEntry& e = table[i];
    if (e.offset < end) {
      return Corrupt(
          path, "buffer '" + e.buffer.name + "' overlaps buffer '" + previous->buffer.name + "'");
    }
    if (e.offset > end) {
      return Corrupt(path, std::to_string(e.offset - end) + " bytes before buffer '" +
                               e.buffer.name + "' belong to no buffer");
    }
    end = e.offset + e.bytes;
    previous = &e;
  }
  if (end != data_bytes) {
    return Corrupt(path, std::to_string(data_bytes - end) +
                             " bytes of trailing garbage after the last buffer");
  }
  return order;
}

/// Reads the buffers in file order; each is allocated only now, at its checked size.
Status ReadBuffers(CrcReader& in, const std::vector<size_t>& order, std::vector<TableEntry>* table,
                   const std::string& path) {
  for (size_t i : order) {
    TableEntry& e = (*table)[i];
    try {
      e.buffer.data.resize(e.bytes);
    } catch (const std::bad_alloc&) {
      return ResourceExhaustedError("no memory for the " + std::to_string(e.bytes) +
                                    " bytes of buffer '" + e.buffer.name + "' of checkpoint " +
                                    path);
    }
    RETURN_IF_ERROR(in.Next(e.buffer.data.data(), e.buffer.data.size()));
  }
  return OkStatus();
}

}  // namespace

Status WriteCheckpointFile(const std::string& path, const CheckpointData& data,
                           const CheckpointWriteFn& write_fn) {
  const fs::path target(path);
  const std::string dir = target.parent_path().empty() ? "." : target.parent_path().string();
  const std::string name = target.filename().string();
  if (name.empty() || name == "." || name == "..") {
    return InvalidArgumentError("checkpoint path " + path + " names no file");
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    return WriteError(dir, "creating checkpoint directory " + dir, ec.value())
        .WithContext(kNotWritten);
  }
  auto dir_fd = OpenDirectory(dir);
  if (!dir_fd.ok()) return dir_fd.status().WithContext(kNotWritten);
  Status s = WriteAndRename(dir_fd->get(), dir, name, data, write_fn);
  if (!s.ok()) return s.WithContext(kNotWritten);
  if (::fsync(dir_fd->get()) != 0) return ErrnoError("fsync of checkpoint directory " + dir, errno);
  return OkStatus();
}

StatusOr<CheckpointData> ReadCheckpointFd(int fd, const std::string& path) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return ErrnoError("stat of checkpoint " + path, errno);
  if (!S_ISREG(st.st_mode)) return Corrupt(path, "not a regular file");
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < kPrefixBytes + kSuffixBytes) {
    return Corrupt(path, "truncated (" + std::to_string(size) + " bytes, fewer than the " +
                             std::to_string(kPrefixBytes + kSuffixBytes) + " of any checkpoint)");
  }
  ASSIGN_OR_RETURN(const uint32_t stored_crc, ReadStoredCrc(fd, path, size));
  CrcReader in(fd, path);
  ASSIGN_OR_RETURN(json header, ReadHeader(in, path, size - kSuffixBytes));
  const uint64_t data_bytes = size - kSuffixBytes - in.pos();
  ASSIGN_OR_RETURN(std::vector<TableEntry> table, ParseTable(header["buffers"], path));
  ASSIGN_OR_RETURN(const std::vector<size_t> order, CheckLayout(table, data_bytes, path));
  RETURN_IF_ERROR(ReadBuffers(in, order, &table, path));
  if (in.crc() != stored_crc) return Corrupt(path, "checksum mismatch");
  CheckpointData out;
  out.meta = std::move(header["meta"]);
  out.buffers.reserve(table.size());
  for (auto& e : table) out.buffers.push_back(std::move(e.buffer));
  return out;
}

StatusOr<CheckpointData> ReadCheckpointFile(const std::string& path) {
  // No symlink is followed and a FIFO does not block the open: neither is a checkpoint the
  // agent wrote (ReadCheckpointFd refuses anything but a regular file).
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (fd.get() < 0 && errno == ELOOP) return Corrupt(path, "a symbolic link, not a checkpoint");
  if (fd.get() < 0) return ErrnoError("opening checkpoint " + path, errno);
  return ReadCheckpointFd(fd.get(), path);
}

std::string CheckpointStore::PathFor(int64_t step) const {
  char name[64];
  std::snprintf(name, sizeof(name), "ckpt-%010lld.hck", static_cast<long long>(step));
  return (fs::path(dir_) / name).string();
}

StatusOr<std::vector<int64_t>> CheckpointStore::Steps() const {
  std::vector<int64_t> steps;
  std::error_code ec;
  auto listing_failed = [&] {
    return UnavailableError("cannot list the checkpoints in " + dir_ + ": " + ec.message());
  };
  fs::directory_iterator it(dir_, ec);
  if (ec == std::errc::no_such_file_or_directory) return steps;
  if (ec) return listing_failed();
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    if (ec) return listing_failed();
    const std::string name = it->path().filename().string();
    long long step = 0;
    char tail[8] = {0};
    if (std::sscanf(name.c_str(), "ckpt-%lld.%3s", &step, tail) == 2 &&
        std::string(tail) == "hck" && name.size() == 19) {
      steps.push_back(step);
    }
  }
  if (ec) return listing_failed();
  std::sort(steps.begin(), steps.end());
  return steps;
}

Status CheckpointStore::Save(int64_t step, const CheckpointData& data) {
  RETURN_IF_ERROR(WriteCheckpointFile(PathFor(step), data, write_fn_));
  // Checkpoints of later steps are leftovers that resuming skipped (corrupt, or of a run that
  // went further before this one resumed from an older file): they must not take the place of
  // an intact predecessor.
  auto steps = Steps();
  if (!steps.ok()) return OkStatus();  // written; the older files wait for the next Save
  std::vector<int64_t> kept;
  for (int64_t s : *steps) {
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
  ASSIGN_OR_RETURN(std::vector<int64_t> steps, Steps());
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    auto data = ReadCheckpointFile(PathFor(*it));
    if (data.ok()) return data;
    if (data.status().code() != StatusCode::kDataLoss &&
        data.status().code() != StatusCode::kNotFound) {  // gone since the listing: as corrupt
      // Not corrupt (too many open files, no memory, a stale handle): UNAVAILABLE, so that the
      // trial is interrupted and its resume tried again, not failed for good.
      return UnavailableError(data.status().message() +
                              "; the older checkpoints are not used instead");
    }
    if (warnings) {
      warnings->push_back(data.status().message() + "; falling back to an older checkpoint");
    }
  }
  return NotFoundError("no intact checkpoint in " + dir_);
}

}  // namespace hydra::executor
