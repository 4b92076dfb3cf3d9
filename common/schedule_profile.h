#pragma once

#include <string>
#include <vector>

#include "common/job.h"
#include "common/partitioner.h"
#include "common/scheduler.h"

namespace hydra {

/// A trial's shard-tasks from its shard plan and the cost model: per minibatch, forward of
/// shards 0..S-1 then backward of S-1..0. Compute times are FLOPs / `flops_per_second`
/// (backward = 2x forward, plus a forward when the shard recomputes); transfers are the shard's
/// weights before its forward, and its weights in and gradients out around its backward (the
/// optimizer updates where its state lives, in the host tier: Harmony, ZeRO-Offload); zero
/// when the trial is unsharded (it stays on its device).
TrialProfile ProfileFromPlan(const Trial& trial, const PartitionPlan& plan,
                             double flops_per_second);

}  // namespace hydra
