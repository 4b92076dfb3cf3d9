#include "agent/executor/cpu_threads.h"

#include <dlfcn.h>
#include <torch/torch.h>

namespace hydra::executor {

std::string ConfigureCpuThreads(int threads) {
  using SetThreads = void (*)(int);
  // Looked up at run time: LibTorch links the generic libblas.so.3, which Debian's alternatives
  // may point at OpenBLAS (libopenblas0-pthread) or at the reference BLAS.
  auto set_blas = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  if (set_blas != nullptr) {
    set_blas(threads);
    torch::set_num_threads(1);
    return "OpenBLAS GEMMs on " + std::to_string(threads) +
           " threads, LibTorch element-wise kernels on 1";
  }
  torch::set_num_threads(threads);
  return "LibTorch on " + std::to_string(threads) + " threads (BLAS is not OpenBLAS)";
}

}  // namespace hydra::executor
