#pragma once

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/job.h"

namespace hydra {

/// Trial states, as `hydra run`, the agent and the MultiModelJob status spell them.
inline constexpr const char* kTrialPending = "Pending";
inline constexpr const char* kTrialRunning = "Running";
inline constexpr const char* kTrialSucceeded = "Succeeded";
inline constexpr const char* kTrialFailed = "Failed";
inline constexpr const char* kTrialInterrupted = "Interrupted";  ///< checkpointed, can resume
inline constexpr const char* kTrialCancelled = "Cancelled";
/// Stopped by spec.search.earlyStopping before its last step; its checkpoints stay.
inline constexpr const char* kTrialEarlyStopped = "EarlyStopped";
/// Why a trial suspended by spec.suspend ends Interrupted: its message is "suspended at step N",
/// which tells a suspension from a drain.
inline constexpr const char* kSuspendedReason = "suspended";
/// Whether an Interrupted trial's message says it was suspended.
bool IsSuspendedMessage(const std::string& message);
/// Every state, for metrics that export a series per state from the start.
inline constexpr const char* kTrialStates[] = {
    kTrialPending,     kTrialRunning,   kTrialSucceeded,   kTrialFailed,
    kTrialInterrupted, kTrialCancelled, kTrialEarlyStopped};

struct CurvePoint {
  int64_t step = 0;  ///< optimizer steps taken when the loss was measured
  double loss = 0;
};

/// Where one trial stands, and its results once it ends.
struct TrialResult {
  Trial trial;
  std::string state = kTrialPending;  ///< one of the kTrial* states
  std::string message;                ///< why it failed or was interrupted
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
  int64_t resumed_from_step = 0;      ///< step of the checkpoint this run started from (0: fresh)
  int64_t last_checkpoint_step = -1;  ///< step of the newest checkpoint written or loaded
  int device = -1;                    ///< device of the latest step (-1: none yet)
  int64_t disk_bytes_read = 0;        ///< spill traffic of this run
  int64_t disk_bytes_written = 0;
  std::vector<CurvePoint> train_curve;  ///< every step's training loss
  std::vector<CurvePoint> val_curve;    ///< every evaluation
  double eta_seconds = std::numeric_limits<double>::quiet_NaN();
  /// Early stopping: the step the trial may train to now, below its steps (0: no limit).
  int64_t step_limit = 0;
};

/// A Running trial that reached its early-stopping limit and waits for the other trials'
/// results there.
bool IsWaitingAtLimit(const TrialResult& r);

/// Most points a loss curve keeps: records, status and checkpoints stay the same size however
/// many steps a trial takes.
inline constexpr size_t kMaxCurvePoints = 1024;

/// The newest point's loss (NaN for an empty curve).
double LatestLoss(const std::vector<CurvePoint>& curve);

/// Appends `point`; past `max_points` the older half of the curve is thinned to every second
/// point (the newest max_points / 2 stay exact). Deterministic: a resumed trial's curve equals
/// an uninterrupted run's.
void AppendBounded(std::vector<CurvePoint>* curve, CurvePoint point,
                   size_t max_points = kMaxCurvePoints);

/// True for states a trial never leaves.
bool IsFinalTrialState(const std::string& state);

/// A loss curve as [[step, loss], ...], and back (invalid JSON throws nlohmann's exception).
nlohmann::json CurveJson(const std::vector<CurvePoint>& curve);
std::vector<CurvePoint> CurveFromJson(const nlohmann::json& j);

}  // namespace hydra
