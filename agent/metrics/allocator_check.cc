#include "agent/metrics/allocator_check.h"

#include <algorithm>

#include "common/units.h"

namespace hydra::agent {

int64_t AllocatorLedgerCheck::SlackBytes(int64_t ledger_bytes) {
  // cuBLAS keeps a workspace (32 MiB on Hopper) per handle and stream, in the caching
  // allocator, never freed; trials compute on streams from LibTorch's pool of 32 per GPU.
  constexpr int64_t kFixedSlack = int64_t{1} << 30;
  return kFixedSlack + std::max<int64_t>(0, ledger_bytes) / 20;  // + 5%
}

AllocatorLedgerCheck::Reading AllocatorLedgerCheck::Classify(
    int64_t ledger_bytes, const DeviceAllocatorBytes& allocator) {
  const int64_t limit = ledger_bytes + SlackBytes(ledger_bytes);
  if (allocator.allocated > limit) return Reading::kTensorsOverLedger;
  if (allocator.reserved > limit) return Reading::kCacheOverLedger;
  return Reading::kWithinLedger;
}

std::string AllocatorLedgerCheck::Observe(const DeviceSpec& device, int64_t ledger_bytes,
                                          const DeviceAllocatorBytes& allocator) {
  const Reading now = Classify(ledger_bytes, allocator);
  auto [it, first] = last_.try_emplace(device.name, Reading::kWithinLedger);
  (void)first;
  const Reading before = it->second;
  it->second = now;
  if (now == before) return "";
  const std::string where = device.name + (device.uuid.empty() ? "" : " (" + device.uuid + ")");
  const std::string held = FormatBytes(allocator.allocated) + " in tensors, " +
                           FormatBytes(allocator.reserved) + " reserved";
  switch (now) {
    case Reading::kWithinLedger:
      return where + ": LibTorch's caching allocator is back within the trials' ledger (" + held +
             ", ledger " + FormatBytes(ledger_bytes) + ")";
    case Reading::kTensorsOverLedger:
      return where + ": LibTorch's caching allocator holds " + held +
             " but the trials' ledger accounts " + FormatBytes(ledger_bytes) +
             ": the cost model under-counts a trial here; the GPU's budget still caps this "
             "process, so trials may fail out of memory (please report it with the trials' "
             "shard plans)";
    case Reading::kCacheOverLedger:
      return where + ": LibTorch's caching allocator reserves more than the trials' ledger (" +
             held + ", ledger " + FormatBytes(ledger_bytes) +
             "): free blocks it keeps cached, from finished trials or fragmentation; this "
             "process reuses them, but other processes on the GPU cannot (the controller counts "
             "them as free through hydra_gpu_allocator_reserved_bytes)";
  }
  return "";
}

}  // namespace hydra::agent
