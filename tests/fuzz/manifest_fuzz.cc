// Fuzz target: the manifest parser and the grid expansion (common/job.h), fed any bytes as a
// MultiModelJob manifest.

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/job.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto job = hydra::ParseJobYaml(text, "/hydra-fuzz/manifests");
  if (!job.ok()) {
    hydra::fuzz::Require(job.status().code() == hydra::StatusCode::kInvalidArgument,
                         "a refused manifest is INVALID_ARGUMENT: " + job.status().ToString());
    return 0;
  }
  // ParseJobYaml validates the expansion as well, so a manifest it accepts expands, and every
  // trial passes the rules an agent checks it by.
  auto trials = hydra::ExpandTrials(*job);
  hydra::fuzz::Require(trials.ok(), "an accepted manifest expands: " + trials.status().ToString());
  for (const auto& trial : *trials) {
    const hydra::Status valid = hydra::ValidateTrial(trial, "trial.");
    hydra::fuzz::Require(valid.ok(), "an expanded trial is valid: " + valid.ToString());
  }
  return 0;
}
