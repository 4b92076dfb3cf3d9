#include "agent/executor/io_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <set>

namespace hydra::executor {
namespace {

TEST(IoPoolTest, JobsRunOnTheFixedThreadsOnly) {
  IoPool pool(2);
  std::mutex mu;
  std::set<std::thread::id> seen;
  std::vector<std::future<Status>> done;
  for (int i = 0; i < 64; ++i) {
    done.push_back(pool.Submit([&] {
      std::lock_guard<std::mutex> lock(mu);
      seen.insert(std::this_thread::get_id());
      return OkStatus();
    }));
  }
  for (auto& f : done) EXPECT_TRUE(f.get().ok());
  EXPECT_LE(seen.size(), 2u) << "no thread per operation";
  EXPECT_EQ(seen.count(std::this_thread::get_id()), 0u);
}

TEST(IoPoolTest, AJobsStatusArrivesInItsFuture) {
  IoPool pool(1);
  EXPECT_EQ(pool.Submit([] { return DataLossError("bad block"); }).get().code(),
            StatusCode::kDataLoss);
}

TEST(IoPoolTest, ShutdownRunsWhatIsQueuedThenRefuses) {
  std::atomic<int> ran{0};
  IoPool pool(1);
  std::vector<std::future<Status>> done;
  for (int i = 0; i < 10; ++i) {
    done.push_back(pool.Submit([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      ++ran;
      return OkStatus();
    }));
  }
  pool.Shutdown();
  EXPECT_EQ(ran.load(), 10) << "queued transfers finish before the pool stops";
  for (auto& f : done) EXPECT_TRUE(f.get().ok());
  EXPECT_EQ(pool.Submit([] { return OkStatus(); }).get().code(), StatusCode::kFailedPrecondition);
  pool.Shutdown();  // idempotent
}

}  // namespace
}  // namespace hydra::executor
