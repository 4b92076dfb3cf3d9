#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/job.h"
#include "common/scheduler.h"
#include "common/status.h"

namespace hydra::cli {

struct SimulationReport {
  Schedule schedule;  ///< Sharded-LRTF's
  double lower_bound = 0;
  std::map<std::string, double> baselines;  ///< name -> makespan seconds
  int micro_batches = 1;                    ///< used for the GPipe baseline
};

/// Sharded-LRTF over `options.devices`, with the lower bound and the baselines: trials one after
/// another with naive model parallelism ("sequential-model-parallel"), one after another with a
/// GPipe pipeline over all devices ("gpipe"), and FIFO and round-robin shard scheduling.
SimulationReport RunSimulation(const std::vector<TrialProfile>& trials,
                               const SimulationOptions& options, int micro_batches);

/// {"makespanSeconds", "lowerBoundSeconds", "utilization", "baselines": {NAME: seconds}}.
nlohmann::json SimulationJson(const SimulationReport& report);

/// Human-readable summary.
std::string FormatSimulation(const SimulationReport& report, const SimulationOptions& options);

/// Reads a profile file: {"linkBytesPerSecond": N, "trials": [{"name", "minibatches",
/// "tasks": [{"name", "computeSeconds", "transferBytes"}]}]}. INVALID_ARGUMENT naming the field.
StatusOr<std::vector<TrialProfile>> LoadProfileFile(const std::string& path,
                                                    double* link_bytes_per_second);

/// Early stopping in a simulation: cuts each trial's profile to the steps it reaches. With
/// `stopped_at` (a `hydra run` results.json: each trial's "steps", matched by name) the
/// measured steps; else at each rung a `stop_fraction` of the trials still training stops
/// (< 0: the job's own: ASHA 1 - 1/reductionFactor, median 0.5; ModelledStopSteps). Returns
/// the line saying what was modelled; empty when nothing stops (no earlyStopping, no file).
StatusOr<std::string> ModelEarlyStopping(const MultiModelJob& job, const std::vector<Trial>& trials,
                                         double stop_fraction, const std::string& stopped_at,
                                         std::vector<TrialProfile>* profiles);

/// Gantt chart of a schedule (one lane per device, one colour per trial) drawn with gnuplot.
Status DrawGantt(const Schedule& schedule, const std::vector<TrialProfile>& trials, int devices,
                 const std::string& png_path, const std::string& title);

}  // namespace hydra::cli
