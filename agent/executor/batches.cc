#include "agent/executor/batches.h"

namespace hydra::executor {

torch::Tensor TokenWindows(const TokenDataset& data, const std::vector<int64_t>& offsets,
                           int64_t window) {
  auto t = torch::empty({static_cast<int64_t>(offsets.size()), window}, torch::kLong);
  int64_t* p = t.data_ptr<int64_t>();
  for (size_t i = 0; i < offsets.size(); ++i) data.Read(offsets[i], window, p + i * window);
  return t;
}

Batch MakeBatch(const TokenDataset& data, const Trial& trial, const std::vector<int64_t>& offsets) {
  const int64_t window = SampleWindow(trial);
  auto w = TokenWindows(data, offsets, window);
  if (!IsImageTask(trial)) {
    const int64_t T = window - 1;
    return {w.narrow(1, 0, T), w.narrow(1, 1, T)};
  }
  const auto& shape = trial.dataset.image_shape;
  auto pixels = w.narrow(1, 1, window - 1)
                    .to(torch::kFloat)
                    .div_(255.0)
                    .sub_(0.5)
                    .div_(0.25)
                    .reshape({w.size(0), shape[0], shape[1], shape[2]});
  return {pixels, w.select(1, 0).contiguous()};
}

Batch TrainBatch(const TokenDataset& data, const Trial& trial, int64_t step) {
  const auto& tr = trial.training;
  return MakeBatch(data, trial,
                   TrainWindowOffsets(data, tr.seed, step, tr.batch_size, SampleWindow(trial)));
}

std::vector<Batch> ValidationSamples(const TokenDataset& data, const Trial& trial) {
  const size_t micro =
      static_cast<size_t>(trial.training.batch_size / trial.training.gradient_accumulation_steps);
  const auto offsets =
      ValidationWindowOffsets(data, trial.dataset.eval_sequences, SampleWindow(trial));
  std::vector<Batch> batches;
  for (size_t begin = 0; begin < offsets.size(); begin += micro) {
    const size_t end = std::min(offsets.size(), begin + micro);
    batches.push_back(MakeBatch(data, trial, {offsets.begin() + begin, offsets.begin() + end}));
  }
  return batches;
}

torch::Tensor TaskLoss(const Trial& trial, const torch::Tensor& output,
                       const torch::Tensor& target) {
  // The loss (and its log-softmax) in fp32 whatever the precision the output was computed in.
  const torch::Tensor out = output.to(torch::kFloat);
  if (IsImageTask(trial)) return torch::nn::functional::cross_entropy(out, target);
  return NextTokenLoss(out, target);
}

torch::Tensor LayersLoss(const Trial& trial, const LayerSequence& model, size_t first, size_t last,
                         torch::Tensor input, const torch::Tensor& target) {
  for (size_t i = first; i < last; ++i) input = model.layers[i]->forward(input);
  auto fused = model.layers[last]->forward_loss(input, target);
  if (fused.defined()) return fused;
  return TaskLoss(trial, model.layers[last]->forward(input), target);
}

torch::Tensor NextTokenLoss(const torch::Tensor& logits, const torch::Tensor& targets) {
  return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}),
                                              targets.reshape({-1}));
}

}  // namespace hydra::executor
