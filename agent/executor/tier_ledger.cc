#include "agent/executor/tier_ledger.h"

#include <algorithm>
#include <utility>

#include "common/units.h"

namespace hydra::executor {

const char* TierName(Tier t) {
  switch (t) {
    case Tier::kDevice: return "device";
    case Tier::kHost: return "host";
    case Tier::kDisk: return "disk";
  }
  return "?";
}

Status TierLedger::Acquire(Tier tier, int64_t bytes, const std::string& what) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto i = static_cast<size_t>(tier);
  if (tier == Tier::kDevice && device_budget_ > 0 && current_[i] + bytes > device_budget_) {
    return ResourceExhaustedError("device budget of " + FormatBytes(device_budget_) +
                                  " exceeded: " + what + " needs " + FormatBytes(bytes) + " with " +
                                  FormatBytes(current_[i]) + " already held");
  }
  current_[i] += bytes;
  peak_[i] = std::max(peak_[i], current_[i]);
  window_[i] = std::max(window_[i], current_[i]);
  return OkStatus();
}

void TierLedger::Release(Tier tier, int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  current_[static_cast<size_t>(tier)] -= bytes;
}

int64_t TierLedger::current(Tier t) const {
  std::lock_guard<std::mutex> lock(mu_);
  return current_[static_cast<size_t>(t)];
}

int64_t TierLedger::peak(Tier t) const {
  std::lock_guard<std::mutex> lock(mu_);
  return peak_[static_cast<size_t>(t)];
}

int64_t TierLedger::TakeWindowPeak(Tier t) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto i = static_cast<size_t>(t);
  return std::exchange(window_[i], current_[i]);
}

}  // namespace hydra::executor
