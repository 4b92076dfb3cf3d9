#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/local_runner.h"
#include "common/status.h"

namespace hydra::cli {

/// One trial as results.json lists it: name, hyperparameters, state, finalTrainLoss,
/// finalValLoss, steps, tokensPerSecond, wallSeconds, shards, peakDeviceBytes and the curves.
nlohmann::ordered_json TrialResultJson(const TrialResult& r);

/// result.json of one finished trial (with the configuration's fingerprint), atomically.
Status WriteTrialResultFile(const std::string& path, const TrialResult& r,
                            const std::string& fingerprint);
/// Reads WriteTrialResultFile's output back into a result for `trial`.
StatusOr<TrialResult> ReadTrialResultFile(const std::string& path, const Trial& trial,
                                          std::string* fingerprint);

/// Writes results.json and results.csv (ranked best first) into `output_dir`.
Status WriteResults(const std::string& output_dir, const std::string& job,
                    const std::vector<TrialResult>& ranked);

/// Draws loss.png (training loss, smoothed, and validation loss per trial) with gnuplot.
/// UNAVAILABLE if gnuplot is not installed.
Status PlotLossCurves(const std::string& output_dir, const std::vector<TrialResult>& ranked);

/// The ranked table printed at the end of `hydra run`.
std::string FormatRankedTable(const std::vector<TrialResult>& ranked);

}  // namespace hydra::cli
