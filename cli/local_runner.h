#pragma once

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "agent/executor/executor.h"
#include "agent/scheduler/trial_scheduler.h"
#include "common/job.h"
#include "common/scheduler.h"
#include "common/status.h"
#include "common/trial_result.h"

namespace hydra::cli {

using ::hydra::CurvePoint;
using ::hydra::TrialResult;

/// Receives progress from the runner, on the runner's thread.
class ProgressSinkInterface {
 public:
  virtual ~ProgressSinkInterface() = default;
  virtual void OnJobStart(const std::string& job, const std::vector<TrialResult>& trials) = 0;
  /// After every step, evaluation and state change of trial `index`.
  virtual void OnTrialUpdate(size_t index, const TrialResult& result) = 0;
  /// A warning or notice worth showing (e.g. a corrupt checkpoint skipped).
  virtual void OnMessage(const std::string& message) = 0;
  virtual void OnJobEnd(const std::vector<TrialResult>& trials) = 0;
};

struct RunOptions {
  std::string output_dir;  ///< trials/<name>/checkpoints, trials/<name>/result.json
  bool restart = false;    ///< discard earlier checkpoints and results in output_dir
  /// Set (e.g. by a SIGINT handler) to stop: running trials checkpoint and Run returns
  /// CANCELLED. May be null.
  const std::atomic<bool>* interrupted = nullptr;
  int devices = 1;  ///< devices (worker threads) training trials at once
  /// Per device, the memory of a GPU that trials keep state on (DiscreteDeviceMemory); empty
  /// for CPU devices.
  std::vector<int64_t> device_memory_bytes;
  /// Host memory the admitted trials' state may use; trials past it wait, in order, until
  /// earlier ones finish. <= 0: 75% of the machine's memory.
  int64_t host_memory_bytes = 0;
  /// The executors' spill directory: trials spilling to disk are admitted while all their
  /// spill files fit its free space. Empty: no such admission check.
  std::string spill_dir;
  /// CPU threads per device, recorded in checkpoints (a resume under another count is not
  /// bit-exact and says so). 0: unknown.
  int threads = 0;
};

/// Trains a job's trials on this machine: the in-process agent of `hydra run`. It checks every
/// trial first, hands them to an agent::TrialScheduler (Sharded-LRTF over the devices, steps,
/// checkpoints), resumes from what an earlier run left in the output directory, writes each
/// finished trial's result.json and records the schedule it ran.
class LocalRunner {
 public:
  /// `factory` and `progress` are borrowed and must outlive the runner. The policy defaults to
  /// Sharded-LRTF.
  LocalRunner(executor::ExecutorFactoryInterface* factory, ProgressSinkInterface* progress,
              RunOptions options, std::unique_ptr<SchedulingPolicyInterface> policy = nullptr);
  ~LocalRunner();

  /// Runs every trial. Returns the results in trial order; a trial that fails is reported with
  /// state Failed and the others still run. Errors that concern the whole job (unreadable
  /// dataset, unusable output directory) are returned before any training. CANCELLED when
  /// interrupted (the results so far are in `results`).
  Status Run(const MultiModelJob& job, const std::vector<Trial>& trials,
             std::vector<TrialResult>* results);

  /// The steps this run executed: one task per optimizer step, with device and times (seconds
  /// since Run started).
  const Schedule& schedule() const { return schedule_; }

 private:
  class Observer;
  std::string TrialDir(const Trial& trial) const;

  executor::ExecutorFactoryInterface* factory_;
  ProgressSinkInterface* progress_;
  RunOptions options_;
  std::unique_ptr<SchedulingPolicyInterface> policy_;
  Schedule schedule_;
};

/// Sorts results best first: succeeded trials by final validation loss, then trials stopped
/// early by their last validation loss, then the rest.
std::vector<TrialResult> RankResults(const std::vector<TrialResult>& results);

}  // namespace hydra::cli
