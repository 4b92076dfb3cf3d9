#include "agent/executor/batches.h"

namespace hydra::executor {

torch::Tensor TokenWindows(const TokenDataset& data, const std::vector<int64_t>& offsets,
                           int64_t window) {
  auto t = torch::empty({static_cast<int64_t>(offsets.size()), window}, torch::kLong);
  int64_t* p = t.data_ptr<int64_t>();
  for (size_t i = 0; i < offsets.size(); ++i) data.Read(offsets[i], window, p + i * window);
  return t;
}

torch::Tensor NextTokenLoss(const torch::Tensor& logits, const torch::Tensor& targets) {
  return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}),
                                              targets.reshape({-1}));
}

}  // namespace hydra::executor
