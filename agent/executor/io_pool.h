#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include "common/status.h"

namespace hydra::executor {

/// A fixed set of I/O threads running submitted jobs in order of submission (the disk tier's
/// reads and writes), instead of a thread per operation. Jobs must not wait for other jobs of
/// the same pool. Shutdown (and the destructor) runs every job already submitted, then joins.
class IoPool {
 public:
  explicit IoPool(int threads);
  ~IoPool();
  IoPool(const IoPool&) = delete;
  IoPool& operator=(const IoPool&) = delete;

  /// Queues `job`; its Status arrives in the future. After Shutdown, the future holds
  /// FAILED_PRECONDITION at once.
  std::future<Status> Submit(std::function<Status()> job);
  /// Runs what is queued, stops the threads; idempotent.
  void Shutdown();
  int threads() const { return static_cast<int>(threads_.size()); }

 private:
  void Loop();
  std::mutex mu_;
  std::condition_variable ready_;
  std::deque<std::packaged_task<Status()>> queue_;  // guarded by mu_
  bool stopping_ = false;                           // guarded by mu_
  std::vector<std::thread> threads_;
};

}  // namespace hydra::executor
