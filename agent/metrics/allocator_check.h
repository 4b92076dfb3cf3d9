#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "common/devices.h"

namespace hydra::agent {

/// Checks, per GPU, the executors' ledger (the accounted device peaks of the trials the GPU
/// holds) against what LibTorch's caching allocator really holds in tensors there. The ledger
/// is what admission and the controller's placement trust; an allocator above it means the
/// cost model under-counts some trial (CapGpuMemory still keeps the process within the GPU's
/// budget, so the symptom would otherwise be an out-of-memory error with no hint).
class AllocatorLedgerCheck {
 public:
  /// What the allocator may hold beyond the ledger without a warning: CUDA libraries'
  /// workspaces (cuBLAS keeps one per stream) and rounding to the allocator's blocks.
  static int64_t SlackBytes(int64_t ledger_bytes);

  /// Records `device`'s latest reading. Returns a line to log when the device goes over its
  /// ledger (naming both amounts) and when it is back within it; "" otherwise, so a lasting
  /// excess is said once, not every second.
  std::string Observe(const DeviceSpec& device, int64_t ledger_bytes,
                      const DeviceAllocatorBytes& allocator);

 private:
  enum class Reading { kWithinLedger, kOverLedger };
  std::map<std::string, Reading> last_;  // by device name
};

}  // namespace hydra::agent
