#pragma once

#include "common/job.h"
#include "common/status.h"

namespace hydra::executor {

/// What a short pilot run measured for a trial's transformer blocks.
struct PilotResult {
  double block_seconds = 0;     ///< measured forward + backward of one block, one micro-batch
  double block_flops = 0;       ///< the cost model's FLOPs for the same work (3x forward)
  double flops_per_second = 0;  ///< achieved rate: block_flops / block_seconds
};

/// Times a forward and backward of one GPT-2 block of the trial's width at its micro-batch, on
/// random tokens (two warm-up rounds, then the mean of three), to check the cost model's time
/// estimates and to calibrate them. Uses the current LibTorch threading.
StatusOr<PilotResult> RunPilot(const Trial& trial);

}  // namespace hydra::executor
