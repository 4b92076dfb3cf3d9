#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/job.h"
#include "common/status.h"

namespace hydra::executor {

/// A read-only token stream memory-mapped from a dataset file, split into a training head and
/// a validation tail. Formats: "text" (each byte is a token, vocabulary 256), "tokens-u16"
/// (little-endian uint16 tokens, as GPT-2 BPE corpora are commonly stored) and "tokens-u32"
/// (little-endian uint32 tokens, for vocabularies past 65,536).
/// Thread-safe: all methods are const and the mapping is immutable.
class TokenDataset {
 public:
  /// Maps `spec.resolved_path`. Fails with NOT_FOUND for a missing file and INVALID_ARGUMENT
  /// for an empty file, a tokens-u16 / -u32 file whose size is not a whole number of tokens,
  /// or a split too small for `window`
  /// tokens (contextLength + 1) on either side. For images-u8, `window` is the record size
  /// (SampleWindow): the file must hold whole records and each split at least one.
  static StatusOr<std::shared_ptr<const TokenDataset>> Open(const DatasetSpec& spec,
                                                            int64_t window);
  ~TokenDataset();
  TokenDataset(const TokenDataset&) = delete;
  TokenDataset& operator=(const TokenDataset&) = delete;

  int64_t num_tokens() const { return num_tokens_; }
  /// Tokens [0, train_tokens()) train; [train_tokens(), num_tokens()) validate.
  int64_t train_tokens() const { return train_tokens_; }
  int64_t validation_tokens() const { return num_tokens_ - train_tokens_; }
  /// Largest token id in the file (scanned once at Open); images-u8: the largest label.
  int64_t max_token() const { return max_token_; }
  /// images-u8: bytes of one record (label + pixels); windows start on record boundaries and
  /// the split falls between records. 0 for token streams.
  int64_t record_bytes() const { return record_bytes_; }
  const std::string& path() const { return path_; }

  /// Copies tokens [offset, offset + count) as int64 into `out`. Caller keeps bounds.
  void Read(int64_t offset, int64_t count, int64_t* out) const;

 private:
  TokenDataset() = default;
  int64_t TokenAt(int64_t i) const;  ///< token i of a tokens-u16 / -u32 file
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t mapped_bytes_ = 0;
  int bytes_per_token_ = 1;
  int64_t num_tokens_ = 0;
  int64_t train_tokens_ = 0;
  int64_t max_token_ = 0;
  int64_t record_bytes_ = 0;
};

/// Start offsets of the `batch` training windows of `window` tokens for optimizer step `step`.
/// A pure function of (seed, step): a resumed trial sees exactly the batches it would have.
std::vector<int64_t> TrainWindowOffsets(const TokenDataset& data, int64_t seed, int64_t step,
                                        int64_t batch, int64_t window);

/// Start offsets of `count` validation windows spread evenly over the validation split; the
/// same for every trial with the same window, so validation losses are comparable.
std::vector<int64_t> ValidationWindowOffsets(const TokenDataset& data, int64_t count,
                                             int64_t window);

/// SplitMix64 finaliser (Steele et al.); the sampling hash, mirrored by bench/*.py.
uint64_t SplitMix64(uint64_t x);

}  // namespace hydra::executor
