#include "common/process_memory.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>

namespace hydra {

int64_t ResidentBytes() {
  std::ifstream in("/proc/self/statm");
  int64_t size = 0, resident = 0;
  if (!(in >> size >> resident)) return 0;
  return resident * ::sysconf(_SC_PAGESIZE);
}

ResidentPeakSampler::ResidentPeakSampler(std::chrono::milliseconds period)
    : thread_([this, period] {
        while (!done_.load()) {
          peak_ = std::max<int64_t>(peak_.load(), ResidentBytes());
          std::this_thread::sleep_for(period);
        }
      }) {}

ResidentPeakSampler::~ResidentPeakSampler() { Stop(); }

void ResidentPeakSampler::Stop() {
  done_ = true;
  if (thread_.joinable()) thread_.join();
}

}  // namespace hydra
