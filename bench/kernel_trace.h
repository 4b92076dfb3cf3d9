#pragma once
// bench/spill's --profile-trace: a few training steps' GPU kernels, recorded with LibTorch's
// Kineto profiler (the profiler torch.profiler drives) and saved as a Chrome trace that
// bench/trace_summary.py sums by kernel beside PyTorch eager's.

#include <string>

#include "common/status.h"

namespace hydra::bench {

/// Starts recording the GPU's kernels and copies. FailedPrecondition in a build without CUDA.
Status StartKernelTrace();

/// Waits for the GPU, stops recording and writes the trace (Chrome trace JSON) to `path`.
Status SaveKernelTrace(const std::string& path);

}  // namespace hydra::bench
