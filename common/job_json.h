#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "common/job.h"

namespace hydra {

/// {"learningRate": 0.001, "batchSize": 8}: the grid's values of one trial, in grid order.
nlohmann::ordered_json HyperparametersJson(const Trial& trial);

/// A trial's full effective configuration (model, training, dataset) with manifest names.
nlohmann::json TrialConfigJson(const Trial& trial);

/// The model part of TrialConfigJson back as a ModelSpec (what a checkpoint records of its
/// model): family and the sizes; INVALID_ARGUMENT naming the key that is missing or of the
/// wrong type.
StatusOr<ModelSpec> ModelSpecFromJson(const nlohmann::json& model);

/// Stable 16-hex-digit fingerprint of TrialConfigJson: a checkpoint made for one configuration
/// is never resumed under another.
std::string TrialFingerprint(const Trial& trial);

nlohmann::json ParamValueJson(const ParamValue& value);

}  // namespace hydra
