#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/status.h"

namespace hydra::executor {

/// The element types of the safetensors format (Hugging Face), by their header names.
enum class SafetensorsDtype { kF64, kF32, kF16, kBF16, kI64, kI32, kI16, kI8, kU8, kBool };
const char* SafetensorsDtypeName(SafetensorsDtype d);
size_t SafetensorsDtypeSize(SafetensorsDtype d);

/// One tensor of a safetensors file: where its bytes lie in the data section (after the
/// header), as [begin, end).
struct SafetensorsEntry {
  std::string name;
  SafetensorsDtype dtype = SafetensorsDtype::kF32;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;
  int64_t numel() const;
};

/// A parsed header: the tensors in the order of their data, and `__metadata__`.
struct SafetensorsHeader {
  uint64_t data_offset = 0;  ///< where the data section starts in the file: 8 + header length
  std::vector<SafetensorsEntry> tensors;
  std::map<std::string, std::string> metadata;
};

/// Largest header accepted (the reference implementation's limit).
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

/// Parses and checks a whole safetensors file held in `bytes` (or its first `size` bytes of
/// a file of `file_size` bytes: only the header is read): an 8-byte little-endian header
/// length, a JSON object of name -> {dtype, shape, data_offsets} and an optional
/// `__metadata__` of strings, then the data. Strict: unknown dtypes or keys, duplicate names,
/// negative or overflowing shapes, offsets whose span is not the shape's bytes, tensors that
/// overlap, leave bytes between them or stop short of the file's end are INVALID_ARGUMENT with
/// a message naming the tensor and the numbers; `what` (the path) starts every message.
StatusOr<SafetensorsHeader> ParseSafetensors(const char* bytes, size_t size, uint64_t file_size,
                                             const std::string& what);

/// A safetensors file mapped read-only: its header checked, its tensors' bytes read in place
/// (pages come from the file as they are touched, so a file larger than RAM can be streamed).
class SafetensorsFile {
 public:
  static StatusOr<SafetensorsFile> Open(const std::string& path);
  SafetensorsFile(SafetensorsFile&& other) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&&) = delete;
  SafetensorsFile(const SafetensorsFile&) = delete;
  ~SafetensorsFile();

  const SafetensorsHeader& header() const { return header_; }
  const std::string& path() const { return path_; }
  /// The tensor called `name`, or nullptr.
  const SafetensorsEntry* Find(const std::string& name) const;
  /// The first byte of `e`'s data (e.end - e.begin bytes).
  const char* Data(const SafetensorsEntry& e) const;
  /// Drops the pages that lie wholly inside `e`'s data from this process's memory (they are
  /// read from the file again if touched): a loader that has copied a tensor calls it, so the
  /// mapping of a checkpoint larger than memory never stays resident as a whole.
  void Release(const SafetensorsEntry& e) const;

 private:
  SafetensorsFile(std::string path, const char* map, size_t size, SafetensorsHeader header)
      : path_(std::move(path)), map_(map), size_(size), header_(std::move(header)) {}
  std::string path_;
  const char* map_;  // nullptr once moved from (or for an empty mapping)
  size_t size_;
  SafetensorsHeader header_;
};

/// A tensor to write: its bytes in the dtype's little-endian layout.
struct SafetensorsTensor {
  std::string name;
  SafetensorsDtype dtype = SafetensorsDtype::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t bytes = 0;
};

/// The bytes of a safetensors file holding `tensors` (in the given order) and `metadata`; the
/// header is padded with spaces to a multiple of 8 bytes, as the reference writer does.
/// INVALID_ARGUMENT when a tensor's bytes are not its shape's or a name repeats.
StatusOr<std::string> SerializeSafetensors(const std::vector<SafetensorsTensor>& tensors,
                                           const std::map<std::string, std::string>& metadata);

}  // namespace hydra::executor
