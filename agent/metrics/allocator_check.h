#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "common/devices.h"

namespace hydra::agent {

/// Checks, per GPU, the executors' ledger (the accounted device peaks of the trials the GPU
/// holds) against what LibTorch's caching allocator really holds there: its allocated bytes
/// (in tensors) and its reserved bytes (taken from CUDA: tensors plus cached free blocks). The
/// ledger is what admission and the controller's placement trust; tensors above it mean the
/// cost model under-counts some trial (CapGpuMemory still keeps the process within the GPU's
/// budget, so the symptom would otherwise be an out-of-memory error with no hint); only the
/// cache above it means blocks kept from finished trials, or fragmentation (the segments are
/// expandable, which should keep it small), that other processes on the GPU cannot use.
class AllocatorLedgerCheck {
 public:
  /// What the allocator may hold beyond the ledger without a warning: CUDA libraries'
  /// workspaces (cuBLAS keeps one per stream) and rounding to the allocator's blocks.
  static int64_t SlackBytes(int64_t ledger_bytes);

  /// Records `device`'s latest reading. Returns a line to log when the reading changes: the
  /// tensors over the ledger, only the reserved bytes over it, or back within it (naming the
  /// amounts); "" otherwise, so a lasting excess is said once, not every second.
  std::string Observe(const DeviceSpec& device, int64_t ledger_bytes,
                      const DeviceAllocatorBytes& allocator);

 private:
  enum class Reading { kWithinLedger, kCacheOverLedger, kTensorsOverLedger };
  static Reading Classify(int64_t ledger_bytes, const DeviceAllocatorBytes& allocator);
  std::map<std::string, Reading> last_;  // by device name
};

}  // namespace hydra::agent
