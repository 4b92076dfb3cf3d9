#pragma once
// Torch-facing: include only from executor translation units.

#include <functional>

#include "agent/executor/hf_gpt2.h"
#include "agent/executor/layer_sequence.h"

namespace hydra::executor {

/// Overwrites layer `layer` of a gpt2 model of `spec` (BuildGpt2's sequence) with its tensors
/// from a Hugging Face checkpoint that CheckHfGpt2 accepted: F32, BF16 and F16 widened to
/// fp32, Conv1D weights transposed, the first contextLength positions of wpe. The file's pages
/// are read as each tensor is copied, so a model is loaded layer by layer (a spilled trial's
/// shard can leave memory before the next layer is read).
Status LoadHfGpt2Layer(const SafetensorsFile& file, const ModelSpec& spec, const LayerSequence& seq,
                       size_t layer);

/// A gpt2 model of `spec` started from spec.init's checkpoint (OpenHfGpt2): each layer is
/// built, overwritten with its tensors from the mapped file, then handed to `on_layer_built`,
/// so a caller that moves layers out of memory as they come (the spilling executor) never holds
/// the whole model, and the file's pages are read once, as each layer is copied.
StatusOr<LayerSequence> BuildHfGpt2(
    const ModelSpec& spec,
    const std::function<void(const LayerSequence&, size_t)>& on_layer_built = {});

}  // namespace hydra::executor
