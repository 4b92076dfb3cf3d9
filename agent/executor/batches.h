#pragma once
// Torch-facing: include only from executor translation units.

#include <torch/torch.h>

#include <vector>

#include "agent/executor/dataset.h"
#include "agent/executor/layer_sequence.h"

namespace hydra::executor {

/// [offsets.size(), window] int64 tensor of the dataset's token windows starting at `offsets`.
torch::Tensor TokenWindows(const TokenDataset& data, const std::vector<int64_t>& offsets,
                           int64_t window);

/// Mean next-token cross-entropy of `logits` [batch, time, vocab] against `targets` [batch, time].
torch::Tensor NextTokenLoss(const torch::Tensor& logits, const torch::Tensor& targets);

/// What a model trains on, for either task: token windows (input [B, T] ids, target [B, T] the
/// next ids) or images (input [B, C, H, W] floats, target [B] labels).
struct Batch {
  torch::Tensor input, target;
  int64_t size() const { return input.size(0); }
  /// Samples [begin, begin + n): one micro-batch.
  Batch Slice(int64_t begin, int64_t n) const {
    return {input.narrow(0, begin, n), target.narrow(0, begin, n)};
  }
};

/// The samples starting at `offsets` (TrainWindowOffsets / ValidationWindowOffsets) as a batch.
/// Pixels are scaled to (p / 255 - 0.5) / 0.25.
Batch MakeBatch(const TokenDataset& data, const Trial& trial, const std::vector<int64_t>& offsets);

/// The whole batch of optimizer step `step` (all micro-batches).
Batch TrainBatch(const TokenDataset& data, const Trial& trial, int64_t step);

/// The fixed validation samples (ValidationWindowOffsets) as batches of at most one micro-batch
/// each: every executor evaluates the same chunks, so sharded and unsharded validation losses
/// agree.
std::vector<Batch> ValidationSamples(const TokenDataset& data, const Trial& trial);

/// The trial's loss: next-token cross-entropy, or cross-entropy of class logits [B, classes].
torch::Tensor TaskLoss(const Trial& trial, const torch::Tensor& output,
                       const torch::Tensor& target);

/// The trial's loss of `layers` [first, last] of `model` on `input`: forward through them, the
/// last layer's forward_loss when it has one, else its forward and TaskLoss.
torch::Tensor LayersLoss(const Trial& trial, const LayerSequence& model, size_t first, size_t last,
                         torch::Tensor input, const torch::Tensor& target);

}  // namespace hydra::executor
