#include "agent/executor/slab_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

namespace hydra::executor {
namespace {

/// Pinning that records what is pinned, as cudaHostRegister / cudaHostUnregister would see it.
struct FakePinning {
  std::mutex mu;
  std::map<void*, size_t> pinned;
  int pins = 0, unpins = 0;
  SlabPinning Hooks() {
    return {[this](void* p, size_t n) {
              std::lock_guard<std::mutex> lock(mu);
              EXPECT_EQ(pinned.count(p), 0u) << "pinned twice";
              pinned[p] = n;
              ++pins;
              return true;
            },
            [this](void* p) {
              std::lock_guard<std::mutex> lock(mu);
              EXPECT_EQ(pinned.erase(p), 1u) << "unpinned what was not pinned";
              ++unpins;
            }};
  }
};

TEST(SlabPoolTest, ASlabIsPinnedOnceAndReusedForTheSameSize) {
  FakePinning pin;
  SlabPool pool(1 << 20, pin.Hooks());
  void* first = nullptr;
  for (int i = 0; i < 5; ++i) {
    auto slab = pool.Get(100000);
    ASSERT_NE(slab, nullptr);
    EXPECT_GE(slab->size(), 100000u);
    EXPECT_EQ(slab->size() % kSpillAlignment, 0u);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(slab->data()) % kSpillAlignment, 0u);
    slab->data()[0] = static_cast<char>(i);  // writable
    if (i == 0) first = slab->data();
    EXPECT_EQ(slab->data(), first) << "the same slab comes back";
  }
  EXPECT_EQ(pin.pins, 1) << "pinned when made, not per use";
  EXPECT_EQ(pin.unpins, 0);
  const auto st = pool.stats();
  EXPECT_EQ(st.made, 1);
  EXPECT_EQ(st.reused, 4);
  EXPECT_EQ(st.pinned, 1);
  EXPECT_EQ(st.idle_bytes, st.pooled_bytes);
}

TEST(SlabPoolTest, ASmallSlabIsReusedThoughItsPageIsMoreThanWasAsked) {
  // 6 KiB (a LayerNorm's gradients) makes an 8 KiB slab: the next step's 6 KiB gets it back.
  FakePinning pin;
  SlabPool pool(1 << 20, pin.Hooks());
  for (size_t bytes : {6144u, 6144u, 100u, 4096u}) pool.Get(bytes);
  EXPECT_EQ(pool.stats().made, 2) << "8 KiB, then one page";
  EXPECT_EQ(pool.stats().reused, 2);
  EXPECT_EQ(pin.pins, 2);
}

TEST(SlabPoolTest, SlabsInUseAreNeverHandedOutTwice) {
  SlabPool pool(1 << 20, {});
  auto a = pool.Get(8192);
  auto b = pool.Get(8192);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_NE(a->data(), b->data());
  auto a_copy = a;  // a slab returns only when its last user lets go
  a.reset();
  auto c = pool.Get(8192);
  EXPECT_NE(c->data(), a_copy->data());
  EXPECT_EQ(pool.stats().made, 3);
  // A much smaller request does not take a large idle slab.
  a_copy.reset();
  auto small = pool.Get(100);
  EXPECT_NE(small, nullptr);
  EXPECT_EQ(pool.stats().made, 4);
}

TEST(SlabPoolTest, PastItsLimitThePoolMakesPlainSlabsItDoesNotKeep) {
  FakePinning pin;
  SlabPool pool(3 * 65536, pin.Hooks());
  std::vector<std::shared_ptr<AlignedSlab>> held;
  for (int i = 0; i < 5; ++i) held.push_back(pool.Get(65536));
  auto st = pool.stats();
  EXPECT_EQ(st.made, 3);
  EXPECT_EQ(st.unpooled, 2);
  EXPECT_EQ(st.pooled_bytes, 3u * 65536);
  EXPECT_EQ(pin.pins, 3) << "only the pool's slabs are pinned";
  held.clear();
  st = pool.stats();
  EXPECT_EQ(st.idle_bytes, 3u * 65536) << "the plain ones were unmapped, not kept";
}

TEST(SlabPoolTest, EverySlabIsUnpinnedWhenThePoolAndItsUsersAreGone) {
  FakePinning pin;
  std::shared_ptr<AlignedSlab> outlives;
  {
    SlabPool pool(1 << 20, pin.Hooks());
    auto idle = pool.Get(4096);
    outlives = pool.Get(4096);
    idle.reset();
    EXPECT_EQ(pin.pins, 2);
  }
  EXPECT_EQ(pin.unpins, 1) << "the idle slab went with the pool";
  outlives->data()[0] = 1;  // still usable
  outlives.reset();
  EXPECT_EQ(pin.unpins, 2);
  EXPECT_TRUE(pin.pinned.empty());
}

TEST(SlabPoolTest, ThreadsGetAndReturnSlabsConcurrently) {
  FakePinning pin;
  SlabPool pool(1 << 22, pin.Hooks());
  std::atomic<int> overlaps{0};
  std::mutex mu;
  std::set<char*> in_use;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 500; ++i) {
        auto s = pool.Get(4096 * (1 + i % 3));
        {
          std::lock_guard<std::mutex> lock(mu);
          if (!in_use.insert(s->data()).second) ++overlaps;
        }
        s->data()[0] = 1;
        std::lock_guard<std::mutex> lock(mu);
        in_use.erase(s->data());
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(overlaps, 0);
  EXPECT_LE(pool.stats().made, 12) << "slabs were reused";
}

}  // namespace
}  // namespace hydra::executor
