#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "agent/executor/disk_tier.h"

namespace hydra::executor {

/// How a pool makes memory DMA-able for a device (on a GPU: cudaHostRegister and
/// cudaHostUnregister). Empty functions: the slabs stay plain memory.
struct SlabPinning {
  std::function<bool(void* data, size_t bytes)> pin;  ///< false: could not pin (left plain)
  std::function<void(void* data)> unpin;
};

/// Reusable page-aligned slabs for a discrete device: the disk tier's (disk -> pinned slab ->
/// device) and the host copies' (HostTensorPool), with each slab pinned once when made instead
/// of per transfer (pinning costs about as much as the copy it enables). A slab given out returns
/// to the pool when its last user drops it and is handed out again for the same size; the pool
/// keeps at most `limit_bytes` of slabs in all (pinned, given out or idle): past that, Get makes
/// plain slabs that are unmapped when dropped, so the pool bounds both the pinned and the idle host
/// memory. Thread-safe. Slabs may outlive the pool (they are then unpinned and unmapped when
/// dropped).
class SlabPool {
 public:
  SlabPool(size_t limit_bytes, SlabPinning pinning);
  ~SlabPool();
  SlabPool(const SlabPool&) = delete;
  SlabPool& operator=(const SlabPool&) = delete;

  /// A slab of at least `bytes` (its contents are whatever its last user left); nullptr when
  /// the system refuses the memory.
  std::shared_ptr<AlignedSlab> Get(size_t bytes);

  struct Stats {
    size_t pooled_bytes = 0;  ///< slabs the pool owns, given out or idle (<= the limit)
    size_t idle_bytes = 0;    ///< of those, waiting in the pool
    int64_t made = 0;         ///< slabs allocated for the pool
    int64_t reused = 0;       ///< Gets served by an idle slab
    int64_t unpooled = 0;     ///< Gets past the limit (plain, not kept)
    int64_t pinned = 0;       ///< slabs pinned
  };
  Stats stats() const;

 private:
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace hydra::executor
