#pragma once
// LibTorch's CPU allocator replaced for a test binary: what it hands out is counted, and it can
// be made to run out of memory. On the CPU as a discrete device (ExecutorDevices::
// simulate_discrete) the "device" tensors come from it, the host tier's from the slab pool.

#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/Exception.h>
#include <torch/version.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <unordered_map>

namespace hydra::executor::testing {

/// LibTorch's CPU allocator with the bytes it has handed out counted: now, and the most since
/// ResetPeak. Installed for the whole process on first use (tensors allocated before keep
/// their own deleter and are not counted).
class CountingCpuAllocator final : public at::Allocator {
 public:
  static CountingCpuAllocator& Installed() {
    static CountingCpuAllocator* a = [] {
      auto* made = new CountingCpuAllocator();
      c10::SetCPUAllocator(made, /*priority=*/100);
      return made;
    }();
    return *a;
  }

#if TORCH_VERSION_MAJOR >= 2
  at::DataPtr allocate(size_t n) override { return Make(n); }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
#else
  at::DataPtr allocate(size_t n) const override { return Make(n); }
#endif

  at::DeleterFnPtr raw_deleter() const override { return &Release; }

  int64_t Current() const { return current_.load(); }
  int64_t Peak() const { return peak_.load(); }
  void ResetPeak() { peak_ = current_.load(); }
  /// The next `n` allocations (of any thread; empty ones aside) throw c10::OutOfMemoryError,
  /// as a full GPU's caching allocator does; 0 disarms.
  void FailNext(int n) { fail_next_ = n; }

 private:
  // The context is the data itself: raw_allocate (oneDNN's convolutions) asserts it.
  static void Release(void* data) {
    if (data == nullptr) return;  // oneDNN frees what it never got
    auto& self = Installed();
    int64_t bytes = 0;
    {
      std::lock_guard<std::mutex> lock(self.mu_);
      auto it = self.sizes_.find(data);
      bytes = it->second;
      self.current_ -= it->second;
      self.sizes_.erase(it);
    }
    c10::free_cpu(data);
    if (c10::memoryProfilingEnabled()) {  // as LibTorch's own allocator reports (layer_memory)
      c10::reportMemoryUsageToProfiler(data, -bytes, self.current_.load(), 0,
                                       c10::Device(c10::DeviceType::CPU));
    }
  }

  // const: LibTorch 1.13's allocate() is.
  at::DataPtr Make(size_t n) const {
    if (n > 0 && fail_next_.load() > 0 && fail_next_.fetch_sub(1) > 0) {
      C10_THROW_ERROR(OutOfMemoryError, "CountingCpuAllocator: out of memory (FailNext), " +
                                            std::to_string(n) + " bytes asked");
    }
    void* data = c10::alloc_cpu(n);
    {
      std::lock_guard<std::mutex> lock(mu_);
      sizes_[data] = static_cast<int64_t>(n);
    }
    const int64_t now = current_ += static_cast<int64_t>(n);
    int64_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
    if (c10::memoryProfilingEnabled()) {
      c10::reportMemoryUsageToProfiler(data, static_cast<int64_t>(n), now, 0,
                                       c10::Device(c10::DeviceType::CPU));
    }
    return {data, data, &Release, at::Device(at::DeviceType::CPU)};
  }

  mutable std::mutex mu_;
  mutable std::unordered_map<void*, int64_t> sizes_;
  mutable std::atomic<int64_t> current_{0};
  mutable std::atomic<int64_t> peak_{0};
  mutable std::atomic<int> fail_next_{0};
};

}  // namespace hydra::executor::testing
