#include "agent/executor/executor.h"

namespace hydra::executor {

Status CheckModelAndData(const Trial& trial, const TokenDataset& data) {
  if (trial.model.family != "gpt2" && trial.model.family != "torchscript") {
    return InvalidArgumentError("spec.model.family: unsupported family '" + trial.model.family +
                                "'");
  }
  if (data.max_token() >= trial.model.vocab_size) {
    return InvalidArgumentError("spec.dataset.path: " + data.path() + " holds token id " +
                                std::to_string(data.max_token()) +
                                ", outside the model's vocabulary (spec.model.vocabSize = " +
                                std::to_string(trial.model.vocab_size) + ")");
  }
  return OkStatus();
}

}  // namespace hydra::executor
