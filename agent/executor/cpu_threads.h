#pragma once

#include <string>

namespace hydra::executor {

/// Sets up CPU threading for training with `threads` cores.
///
/// LibTorch parallelises element-wise kernels with OpenMP while OpenBLAS runs GEMMs on its own
/// thread pool; both spin-wait after their work, so with both pools as wide as the machine they
/// fight for the cores (measured here: 2x slower on a small GPT-2). When the process's BLAS is
/// OpenBLAS, GEMMs get `threads` OpenBLAS threads and LibTorch's own pool gets one thread;
/// otherwise LibTorch gets `threads`. Process-wide; call once from main() or a factory.
/// Returns a one-line description of the configuration chosen.
std::string ConfigureCpuThreads(int threads);

}  // namespace hydra::executor
