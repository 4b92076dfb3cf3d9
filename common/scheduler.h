#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace hydra {

/// One shard-task of a trial's minibatch: a shard's forward or its backward (with the shard's
/// optimizer step), the unit the scheduler hands to a device.
struct TaskProfile {
  std::string name;            ///< "F3", "B3"
  double compute_seconds = 0;  ///< on one device
  int64_t transfer_bytes = 0;  ///< bytes moved host<->device before/after it runs
};

/// A trial as the scheduler sees it: its shard-tasks per minibatch, and how many minibatches.
struct TrialProfile {
  std::string name;
  std::vector<TaskProfile> tasks;  ///< in execution order for one minibatch
  int64_t minibatches = 1;
  /// Sequences in one minibatch (spec.training.batchSize); 0: unknown. A pipeline cannot cut
  /// a minibatch into more micro-batches than it has sequences.
  int64_t batch_size = 0;
  double MinibatchSeconds() const;
  double TotalSeconds() const { return MinibatchSeconds() * static_cast<double>(minibatches); }
};

/// What a scheduling policy sees of a trial that could run now.
struct RunnableTrial {
  size_t index = 0;              ///< into the job's trials
  double remaining_seconds = 0;  ///< estimated compute left (pilot profile, refined online)
  double ready_since = 0;        ///< when its previous task ended (FIFO's key)
  int64_t tasks_done = 0;
};

/// Chooses which runnable trial a free device takes. The same object drives the simulator and
/// the real devices. Not thread-safe: drivers call it under their own lock.
class SchedulingPolicyInterface {
 public:
  virtual ~SchedulingPolicyInterface() = default;
  virtual std::string name() const = 0;
  /// Index into `runnable` (non-empty) of the trial to run next.
  virtual size_t Pick(const std::vector<RunnableTrial>& runnable) = 0;
};

/// Sharded-LRTF (Hydra): the runnable trial with the longest remaining time; ties by index.
std::unique_ptr<SchedulingPolicyInterface> MakeShardedLrtfPolicy();
/// FIFO: the trial that has been ready longest; ties by index.
std::unique_ptr<SchedulingPolicyInterface> MakeFifoPolicy();
/// Round-robin: cycles through trials by index.
std::unique_ptr<SchedulingPolicyInterface> MakeRoundRobinPolicy();

/// One executed task in a schedule.
struct ScheduledTask {
  size_t trial = 0;
  int64_t minibatch = 0;
  size_t task = 0;  ///< index into the trial's tasks
  int device = 0;
  double start = 0, end = 0;
};

struct Schedule {
  std::vector<ScheduledTask> tasks;
  double makespan = 0;
  std::vector<double> busy_seconds;  ///< per device
  double Utilization() const;        ///< mean over devices of busy / makespan
};

struct SimulationOptions {
  int devices = 1;
  double link_bytes_per_second = 0;  ///< host<->device; 0: transfers are free
};

/// Discrete-event simulation of `policy` over `devices`: whenever a device frees up it takes
/// the policy's pick among the trials whose previous task has finished and that are not running
/// elsewhere. A task's transfer overlaps the previous task on the same device (double
/// buffering), so it adds only max(0, transfer - previous compute).
Schedule Simulate(const std::vector<TrialProfile>& trials, SchedulingPolicyInterface* policy,
                  const SimulationOptions& options);

/// max(total work / devices, longest trial): no schedule can beat it.
double MakespanLowerBound(const std::vector<TrialProfile>& trials, int devices);

/// Trials one after another, each with its shards spread over the devices but run one at a
/// time (naive model parallelism): the sum of the trials' times plus unhidden transfers.
double SequentialModelParallelMakespan(const std::vector<TrialProfile>& trials,
                                       const SimulationOptions& options);

/// Trials one after another, each pipelined GPipe-style over all devices with `micro_batches`
/// micro-batches per minibatch (at most the trial's batch_size, when known): a minibatch takes
/// (m + d - 1) / (m d) of its one-device time.
double GpipeMakespan(const std::vector<TrialProfile>& trials, const SimulationOptions& options,
                     int micro_batches);

/// Checks a schedule's invariants: no device runs two tasks at once, no trial runs two tasks at
/// once, every trial's tasks run in order and all of them run. FAILED_PRECONDITION naming the
/// first violation.
Status CheckSchedule(const std::vector<TrialProfile>& trials, const Schedule& schedule);

}  // namespace hydra
