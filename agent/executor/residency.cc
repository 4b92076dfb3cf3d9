#include "agent/executor/residency.h"

#include <utility>

namespace hydra::executor {
namespace {

bool IsEdge(Residency from, Residency to) {
  using R = Residency;
  switch (from) {
    case R::kOnDisk: return to == R::kReading;
    case R::kReading: return to == R::kOnDevice;
    case R::kInHost: return to == R::kOnDevice || to == R::kOnDisk;
    case R::kOnDevice: return to == R::kInHost || to == R::kWritingBack || to == R::kOnDisk;
    case R::kWritingBack: return to == R::kOnDisk;
  }
  return false;
}

constexpr Tier kHeldTiers[] = {Tier::kDevice, Tier::kHost};

}  // namespace

const char* ResidencyName(Residency r) {
  switch (r) {
    case Residency::kOnDisk: return "on disk";
    case Residency::kReading: return "reading";
    case Residency::kInHost: return "in host";
    case Residency::kOnDevice: return "on device";
    case Residency::kWritingBack: return "writing back";
  }
  return "unknown";
}

PartResidency::PartResidency(TierLedger* ledger, std::string what, int64_t bytes, Tier rests_in)
    : ledger_(ledger), what_(std::move(what)), bytes_(bytes), rests_in_(rests_in) {
  // The host tier is unbounded: this cannot fail.
  (void)ledger_->Acquire(Tier::kHost, bytes_, what_);
}

PartResidency::PartResidency(PartResidency&& other) noexcept
    : ledger_(std::exchange(other.ledger_, nullptr)),
      what_(std::move(other.what_)),
      bytes_(other.bytes_),
      rests_in_(other.rests_in_),
      where_(other.where_) {}

PartResidency::~PartResidency() {
  if (!ledger_) return;
  for (Tier t : kHeldTiers) {
    if (Holds(where_, t)) ledger_->Release(t, bytes_);
  }
}

bool PartResidency::Holds(Residency r, Tier t) const {
  if (t == Tier::kHost) return rests_in_ == Tier::kHost || r == Residency::kInHost;
  return r == Residency::kReading || r == Residency::kOnDevice || r == Residency::kWritingBack;
}

Status PartResidency::To(Residency next) {
  if (next == where_) return OkStatus();
  const bool on_disk_state =
      next == Residency::kOnDisk || next == Residency::kReading || next == Residency::kWritingBack;
  if (!IsEdge(where_, next) || (rests_in_ == Tier::kHost && on_disk_state)) {
    return InternalError(what_ + ": no move from " + ResidencyName(where_) + " to " +
                         ResidencyName(next) +
                         (rests_in_ == Tier::kHost ? " for state kept in the host tier" : ""));
  }
  for (Tier t : kHeldTiers) {
    if (Holds(next, t) && !Holds(where_, t)) {
      Status s = ledger_->Acquire(t, bytes_, what_);
      if (!s.ok()) {
        // Undo what this move already acquired.
        for (Tier u : kHeldTiers) {
          if (u == t) break;
          if (Holds(next, u) && !Holds(where_, u)) ledger_->Release(u, bytes_);
        }
        return s;
      }
    }
  }
  for (Tier t : kHeldTiers) {
    if (Holds(where_, t) && !Holds(next, t)) ledger_->Release(t, bytes_);
  }
  where_ = next;
  return OkStatus();
}

}  // namespace hydra::executor
