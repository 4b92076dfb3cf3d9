#pragma once
// Torch-free entry points to the TorchScript loader (agent/executor/torchscript.cc), for code
// that must not compile LibTorch's headers.

#include <functional>
#include <string>
#include <vector>

#include "agent/executor/executor.h"
#include "common/job.h"
#include "common/status.h"

namespace hydra::executor {

/// Told, a line at a time, what loading a model does that takes a while.
using ModelNote = std::function<void(const std::string&)>;

/// "<program>: <line>" on stderr ("hydra: ...", "hydra-agent: ...").
void NoteToStderr(const std::string& line);

/// Fills trial->model.layers from the module (each child's parameters, output size, buffers and
/// training memory measured on the CPU in the trial's precision: ModuleLayer::memory) so the cost
/// model and the partitioner can plan it; for a gpt2 model with spec.model.init, checks the
/// checkpoint against the model (OpenHfGpt2); a no-op for the other built-in families. The
/// measures are kept per file, shape and precision for the process's life, fp32's also serving a
/// bf16 trial (which measures bf16 beside it): trials of one model, even started at once from
/// several threads, measure it once. `note` hears when a measure starts and how long it took.
Status ResolveModel(Trial* trial, const ModelNote& note = NoteToStderr);

/// Loads the module of `spec`, puts the weights of an executor's ExportState (a checkpoint's
/// buffers) into it and writes them as SaveStateDictForPython does.
Status WriteStateDictFromState(const ModelSpec& spec, const std::vector<NamedBuffer>& state,
                               const std::string& path);

/// Whether WriteModelFiles writes anything for the trial's family.
bool HasModelFiles(const Trial& trial);

/// A finished trial's weights (an executor's ExportState) where their users read them, in
/// `dir` (the trial's checkpoint directory): family torchscript, a state dict for Python's
/// torch.load as model.pt; gpt2, model.safetensors and config.json that Hugging Face
/// transformers loads (WriteHfGpt2); nothing for the image classifiers.
Status WriteModelFiles(const Trial& trial, const std::vector<NamedBuffer>& state,
                       const std::string& dir);

}  // namespace hydra::executor
