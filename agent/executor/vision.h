#pragma once
// Torch-facing: include only from executor translation units.

#include <cstdint>
#include <functional>

#include "agent/executor/layer_sequence.h"
#include "common/job.h"

namespace hydra::executor {

/// An MLP image classifier as a layer sequence: "input" (flatten, Linear to nEmbd, ReLU),
/// nLayer "hidden<i>" layers (Linear nEmbd -> nEmbd, ReLU) and "head" (Linear to numClasses).
/// He-initialised from `seed`, zero biases. `on_layer_built` as for BuildGpt2.
LayerSequence BuildMlp(
    const ModelSpec& spec, const std::vector<int64_t>& image_shape, uint64_t seed,
    const std::function<void(const LayerSequence&, size_t)>& on_layer_built = {});

/// A small ResNet image classifier: "stem" (3x3 convolution to nEmbd channels, GroupNorm,
/// ReLU), nLayer "block<i>" residual blocks (two 3x3 convolutions with GroupNorm; the second
/// block of every third halves the resolution with stride 2 and a 1x1 shortcut), and "head"
/// (global average pool, Linear to numClasses). GroupNorm, not BatchNorm: a layer's output
/// depends on its own sample only and the model has no running statistics outside its
/// parameters, so micro-batches, shards and checkpoints stay exact.
LayerSequence BuildResNet(
    const ModelSpec& spec, const std::vector<int64_t>& image_shape, uint64_t seed,
    const std::function<void(const LayerSequence&, size_t)>& on_layer_built = {});

}  // namespace hydra::executor
