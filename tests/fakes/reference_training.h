#pragma once
// What the Python training references (tests/python/train_reference.py, hf_reference.py) read
// to train exactly as a manifest's first trial does.

#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>

#include "agent/executor/dataset.h"
#include "common/job.h"

namespace hydra::fakes {

/// The first trial of the manifest at `manifest_path`: its windows for steps [0, steps) from
/// Hydra's own TrainWindowOffsets, the context length, and its AdamW settings, as
/// {"offsets", "context", "lr", "weight_decay", "beta1", "beta2", "eps"}. Fails the test (and
/// returns null) if the manifest or its dataset does not load.
inline nlohmann::json ReferenceTraining(const std::string& manifest_path, int steps) {
  auto job = LoadJobFile(manifest_path);
  EXPECT_TRUE(job.ok()) << job.status();
  if (!job.ok()) return nullptr;
  auto trials = ExpandTrials(*job);
  EXPECT_TRUE(trials.ok()) << trials.status();
  if (!trials.ok()) return nullptr;
  const Trial& t = trials->front();
  const int64_t window = t.model.context_length + 1;
  auto data = executor::TokenDataset::Open(t.dataset, window);
  EXPECT_TRUE(data.ok()) << data.status();
  if (!data.ok()) return nullptr;
  nlohmann::json offsets = nlohmann::json::array();
  for (int s = 0; s < steps; ++s) {
    offsets.push_back(
        executor::TrainWindowOffsets(**data, t.training.seed, s, t.training.batch_size, window));
  }
  const auto& tr = t.training;
  return {{"offsets", offsets},     {"context", t.model.context_length},
          {"lr", tr.learning_rate}, {"weight_decay", tr.weight_decay},
          {"beta1", tr.beta1},      {"beta2", tr.beta2},
          {"eps", tr.epsilon}};
}

/// A `hydra run` trial's per-step training losses (its results.json entry's trainLoss) each
/// within `relative` of the reference's (a JSON list of one loss per step), step for step.
inline void ExpectLossesTrack(const nlohmann::json& trial, const nlohmann::json& reference,
                              double relative) {
  ASSERT_EQ(trial["trainLoss"].size(), reference.size());
  for (size_t s = 0; s < reference.size(); ++s) {
    const double ours = trial["trainLoss"][s][1], theirs = reference[s];
    EXPECT_LE(std::abs(ours - theirs), relative * std::abs(theirs))
        << "step " << s << ": " << ours << " in hydra, " << theirs << " in the reference";
  }
}

}  // namespace hydra::fakes
