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

std::string AllocatorLedgerCheck::Observe(const DeviceSpec& device, int64_t ledger_bytes,
                                          const DeviceAllocatorBytes& allocator) {
  const Reading now = allocator.allocated > ledger_bytes + SlackBytes(ledger_bytes)
                          ? Reading::kOverLedger
                          : Reading::kWithinLedger;
  auto [it, first] = last_.try_emplace(device.name, Reading::kWithinLedger);
  (void)first;
  const Reading before = it->second;
  it->second = now;
  if (now == before) return "";
  const std::string where = device.name + (device.uuid.empty() ? "" : " (" + device.uuid + ")");
  if (now == Reading::kWithinLedger) {
    return where + ": LibTorch's caching allocator is back within the trials' ledger (" +
           FormatBytes(allocator.allocated) + " in tensors, ledger " + FormatBytes(ledger_bytes) +
           ")";
  }
  return where + ": LibTorch's caching allocator holds " + FormatBytes(allocator.allocated) +
         " in tensors (" + FormatBytes(allocator.reserved) + " reserved) but the trials' ledger " +
         "accounts " + FormatBytes(ledger_bytes) +
         ": the cost model under-counts a trial here; the GPU's budget still caps this process, "
         "so trials may fail out of memory (please report it with the trials' shard plans)";
}

}  // namespace hydra::agent
