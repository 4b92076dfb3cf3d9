#pragma once

#include <string>

#include "common/job.h"

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

/// Adapts the calling thread's LibTorch pool to the precision of the work it is about to run,
/// after ConfigureCpuThreads chose OpenBLAS for the GEMMs: fp32 GEMMs run on OpenBLAS (LibTorch
/// keeps one thread), bf16 GEMMs run on oneDNN inside LibTorch's pool, which then gets all
/// `threads` (OpenBLAS is idle in bf16, so the pools do not fight). No-op otherwise. Covers the
/// whole step (backward runs on the calling thread too).
void UseCpuThreadsFor(Precision precision);

}  // namespace hydra::executor
