#pragma once

#include <cstdint>
#include <string>

#include "agent/executor/tier_ledger.h"
#include "common/status.h"

namespace hydra::executor {

/// Where one part of a shard's state (its weights, or its optimizer state) is. A part moves
/// only along these edges:
///
///   kOnDisk --read--> kReading --done--> kOnDevice <--stash/fetch--> kInHost
///   kOnDevice --write back--> kWritingBack --done--> kOnDisk
///   kOnDevice --drop (its file is current)--> kOnDisk
///   kInHost --spill or drop--> kOnDisk
///
/// A part whose state rests in the host tier has no file: it moves between kInHost and
/// kOnDevice only.
enum class Residency {
  kOnDisk,       ///< only in its spill file: its tensors hold no memory
  kReading,      ///< its spill file being read on an I/O thread, to the device
  kInHost,       ///< in host memory, off the device
  kOnDevice,     ///< on the device: a step may use it
  kWritingBack,  ///< still on the device, its spill file being rewritten
};
const char* ResidencyName(Residency r);

/// One part's residency and the tier ledger that follows it. What each state holds in the
/// ledger: kReading, kOnDevice and kWritingBack hold device bytes (a prefetch reserves its
/// device memory when it is issued; memory being written back is freed only once the write is
/// done). A part resting in the host tier holds host bytes in every state (the host copy is
/// the master copy); one resting on disk holds host bytes only while kInHost.
class PartResidency {
 public:
  /// `rests_in`: Tier::kHost or Tier::kDisk. Starts kInHost, holding its host bytes: the
  /// part was just built in host memory. `what` names it in the ledger's messages.
  PartResidency(TierLedger* ledger, std::string what, int64_t bytes, Tier rests_in);
  ~PartResidency();
  PartResidency(PartResidency&& other) noexcept;
  PartResidency(const PartResidency&) = delete;
  PartResidency& operator=(const PartResidency&) = delete;
  PartResidency& operator=(PartResidency&&) = delete;

  Residency where() const { return where_; }
  int64_t bytes() const { return bytes_; }

  /// Moves to `next` along one of the edges above: acquires the tiers `next` holds and the
  /// current state does not (RESOURCE_EXHAUSTED from the ledger leaves everything as it was),
  /// then releases those it no longer holds. Staying where it is does nothing. INTERNAL for a
  /// move the machine does not have (a bug in the executor), naming both states.
  Status To(Residency next);

 private:
  bool Holds(Residency r, Tier t) const;

  TierLedger* ledger_;  // nullptr once moved from
  std::string what_;
  int64_t bytes_;
  Tier rests_in_;
  Residency where_ = Residency::kInHost;
};

}  // namespace hydra::executor
