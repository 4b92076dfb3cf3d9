#include "agent/executor/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>
#include <utility>

#include "common/file_util.h"

namespace hydra::executor {
namespace {

using Json = nlohmann::json;

constexpr SafetensorsDtype kDtypes[] = {
    SafetensorsDtype::kF64, SafetensorsDtype::kF32, SafetensorsDtype::kF16, SafetensorsDtype::kBF16,
    SafetensorsDtype::kI64, SafetensorsDtype::kI32, SafetensorsDtype::kI16, SafetensorsDtype::kI8,
    SafetensorsDtype::kU8,  SafetensorsDtype::kBool};

/// Largest element count accepted: 2^50 (petabytes of data; keeps every product in range).
constexpr int64_t kMaxElements = int64_t{1} << 50;

std::string Num(uint64_t v) { return std::to_string(v); }

/// The header's JSON, with names repeated at the top level refused (nlohmann keeps the last).
StatusOr<Json> ParseHeaderJson(const char* text, size_t size, const std::string& what) {
  std::set<std::string> seen;
  std::string repeated;
  auto callback = [&](int depth, Json::parse_event_t event, Json& parsed) {
    if (depth == 1 && event == Json::parse_event_t::key && repeated.empty() &&
        !seen.insert(parsed.get<std::string>()).second) {
      repeated = parsed.get<std::string>();
    }
    return true;
  };
  try {
    Json j = Json::parse(text, text + size, callback);
    if (!repeated.empty()) {
      return InvalidArgumentError(what + ": the header names tensor '" + repeated + "' twice");
    }
    return j;
  } catch (const Json::exception& e) {
    return InvalidArgumentError(what + ": the header is not valid JSON: " + e.what());
  }
}

StatusOr<SafetensorsDtype> DtypeOf(const Json& v, const std::string& where) {
  if (v.is_string()) {
    for (SafetensorsDtype d : kDtypes) {
      if (v.get<std::string>() == SafetensorsDtypeName(d)) return d;
    }
  }
  return InvalidArgumentError(where + ": dtype " + v.dump() +
                              " is not one of F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL");
}

/// One tensor's entry: exactly dtype, shape and data_offsets, consistent with each other and
/// within the data section of `data_bytes`.
StatusOr<SafetensorsEntry> ParseEntry(const std::string& name, const Json& v, uint64_t data_bytes,
                                      const std::string& what) {
  const std::string where = what + ": tensor '" + name + "'";
  if (!v.is_object()) return InvalidArgumentError(where + " is not an object");
  for (const auto& [key, value] : v.items()) {
    if (key != "dtype" && key != "shape" && key != "data_offsets") {
      return InvalidArgumentError(where + " has an unknown field '" + key + "'");
    }
  }
  if (!v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets")) {
    return InvalidArgumentError(where + " needs dtype, shape and data_offsets");
  }
  SafetensorsEntry e;
  e.name = name;
  ASSIGN_OR_RETURN(e.dtype, DtypeOf(v["dtype"], where));
  const Json& shape = v["shape"];
  if (!shape.is_array()) return InvalidArgumentError(where + ": shape is not an array");
  int64_t numel = 1;
  for (const Json& d : shape) {
    if (!d.is_number_unsigned() || d.get<uint64_t>() > static_cast<uint64_t>(kMaxElements)) {
      return InvalidArgumentError(where + ": shape " + shape.dump() +
                                  " holds a dimension that is not a count of at most 2^50");
    }
    const auto dim = static_cast<int64_t>(d.get<uint64_t>());
    if (dim != 0 && numel > kMaxElements / dim) {
      return InvalidArgumentError(where + ": shape " + shape.dump() + " has over 2^50 elements");
    }
    numel *= dim;
    e.shape.push_back(dim);
  }
  const Json& offsets = v["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
      !offsets[1].is_number_unsigned()) {
    return InvalidArgumentError(where + ": data_offsets " + offsets.dump() +
                                " is not [begin, end] in bytes");
  }
  e.begin = offsets[0].get<uint64_t>();
  e.end = offsets[1].get<uint64_t>();
  if (e.begin > e.end || e.end > data_bytes) {
    return InvalidArgumentError(where + ": data_offsets [" + Num(e.begin) + ", " + Num(e.end) +
                                "] do not lie in the " + Num(data_bytes) +
                                " bytes of data after the header");
  }
  const uint64_t want = static_cast<uint64_t>(numel) * SafetensorsDtypeSize(e.dtype);
  if (e.end - e.begin != want) {
    return InvalidArgumentError(where + ": data_offsets span " + Num(e.end - e.begin) +
                                " bytes, but shape " + shape.dump() + " of " +
                                SafetensorsDtypeName(e.dtype) + " is " + Num(want) + " bytes");
  }
  return e;
}

/// The tensors must tile the data section: no overlap, no gap, nothing after the last.
Status CheckTiling(std::vector<SafetensorsEntry>* tensors, uint64_t data_bytes,
                   const std::string& what) {
  std::sort(tensors->begin(), tensors->end(), [](const auto& a, const auto& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  uint64_t at = 0;
  const SafetensorsEntry* previous = nullptr;
  for (const auto& t : *tensors) {
    if (t.begin < at) {
      return InvalidArgumentError(what + ": tensor '" + t.name + "' (bytes " + Num(t.begin) + ".." +
                                  Num(t.end) + ") overlaps tensor '" + previous->name +
                                  "' (bytes " + Num(previous->begin) + ".." + Num(previous->end) +
                                  ")");
    }
    if (t.begin > at) {
      return InvalidArgumentError(what + ": data bytes " + Num(at) + ".." + Num(t.begin) +
                                  " belong to no tensor");
    }
    at = t.end;
    previous = &t;
  }
  if (at != data_bytes) {
    return InvalidArgumentError(what + ": data bytes " + Num(at) + ".." + Num(data_bytes) +
                                " after the last tensor belong to no tensor");
  }
  return OkStatus();
}

}  // namespace

const char* SafetensorsDtypeName(SafetensorsDtype d) {
  switch (d) {
    case SafetensorsDtype::kF64: return "F64";
    case SafetensorsDtype::kF32: return "F32";
    case SafetensorsDtype::kF16: return "F16";
    case SafetensorsDtype::kBF16: return "BF16";
    case SafetensorsDtype::kI64: return "I64";
    case SafetensorsDtype::kI32: return "I32";
    case SafetensorsDtype::kI16: return "I16";
    case SafetensorsDtype::kI8: return "I8";
    case SafetensorsDtype::kU8: return "U8";
    case SafetensorsDtype::kBool: return "BOOL";
  }
  return "?";
}

size_t SafetensorsDtypeSize(SafetensorsDtype d) {
  switch (d) {
    case SafetensorsDtype::kF64:
    case SafetensorsDtype::kI64: return 8;
    case SafetensorsDtype::kF32:
    case SafetensorsDtype::kI32: return 4;
    case SafetensorsDtype::kF16:
    case SafetensorsDtype::kBF16:
    case SafetensorsDtype::kI16: return 2;
    case SafetensorsDtype::kI8:
    case SafetensorsDtype::kU8:
    case SafetensorsDtype::kBool: return 1;
  }
  return 1;
}

int64_t SafetensorsEntry::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

StatusOr<SafetensorsHeader> ParseSafetensors(const char* bytes, size_t size, uint64_t file_size,
                                             const std::string& what) {
  if (size < 8 || file_size < 8) {
    return InvalidArgumentError(what + ": " + Num(file_size) +
                                " bytes, too short for the 8-byte header length");
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  if (n > kMaxSafetensorsHeaderBytes) {
    return InvalidArgumentError(what + ": the header length " + Num(n) + " is over the limit of " +
                                Num(kMaxSafetensorsHeaderBytes) + " bytes");
  }
  if (n > file_size - 8 || n > size - 8) {
    return InvalidArgumentError(what + ": the header length " + Num(n) +
                                " runs past the end of the file (" + Num(file_size) + " bytes)");
  }
  if (n == 0 || bytes[8] != '{') {
    return InvalidArgumentError(what + ": the header does not start with '{'");
  }
  ASSIGN_OR_RETURN(Json j, ParseHeaderJson(bytes + 8, n, what));
  if (!j.is_object()) return InvalidArgumentError(what + ": the header is not a JSON object");
  SafetensorsHeader h;
  h.data_offset = 8 + n;
  const uint64_t data_bytes = file_size - h.data_offset;
  for (const auto& [name, value] : j.items()) {
    if (name == "__metadata__") {
      if (!value.is_object()) {
        return InvalidArgumentError(what + ": __metadata__ is not an object of strings");
      }
      for (const auto& [k, v] : value.items()) {
        if (!v.is_string()) {
          return InvalidArgumentError(what + ": __metadata__ '" + k + "' is not a string");
        }
        h.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    ASSIGN_OR_RETURN(auto entry, ParseEntry(name, value, data_bytes, what));
    h.tensors.push_back(std::move(entry));
  }
  RETURN_IF_ERROR(CheckTiling(&h.tensors, data_bytes, what));
  return h;
}

StatusOr<SafetensorsFile> SafetensorsFile::Open(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) {
    const int err = errno;
    const std::string why = path + ": cannot open: " + std::strerror(err);
    return err == ENOENT ? NotFoundError(why) : FailedPreconditionError(why);
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return FailedPreconditionError(path + ": not a regular file");
  }
  const auto size = static_cast<size_t>(st.st_size);
  if (size < 8) return ParseSafetensors("", 0, size, path).status();
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd.get(), 0);
  if (map == MAP_FAILED) {
    return FailedPreconditionError(path + ": cannot map: " + std::strerror(errno));
  }
  const char* bytes = static_cast<const char*>(map);
  auto header = ParseSafetensors(bytes, size, size, path);
  if (!header.ok()) {
    ::munmap(map, size);
    return header.status();
  }
  return SafetensorsFile(path, bytes, size, std::move(header).value());
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& other) noexcept
    : path_(std::move(other.path_)),
      map_(std::exchange(other.map_, nullptr)),
      size_(other.size_),
      header_(std::move(other.header_)) {}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(const_cast<char*>(map_), size_);
}

const SafetensorsEntry* SafetensorsFile::Find(const std::string& name) const {
  for (const auto& t : header_.tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

const char* SafetensorsFile::Data(const SafetensorsEntry& e) const {
  return map_ + header_.data_offset + e.begin;
}

void SafetensorsFile::Release(const SafetensorsEntry& e) const {
  if (map_ == nullptr) return;
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<uintptr_t>(Data(e));
  const uintptr_t first = (begin + page - 1) / page * page;
  const uintptr_t last = (begin + (e.end - e.begin)) / page * page;
  // A private read-only file mapping: the dropped pages come back from the file on access.
  if (last > first) ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

StatusOr<std::string> SerializeSafetensors(const std::vector<SafetensorsTensor>& tensors,
                                           const std::map<std::string, std::string>& metadata) {
  Json header = Json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t at = 0;
  for (const auto& t : tensors) {
    uint64_t numel = 1;
    for (int64_t d : t.shape) numel *= static_cast<uint64_t>(d);
    if (numel * SafetensorsDtypeSize(t.dtype) != t.bytes) {
      return InvalidArgumentError("tensor '" + t.name + "': " + Num(t.bytes) +
                                  " bytes do not make its shape");
    }
    if (t.name == "__metadata__" || header.contains(t.name)) {
      return InvalidArgumentError("tensor name '" + t.name + "' is repeated or reserved");
    }
    header[t.name] = {{"dtype", SafetensorsDtypeName(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {at, at + t.bytes}}};
    at += t.bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  const uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  out += text;
  out.reserve(out.size() + at);
  for (const auto& t : tensors) {
    if (t.bytes > 0) out.append(static_cast<const char*>(t.data), t.bytes);
  }
  return out;
}

}  // namespace hydra::executor
