#include "agent/executor/io_pool.h"

#include <algorithm>

namespace hydra::executor {

IoPool::IoPool(int threads) {
  for (int i = 0; i < std::max(1, threads); ++i) threads_.emplace_back(&IoPool::Loop, this);
}

IoPool::~IoPool() { Shutdown(); }

std::future<Status> IoPool::Submit(std::function<Status()> job) {
  std::packaged_task<Status()> task(std::move(job));
  std::future<Status> done = task.get_future();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) {
      std::promise<Status> refused;
      refused.set_value(FailedPreconditionError("the I/O pool is shut down"));
      return refused.get_future();
    }
    queue_.push_back(std::move(task));
  }
  ready_.notify_one();
  return done;
}

void IoPool::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ && threads_.empty()) return;
    stopping_ = true;
  }
  ready_.notify_all();
  for (auto& t : threads_) {
    if (t.joinable()) t.join();
  }
  threads_.clear();
}

void IoPool::Loop() {
  for (;;) {
    std::packaged_task<Status()> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      ready_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and nothing left to run
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

}  // namespace hydra::executor
