#pragma once
// Torch-facing: include only from executor translation units.

#include <functional>
#include <string>
#include <vector>

#include "agent/executor/executor.h"
#include "agent/executor/layer_sequence.h"
#include "agent/executor/model_loader.h"
#include "common/job.h"
#include "common/status.h"

namespace hydra::executor {

/// Loads spec.model.path (a module saved with torch.jit.save) as a layer sequence: its
/// top-level children, in order, each a layer; parameters shared between children are owned by
/// the first and lent to the later ones. Checked before anything trains, each a clear error
/// naming the file: missing or unreadable, not a TorchScript archive, saved by an incompatible
/// PyTorch, no children, children that do not reproduce the module's own forward (not
/// sequential), non-fp32 parameters, or an operation without a gradient (found by one forward
/// and backward on a sample batch of token ids).
StatusOr<LayerSequence> LoadTorchScript(const ModelSpec& spec);

/// The trial's model as a layer sequence: GPT-2 built and initialised from training.seed, or
/// the TorchScript module loaded with its saved weights. `on_layer_built(seq, i)` runs after
/// layer i exists (for a loaded module, after loading, for each layer in order).
StatusOr<LayerSequence> BuildModel(
    const Trial& trial,
    const std::function<void(const LayerSequence&, size_t)>& on_layer_built = {});

/// Writes the model's parameters as a state dict that Python's torch.load reads
/// (`model.load_state_dict(torch.load(path))`): names as the module's own
/// (`0.weight`, `blocks.1.attn.qkv.bias`), written atomically.
Status SaveStateDictForPython(const LayerSequence& model, const std::string& path);

}  // namespace hydra::executor
