#pragma once
// Torch-facing: include only from executor translation units.

#include <torch/torch.h>

namespace hydra::executor {

// Freeing a tensor's memory while its storage lives on (as FSDP frees parameters between
// forward and backward): an autograd graph that saved the tensor, or a view of it, keeps
// pointing at the same storage, which RefillStorage gives memory again before that graph's
// backward reads it. The version counter is untouched, so autograd accepts the refilled data.

/// Frees the memory of contiguous `t`'s storage (returned to its allocator; on a GPU, the
/// caching allocator keeps it from reuse until the streams recorded on it are done). `t` keeps
/// its sizes; its data may not be read until RefillStorage.
void FreeStorageInPlace(const torch::Tensor& t);

/// Whether `t` has elements but its storage no memory (FreeStorageInPlace).
bool StorageFreedInPlace(const torch::Tensor& t);

/// Gives `t`'s freed storage fresh, uninitialised memory for its elements, from the allocator
/// it came from (on a GPU, on the current stream). Write it through `t.variable_data()`, which
/// shares the storage but not the version counter.
void RefillStorage(const torch::Tensor& t);

}  // namespace hydra::executor
