#pragma once
// Torch-facing: include only from executor translation units.

#include <torch/torch.h>

#include <string>
#include <utility>
#include <vector>

#include "agent/executor/executor.h"
#include "common/status.h"

namespace hydra::executor {

/// Copies a CPU tensor's contiguous bytes into a NamedBuffer.
NamedBuffer TensorToBuffer(const std::string& name, const torch::Tensor& tensor);

/// Copies each target's buffer (matched by name) into the target tensor in place. Fails with
/// INVALID_ARGUMENT naming the first missing buffer, unknown buffer (unless `allow_extra`), or
/// shape/dtype mismatch; on failure no target has been modified.
Status CopyBuffersInto(const std::vector<NamedBuffer>& buffers,
                       const std::vector<std::pair<std::string, torch::Tensor>>& targets,
                       bool allow_extra = false);

}  // namespace hydra::executor
