#include "agent/executor/executor.h"

#include <utility>

namespace hydra::executor {

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}

Status CheckModelAndData(const Trial& trial, const TokenDataset& data) {
  const std::string& f = trial.model.family;
  if (f != "gpt2" && f != "torchscript" && f != "mlp" && f != "resnet") {
    return InvalidArgumentError("spec.model.family: unsupported family '" + f + "'");
  }
  const bool images = IsImageTask(trial);
  const int64_t limit = images ? trial.model.num_classes : trial.model.vocab_size;
  if (data.max_token() >= limit) {
    return InvalidArgumentError(
        "spec.dataset.path: " + data.path() + (images ? " holds label " : " holds token id ") +
        std::to_string(data.max_token()) +
        (images ? ", outside the model's classes (spec.model.numClasses = "
                : ", outside the model's vocabulary (spec.model.vocabSize = ") +
        std::to_string(limit) + ")");
  }
  return OkStatus();
}

Status ExecutorFactoryInterface::Check(const Trial& trial, const TokenDataset& data) {
  return Admit(trial, data).status();
}

StatusOr<std::unique_ptr<TrialExecutorInterface>> ExecutorFactoryInterface::Create(
    const Trial& trial, std::shared_ptr<const TokenDataset> data) {
  ASSIGN_OR_RETURN(Admission admission, Admit(trial, *data));
  return Build(trial, std::move(data), admission);
}

}  // namespace hydra::executor
