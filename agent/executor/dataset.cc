#include "agent/executor/dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

namespace hydra::executor {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

StatusOr<std::shared_ptr<const TokenDataset>> TokenDataset::Open(const DatasetSpec& spec,
                                                                 int64_t window) {
  const std::string& path = spec.resolved_path;
  const std::string where = "spec.dataset.path: " + path;
  // Refused before opening: opening a FIFO or a device can block or have effects. O_NONBLOCK
  // keeps a file swapped in after the check from blocking; fstat checks what was opened.
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return ErrnoError(where, errno);
  if (!S_ISREG(st.st_mode)) return InvalidArgumentError(where + ": not a regular file");
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return ErrnoError(where, errno);
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    return ErrnoError(where, e);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return InvalidArgumentError(where + ": not a regular file");
  }
  auto ds = std::shared_ptr<TokenDataset>(new TokenDataset());
  ds->path_ = path;
  ds->bytes_per_token_ = spec.format == DatasetFormat::kTokensU16   ? 2
                         : spec.format == DatasetFormat::kTokensU32 ? 4
                                                                    : 1;
  if (st.st_size == 0) {
    ::close(fd);
    return InvalidArgumentError(where + ": file is empty");
  }
  if (st.st_size % ds->bytes_per_token_ != 0) {
    ::close(fd);
    return InvalidArgumentError(where + ": size " + std::to_string(st.st_size) +
                                " is not a multiple of " + std::to_string(ds->bytes_per_token_) +
                                " bytes, so it is not a " + NameOf(spec.format) + " file");
  }
  void* p = ::mmap(nullptr, st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
  int e = errno;
  ::close(fd);
  if (p == MAP_FAILED) return ErrnoError(where + ": mmap", e);
  ds->data_ = static_cast<const uint8_t*>(p);
  ds->mapped_bytes_ = st.st_size;
  ds->num_tokens_ = st.st_size / ds->bytes_per_token_;
  if (spec.format == DatasetFormat::kImagesU8) {
    ds->record_bytes_ = window;
    if (st.st_size % window != 0) {
      return InvalidArgumentError(where + ": size " + std::to_string(st.st_size) +
                                  " is not a whole number of " + std::to_string(window) +
                                  "-byte records (1 label byte + imageShape pixels), so it is " +
                                  "not an images-u8 file of this imageShape");
    }
    const int64_t records = st.st_size / window;
    const auto train =
        static_cast<int64_t>(static_cast<double>(records) * (1.0 - spec.validation_fraction));
    if (train < 1 || records - train < 1) {
      return InvalidArgumentError(where + ": " + std::to_string(records) + " images split into " +
                                  std::to_string(train) + " training and " +
                                  std::to_string(records - train) +
                                  " validation images; each split needs at least one");
    }
    ds->train_tokens_ = train * window;
    uint8_t mx = 0;
    for (int64_t r = 0; r < records; ++r) mx = std::max(mx, ds->data_[r * window]);
    ds->max_token_ = mx;
    return std::shared_ptr<const TokenDataset>(std::move(ds));
  }
  ds->train_tokens_ =
      static_cast<int64_t>(static_cast<double>(ds->num_tokens_) * (1.0 - spec.validation_fraction));
  if (ds->train_tokens_ <= window || ds->validation_tokens() < window) {
    return InvalidArgumentError(
        where + ": " + std::to_string(ds->num_tokens_) + " tokens split into " +
        std::to_string(ds->train_tokens_) + " training and " +
        std::to_string(ds->validation_tokens()) +
        " validation tokens, but each split needs at least contextLength + 1 = " +
        std::to_string(window) + " tokens");
  }
  if (ds->bytes_per_token_ == 1) {
    ds->max_token_ = *std::max_element(ds->data_, ds->data_ + ds->mapped_bytes_);
  } else {
    int64_t mx = 0;
    for (int64_t i = 0; i < ds->num_tokens_; ++i) mx = std::max(mx, ds->TokenAt(i));
    ds->max_token_ = mx;
  }
  return std::shared_ptr<const TokenDataset>(std::move(ds));
}

TokenDataset::~TokenDataset() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), mapped_bytes_);
}

int64_t TokenDataset::TokenAt(int64_t i) const {
  const uint8_t* p = data_ + i * bytes_per_token_;
  int64_t token = 0;
  for (int b = bytes_per_token_ - 1; b >= 0; --b) token = (token << 8) | p[b];  // little-endian
  return token;
}

void TokenDataset::Read(int64_t offset, int64_t count, int64_t* out) const {
  if (bytes_per_token_ == 1) {
    for (int64_t i = 0; i < count; ++i) out[i] = data_[offset + i];
  } else {
    for (int64_t i = 0; i < count; ++i) out[i] = TokenAt(offset + i);
  }
}

std::vector<int64_t> TrainWindowOffsets(const TokenDataset& data, int64_t seed, int64_t step,
                                        int64_t batch, int64_t window) {
  const int64_t record = data.record_bytes();
  const uint64_t range = record > 0 ? static_cast<uint64_t>(data.train_tokens() / record)
                                    : static_cast<uint64_t>(data.train_tokens() - window + 1);
  const uint64_t base =
      SplitMix64(SplitMix64(static_cast<uint64_t>(seed)) ^ static_cast<uint64_t>(step));
  std::vector<int64_t> offsets(batch);
  for (int64_t i = 0; i < batch; ++i) {
    offsets[i] = static_cast<int64_t>(SplitMix64(base ^ static_cast<uint64_t>(i)) % range);
    if (record > 0) offsets[i] *= record;  // whole records
  }
  return offsets;
}

std::vector<int64_t> ValidationWindowOffsets(const TokenDataset& data, int64_t count,
                                             int64_t window) {
  const int64_t begin = data.train_tokens();
  if (const int64_t record = data.record_bytes(); record > 0) {
    // Whole records spread evenly over the validation images.
    const int64_t images = data.validation_tokens() / record;
    const int64_t n = std::min<int64_t>(count, images);
    std::vector<int64_t> offsets(n);
    for (int64_t i = 0; i < n; ++i) offsets[i] = begin + record * (images * i / n);
    return offsets;
  }
  const int64_t span = data.validation_tokens() - window;  // last valid start - begin
  const int64_t n = std::min<int64_t>(count, span + 1);
  std::vector<int64_t> offsets(n);
  for (int64_t i = 0; i < n; ++i) offsets[i] = begin + (n == 1 ? 0 : span * i / (n - 1));
  return offsets;
}

}  // namespace hydra::executor
