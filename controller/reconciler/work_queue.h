#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>

namespace hydra::controller {

/// A deduplicating work queue of object keys ("namespace/name"), as client-go's: a key queued
/// twice is processed once; a key being processed is not handed to a second worker (it is
/// queued again when Done). AddAfter delays a key (requeue); an earlier time wins.
/// Thread-safe.
class WorkQueue {
 public:
  void Add(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    AddLocked(key);
  }
  void AddAfter(const std::string& key, std::chrono::milliseconds delay) {
    if (delay.count() <= 0) return Add(key);
    std::lock_guard<std::mutex> lock(mu_);
    const auto at = std::chrono::steady_clock::now() + delay;
    auto it = delayed_.find(key);
    if (it == delayed_.end() || at < it->second) delayed_[key] = at;
    cv_.notify_all();
  }
  /// The next key, or nullopt once ShutDown was called.
  std::optional<std::string> Get() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      if (shutdown_) return std::nullopt;
      PromoteDue();
      if (!queue_.empty()) {
        std::string key = queue_.front();
        queue_.pop_front();
        queued_.erase(key);
        processing_.insert(key);
        return key;
      }
      auto next = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
      for (const auto& [k, at] : delayed_) next = std::min(next, at);
      cv_.wait_until(lock, next);
    }
  }
  void Done(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    processing_.erase(key);
    if (dirty_.erase(key)) AddLocked(key);
  }
  void ShutDown() {
    std::lock_guard<std::mutex> lock(mu_);
    shutdown_ = true;
    cv_.notify_all();
  }
  /// Keys waiting now (not counting delayed ones).
  size_t Depth() {
    std::lock_guard<std::mutex> lock(mu_);
    return queue_.size();
  }

 private:
  void AddLocked(const std::string& key) {
    if (processing_.count(key)) {
      dirty_.insert(key);  // handled again when the worker is done
      return;
    }
    delayed_.erase(key);
    if (queued_.insert(key).second) queue_.push_back(key);
    cv_.notify_all();
  }
  void PromoteDue() {
    const auto now = std::chrono::steady_clock::now();
    for (auto it = delayed_.begin(); it != delayed_.end();) {
      if (it->second <= now) {
        const std::string key = it->first;
        it = delayed_.erase(it);
        if (processing_.count(key)) {
          dirty_.insert(key);
        } else if (queued_.insert(key).second) {
          queue_.push_back(key);
        }
      } else {
        ++it;
      }
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::string> queue_;
  std::set<std::string> queued_, processing_, dirty_;
  std::map<std::string, std::chrono::steady_clock::time_point> delayed_;
  bool shutdown_ = false;
};

}  // namespace hydra::controller
