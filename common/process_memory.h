#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>

namespace hydra {

/// This process's resident memory in bytes (from /proc/self/statm); 0 if unreadable.
int64_t ResidentBytes();

/// Samples ResidentBytes() on a thread every `period` from construction until Stop() or
/// destruction, keeping the peak. For tests and benchmarks that bound memory.
class ResidentPeakSampler {
 public:
  explicit ResidentPeakSampler(std::chrono::milliseconds period = std::chrono::milliseconds(2));
  ~ResidentPeakSampler();
  ResidentPeakSampler(const ResidentPeakSampler&) = delete;
  ResidentPeakSampler& operator=(const ResidentPeakSampler&) = delete;

  /// Stops sampling (idempotent); then peak() is final.
  void Stop();
  int64_t peak() const { return peak_.load(); }

 private:
  std::atomic<bool> done_{false};
  std::atomic<int64_t> peak_{0};
  std::thread thread_;
};

}  // namespace hydra
