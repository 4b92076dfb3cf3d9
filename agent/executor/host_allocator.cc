#include "agent/executor/host_allocator.h"

#include <malloc.h>

#include <climits>
#include <mutex>

namespace hydra::executor {

void KeepFreedHostMemory() {
  static std::once_flag once;
  std::call_once(once, [] {
    mallopt(M_MMAP_MAX, 0);
    mallopt(M_TRIM_THRESHOLD, INT_MAX);
  });
}

ReturnsHostMemoryWhenDone::~ReturnsHostMemoryWhenDone() { malloc_trim(0); }

}  // namespace hydra::executor
