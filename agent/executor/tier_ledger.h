#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <string>

#include "common/status.h"

namespace hydra::executor {

enum class Tier { kDevice = 0, kHost = 1, kDisk = 2 };
const char* TierName(Tier t);

/// The executor's account of the bytes it holds in each tier, with the device budget enforced:
/// an acquisition that would exceed it fails instead of silently overcommitting. Thread-safe.
class TierLedger {
 public:
  /// `device_budget` <= 0: unlimited.
  explicit TierLedger(int64_t device_budget) : device_budget_(device_budget) {}

  /// Adds `bytes` to `tier`. RESOURCE_EXHAUSTED (nothing added) if the device tier would exceed
  /// its budget; `what` names the holder in the message.
  Status Acquire(Tier tier, int64_t bytes, const std::string& what);
  void Release(Tier tier, int64_t bytes);

  int64_t current(Tier t) const;
  int64_t peak(Tier t) const;
  /// The most `t` held since the last call (or since construction), and a new window begun at
  /// what it holds now: a task's high-water mark (SpillingExecutor's lookahead).
  int64_t TakeWindowPeak(Tier t);
  int64_t device_budget() const { return device_budget_; }

 private:
  const int64_t device_budget_;
  mutable std::mutex mu_;
  std::array<int64_t, 3> current_{};  // guarded by mu_
  std::array<int64_t, 3> peak_{};     // guarded by mu_
  std::array<int64_t, 3> window_{};   // guarded by mu_: TakeWindowPeak's
};

}  // namespace hydra::executor
