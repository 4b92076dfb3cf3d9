#include "agent/executor/window_eval.h"

#include <torch/torch.h>

#include <algorithm>
#include <vector>

#include "agent/executor/executor.h"
#include "agent/executor/torchscript.h"

namespace hydra::executor {

StatusOr<WindowLoss> EvaluateWindows(const Trial& trial, const TokenDataset& data, int64_t batch) {
  RETURN_IF_ERROR(CheckModelAndData(trial, data));
  const int64_t T = trial.model.context_length, window = T + 1;
  WindowLoss out;
  out.windows = data.num_tokens() / window;
  out.dropped = data.num_tokens() % window;
  if (out.windows == 0) {
    return InvalidArgumentError(
        data.path() + " holds " + std::to_string(data.num_tokens()) +
        " tokens, fewer than one window of contextLength + 1 = " + std::to_string(window));
  }
  ASSIGN_OR_RETURN(LayerSequence model, BuildModel(trial));
  try {
    torch::NoGradGuard no_grad;
    double sum = 0;
    std::vector<int64_t> tokens;
    for (int64_t first = 0; first < out.windows; first += batch) {
      const int64_t n = std::min(batch, out.windows - first);
      tokens.resize(static_cast<size_t>(n * window));
      data.Read(first * window, n * window, tokens.data());
      const auto w = torch::from_blob(tokens.data(), {n, window}, torch::kLong);
      const auto logits = model.Forward(w.narrow(1, 0, T).contiguous());
      const auto targets = w.narrow(1, 1, T).reshape({-1});
      sum += torch::nn::functional::cross_entropy(
                 logits.reshape({n * T, -1}).to(torch::kFloat), targets,
                 torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
                 .item<double>();
    }
    out.tokens = out.windows * T;
    out.loss = sum / static_cast<double>(out.tokens);
    return out;
  } catch (const c10::Error& e) {
    return InternalError("evaluating " + trial.name + ": " + e.what_without_backtrace());
  }
}

}  // namespace hydra::executor
