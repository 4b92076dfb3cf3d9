#pragma once

#include <memory>

#include "agent/executor/executor.h"

namespace hydra::executor {

/// Options of the in-memory executor.
struct InMemoryExecutorOptions {
  int threads = 0;  ///< intra-op threads for LibTorch; 0 keeps LibTorch's setting
  /// Device compute rate of the first estimate of a step (Admission::est_step_seconds).
  double flops_per_second = kDefaultFlopsPerSecond;
  /// Where trials train: the whole model, its gradients and optimizer state on the device.
  ExecutorDevices devices = {};
  /// Attention as one fused kernel where LibTorch has one (FusedAttentionAvailable(): the
  /// CUDA build); off, the scores are kept for backward.
  bool fused_attention = true;
};

/// The plain executor: the whole model, its gradients and optimizer state stay in device
/// memory (one shard): on a GPU they are moved there once when the executor is built, and the
/// executor stays bound to that GPU. Trials whose estimated footprint exceeds spec.resources.
/// deviceMemoryBudget (on a GPU, by default, the device's memory) are refused with
/// RESOURCE_EXHAUSTED.
std::unique_ptr<ExecutorFactoryInterface> MakeInMemoryExecutorFactory(
    InMemoryExecutorOptions options = {});

}  // namespace hydra::executor
