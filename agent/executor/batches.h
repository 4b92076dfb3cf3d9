#pragma once
// Torch-facing: include only from executor translation units.

#include <torch/torch.h>

#include <vector>

#include "agent/executor/dataset.h"

namespace hydra::executor {

/// [offsets.size(), window] int64 tensor of the dataset's token windows starting at `offsets`.
torch::Tensor TokenWindows(const TokenDataset& data, const std::vector<int64_t>& offsets,
                           int64_t window);

/// Mean next-token cross-entropy of `logits` [batch, time, vocab] against `targets` [batch, time].
torch::Tensor NextTokenLoss(const torch::Tensor& logits, const torch::Tensor& targets);

}  // namespace hydra::executor
