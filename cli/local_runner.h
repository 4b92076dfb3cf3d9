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
#include "common/job.h"
#include "common/scheduler.h"
#include "common/status.h"

namespace hydra::cli {

struct CurvePoint {
  int64_t step = 0;  ///< optimizer steps taken when the loss was measured
  double loss = 0;
};

/// Where one trial stands, and its results once it ends.
struct TrialResult {
  Trial trial;
  std::string state = "Pending";  ///< Pending | Running | Succeeded | Failed | Interrupted
  std::string message;            ///< why it failed or was interrupted
  int64_t step = 0;
  double final_train_loss = std::numeric_limits<double>::quiet_NaN();  ///< mean of last 10 steps
  double final_val_loss = std::numeric_limits<double>::quiet_NaN();
  double last_loss = std::numeric_limits<double>::quiet_NaN();
  double tokens_per_second = 0;  ///< trained tokens / training seconds, over all runs
  double wall_seconds = 0;       ///< training, evaluation and checkpoints, over all runs
  double train_seconds = 0;
  int64_t trained_tokens = 0;
  int64_t shards = 1;
  int64_t peak_device_bytes = 0;
  int64_t resumed_from_step = 0;        ///< step of the checkpoint this run started from (0: fresh)
  std::vector<CurvePoint> train_curve;  ///< every step's training loss
  std::vector<CurvePoint> val_curve;    ///< every evaluation
  double eta_seconds = std::numeric_limits<double>::quiet_NaN();
};

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
  /// Host memory the admitted trials' state may use; trials past it wait, in order, until
  /// earlier ones finish. <= 0: 75% of the machine's memory.
  int64_t host_memory_bytes = 0;
};

/// Trains a job's trials on this machine's devices with the Sharded-LRTF policy: whenever a
/// device is free it takes the admitted, not running trial with the longest estimated remaining
/// time (from the cost model, refined by measured step times) and runs its next optimizer step.
/// Checkpoints as the manifest says, resumes from what an earlier run left in the output
/// directory, and records the schedule it ran.
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
  struct Slot;
  Status Start(Slot& slot);
  Status StepOnce(Slot& slot);
  Status Finish(Slot& slot);
  Status SaveCheckpoint(Slot& slot);
  void Worker(int device);
  void Report(size_t index);
  std::string TrialDir(const Trial& trial) const;

  executor::ExecutorFactoryInterface* factory_;
  ProgressSinkInterface* progress_;
  RunOptions options_;
  std::unique_ptr<SchedulingPolicyInterface> policy_;
  std::vector<TrialResult>* results_ = nullptr;
  std::vector<std::unique_ptr<Slot>> slots_;
  Schedule schedule_;
  std::mutex mu_;           // guards slots' scheduling fields, schedule_, policy_
  std::mutex progress_mu_;  // serialises progress callbacks
  std::condition_variable cv_;
  std::chrono::steady_clock::time_point start_;
};

/// Sorts results best first: succeeded trials by final validation loss, then the rest.
std::vector<TrialResult> RankResults(const std::vector<TrialResult>& results);

}  // namespace hydra::cli
