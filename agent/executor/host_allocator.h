#pragma once

namespace hydra::executor {

/// Makes glibc's malloc keep freed memory for reuse instead of handing it back to the kernel:
/// no mmap for large blocks (each would be unmapped on free and page-faulted in again, zeroed,
/// on the next step: LibTorch frees and reallocates every activation, cast and gradient buffer
/// each step) and no trimming of the heap's top below 2 GiB. The CPU counterpart of a GPU
/// caching allocator: measured on GPT-2 small here, +9% tokens/s in fp32 and +25% in bf16.
/// Resident memory then stays at the step's peak; executors whose trial has a host memory
/// budget still return it after every shard (malloc_trim). Process-wide and idempotent.
void KeepFreedHostMemory();

}  // namespace hydra::executor
