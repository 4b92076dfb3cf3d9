#pragma once

#include <cstdint>

#include "common/job.h"
#include "common/partitioner.h"
#include "common/status.h"

namespace hydra {

/// What admitting a trial decided, computed once by the executor factory that will build it
/// and carried from there: the shard plan to the executor and the agent's status, the host and
/// disk bytes to the scheduler's admission, the first estimate of a step to its policy.
struct Admission {
  PartitionPlan plan;
  /// Host memory the trial holds while admitted: its state in the host tier, its offloaded
  /// activations (PartitionPlan::offloaded_bytes), and the device tier's peak (on a CPU device
  /// the device tier is host memory too; for a GPU the executor factory leaves it out:
  /// executor::HostBytesOnGpus).
  int64_t host_bytes = 0;
  int64_t disk_bytes = 0;  ///< its spill files at most (SpillDiskBytes)
  /// First estimate of an optimizer step: the plan's shard estimates, at the compute rate the
  /// plan was made for; the scheduler replaces it with measured steps.
  double est_step_seconds = 0;
};

/// Plans `trial` (resolved: its layers known) with `options` and derives the rest of its
/// admission from the plan. PlanShards's errors.
StatusOr<Admission> PlanAdmission(const Trial& trial, const PartitionOptions& options);

}  // namespace hydra
