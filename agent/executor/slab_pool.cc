#include "agent/executor/slab_pool.h"

#include <map>
#include <mutex>
#include <utility>

namespace hydra::executor {

struct SlabPool::State {
  size_t limit = 0;
  SlabPinning pinning;
  std::mutex mu;
  bool open = true;  // false once the pool is gone: returning slabs are freed
  std::multimap<size_t, std::shared_ptr<AlignedSlab>> idle;  // by size
  std::map<const AlignedSlab*, bool> pinned;                 // the pool's slabs
  Stats stats;

  /// Frees a slab of the pool for good (unpinned first). Needs mu held.
  void Forget(const std::shared_ptr<AlignedSlab>& slab) {
    auto it = pinned.find(slab.get());
    if (it == pinned.end()) return;
    if (it->second && pinning.unpin) pinning.unpin(slab->data());
    stats.pooled_bytes -= slab->size();
    pinned.erase(it);
  }
};

SlabPool::SlabPool(size_t limit_bytes, SlabPinning pinning) : state_(std::make_shared<State>()) {
  state_->limit = limit_bytes;
  state_->pinning = std::move(pinning);
}

SlabPool::~SlabPool() {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->open = false;
  for (auto& [size, slab] : state_->idle) state_->Forget(slab);
  state_->idle.clear();
}

std::shared_ptr<AlignedSlab> SlabPool::Get(size_t bytes) {
  std::shared_ptr<AlignedSlab> slab;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    // The same size, or a little larger: a shard's parts come in a few sizes. (Slabs are whole
    // pages: a request is compared as the slab it would make.)
    const size_t want = AlignedSlab::SizeFor(bytes);
    auto it = state_->idle.lower_bound(want);
    if (it != state_->idle.end() && it->first <= want + want / 8) {
      slab = std::move(it->second);
      state_->idle.erase(it);
      state_->stats.idle_bytes -= slab->size();
      ++state_->stats.reused;
    }
  }
  if (!slab) {
    slab = AlignedSlab::Allocate(bytes);
    if (!slab) return nullptr;
    std::lock_guard<std::mutex> lock(state_->mu);
    if (state_->stats.pooled_bytes + slab->size() > state_->limit) {
      ++state_->stats.unpooled;
      return slab;  // plain: unmapped when dropped
    }
    const bool pinned =
        state_->pinning.pin ? state_->pinning.pin(slab->data(), slab->size()) : false;
    state_->pinned[slab.get()] = pinned;
    state_->stats.pooled_bytes += slab->size();
    ++state_->stats.made;
    if (pinned) ++state_->stats.pinned;
  }
  // The user's handle: when its last copy goes, the slab goes back to the pool, or, the pool
  // being gone, is unpinned and unmapped (the state lives until its last slab is back).
  AlignedSlab* raw = slab.get();
  return std::shared_ptr<AlignedSlab>(raw, [s = state_, slab](AlignedSlab*) mutable {
    std::lock_guard<std::mutex> lock(s->mu);
    if (s->open) {
      s->stats.idle_bytes += slab->size();
      s->idle.emplace(slab->size(), std::move(slab));
      return;
    }
    s->Forget(slab);
  });
}

SlabPool::Stats SlabPool::stats() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->stats;
}

}  // namespace hydra::executor
