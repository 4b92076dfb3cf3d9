#pragma once
// Torch-facing: include only from executor translation units.

#include <torch/torch.h>

#include <vector>

#include "agent/executor/dataset.h"

namespace hydra::executor {

/// [offsets.size(), window] int64 tensor of the dataset's token windows starting at `offsets`.
torch::Tensor TokenWindows(const TokenDataset& data, const std::vector<int64_t>& offsets,
                           int64_t window);

/// The fixed validation windows of `trial` (ValidationWindowOffsets, `window` = contextLength + 1)
/// as [n, window] tensors of at most one micro-batch each: every executor evaluates the same
/// chunks, so sharded and unsharded validation losses agree.
std::vector<torch::Tensor> ValidationBatches(const TokenDataset& data, const Trial& trial);

/// Mean next-token cross-entropy of `logits` [batch, time, vocab] against `targets` [batch, time].
torch::Tensor NextTokenLoss(const torch::Tensor& logits, const torch::Tensor& targets);

}  // namespace hydra::executor
