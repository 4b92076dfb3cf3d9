#pragma once
// Torch-free entry points to the TorchScript loader (agent/executor/torchscript.cc), for code
// that must not compile LibTorch's headers.

#include <string>
#include <vector>

#include "agent/executor/executor.h"
#include "common/job.h"
#include "common/status.h"

namespace hydra::executor {

/// Fills trial->model.layers from the module (parameters and output size of each child) so the
/// cost model and the partitioner can plan it; a no-op for the built-in families.
Status ResolveModel(Trial* trial);

/// Loads the module of `spec`, puts the weights of an executor's ExportState (a checkpoint's
/// buffers) into it and writes them as SaveStateDictForPython does.
Status WriteStateDictFromState(const ModelSpec& spec, const std::vector<NamedBuffer>& state,
                               const std::string& path);

}  // namespace hydra::executor
