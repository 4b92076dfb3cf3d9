#pragma once

#include <memory>

#include "agent/executor/executor.h"

namespace hydra::executor {

/// Options of the in-memory executor.
struct InMemoryExecutorOptions {
  int threads = 0;  ///< intra-op threads for LibTorch; 0 keeps LibTorch's setting
  /// Device compute rate of the first estimate of a step (Admission::est_step_seconds).
  double flops_per_second = kDefaultFlopsPerSecond;
};

/// The plain executor: the whole model, its gradients and optimizer state stay in device
/// memory (one shard). Trials whose estimated footprint exceeds spec.resources.
/// deviceMemoryBudget are refused with RESOURCE_EXHAUSTED.
std::unique_ptr<ExecutorFactoryInterface> MakeInMemoryExecutorFactory(
    InMemoryExecutorOptions options = {});

}  // namespace hydra::executor
