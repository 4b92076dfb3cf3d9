#pragma once
// What the Python training references (tests/python/train_reference.py, hf_reference.py) read
// to train exactly as a manifest's first trial does.

#include <gtest/gtest.h>

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

}  // namespace hydra::fakes
