// Fuzz target: the check of a spill file's trailer block (agent/executor/disk_tier.h), fed any
// bytes as a whole spill file: its data, then the last kSpillAlignment bytes as the trailer.

#include <xxhash.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "agent/executor/disk_tier.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using hydra::executor::kSpillAlignment;
  using hydra::fuzz::Require;
  // Shorter inputs are all trailer (and must be refused as such).
  const size_t data_bytes = size >= kSpillAlignment ? size - kSpillAlignment : 0;
  const uint64_t digest = XXH3_64bits(data, data_bytes);
  const hydra::executor::ConstBytes block{data + data_bytes, size - data_bytes};
  const hydra::Status s = hydra::executor::CheckSpillTrailer(block, digest, data_bytes, "fuzz");
  if (!s.ok()) {
    Require(s.code() == hydra::StatusCode::kDataLoss,
            "a bad trailer is DATA_LOSS: " + s.ToString());
    return 0;
  }
  // Accepted: the block is whole and records this data's hash and length.
  Require(block.size == kSpillAlignment, "an accepted trailer is one block");
  uint64_t words[3];
  std::memcpy(words, block.data, sizeof(words));
  Require(words[0] == digest && words[2] == data_bytes, "an accepted trailer matches the data");
  return 0;
}
