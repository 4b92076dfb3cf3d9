#include "agent/executor/batches.h"

namespace hydra::executor {

torch::Tensor TokenWindows(const TokenDataset& data, const std::vector<int64_t>& offsets,
                           int64_t window) {
  auto t = torch::empty({static_cast<int64_t>(offsets.size()), window}, torch::kLong);
  int64_t* p = t.data_ptr<int64_t>();
  for (size_t i = 0; i < offsets.size(); ++i) data.Read(offsets[i], window, p + i * window);
  return t;
}

std::vector<torch::Tensor> ValidationBatches(const TokenDataset& data, const Trial& trial) {
  const int64_t window = trial.model.context_length + 1;
  const size_t micro =
      static_cast<size_t>(trial.training.batch_size / trial.training.gradient_accumulation_steps);
  const auto offsets = ValidationWindowOffsets(data, trial.dataset.eval_sequences, window);
  std::vector<torch::Tensor> batches;
  for (size_t begin = 0; begin < offsets.size(); begin += micro) {
    const size_t end = std::min(offsets.size(), begin + micro);
    batches.push_back(TokenWindows(data, {offsets.begin() + begin, offsets.begin() + end}, window));
  }
  return batches;
}

torch::Tensor NextTokenLoss(const torch::Tensor& logits, const torch::Tensor& targets) {
  return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}),
                                              targets.reshape({-1}));
}

}  // namespace hydra::executor
