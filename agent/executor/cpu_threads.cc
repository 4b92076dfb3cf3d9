#include "agent/executor/cpu_threads.h"

#include <dlfcn.h>
#include <torch/torch.h>

#include <atomic>

namespace hydra::executor {
namespace {

std::atomic<int> g_openblas_width{0};  // > 0: ConfigureCpuThreads chose OpenBLAS GEMMs

}  // namespace

std::string ConfigureCpuThreads(int threads) {
  using SetThreads = void (*)(int);
  // Looked up at run time: LibTorch links the generic libblas.so.3, which Debian's alternatives
  // may point at OpenBLAS (libopenblas0-pthread) or at the reference BLAS.
  auto set_blas = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  if (set_blas != nullptr) {
    set_blas(threads);
    torch::set_num_threads(1);
    g_openblas_width = threads;
    return "OpenBLAS GEMMs on " + std::to_string(threads) +
           " threads, LibTorch element-wise kernels on 1";
  }
  torch::set_num_threads(threads);
  g_openblas_width = 0;
  return "LibTorch on " + std::to_string(threads) + " threads (BLAS is not OpenBLAS)";
}

void UseCpuThreadsFor(Precision precision) {
  const int width = g_openblas_width.load();
  if (width <= 0) return;
  const int want = precision == Precision::kBf16 ? width : 1;
  // Read, not remembered: ConfigureCpuThreads may have set the pool since this thread last
  // asked (a per-thread cache of the last setting went stale then, and a bf16 step ran on one
  // thread: other float sums than the same trial's elsewhere).
  if (torch::get_num_threads() == want) return;
  torch::set_num_threads(want);
}

}  // namespace hydra::executor
