#pragma once

#include <memory>
#include <optional>
#include <string>

#include "agent/executor/executor.h"

namespace hydra::executor {

struct ExecutorOptions {
  int threads = 0;        ///< CPU threads for training; 0 keeps LibTorch's setting
  std::string spill_dir;  ///< where the disk tier keeps shard files (SpillFolderStem)
  /// Device compute rate used to choose between stashing and recomputing activations, where
  /// shards' optimizers step, and the shards' estimated seconds.
  double flops_per_second = kDefaultFlopsPerSecond;
  /// The same for bf16 trials; 0: flops_per_second.
  double bf16_flops_per_second = 0;
  /// Device <-> host bandwidth; 0: the device is the CPU, so host and device share RAM.
  double host_link_bytes_per_second = 0;
  /// Rate of the fused host optimizer (bytes of weights, gradients and state streamed per
  /// second); 0: unknown, the optimizer steps on the device.
  double host_optimizer_bytes_per_second = 0;
  /// Overrides where sharded trials' optimizers step (common/partitioner.h); unset: by cost.
  std::optional<OptimizerPlacement> optimizer_placement;
  /// Issue 18 item 2: on a GPU, a bf16 trial's shards whose optimizer steps on the host send
  /// the weights of their matrix products (Linear and Conv2d weights, which autocast casts to
  /// bf16 anyway) to the device as bf16, cast on the host: half those weights' copy
  /// traffic, with the same numbers as autocast's own cast (the gradients come back and are
  /// accumulated in fp32). Off by default: it did not pay on an H200 (bench/RESULTS.md, GPU
  /// check: GPT-2 medium's shape at 25%, host-stepped, 5602 tokens/s with it against 6306
  /// without; the cast on the host costs more than the halved copy saves on a 55 GB/s link).
  bool bf16_weight_transit = false;
  /// May plans recompute attention scores in backward (PartitionOptions::attention_recompute)?
  bool attention_recompute = true;
  /// Attention as one fused kernel where LibTorch has one (FusedAttentionAvailable(): the CUDA
  /// build; PartitionOptions::fused_attention)? Off: kept or recomputed as planned.
  bool fused_attention = true;
  /// On a discrete device, may shards keep their forward graphs in its memory until their
  /// backward (PartitionOptions::stash_on_device)? Off: every shard but the last recomputes
  /// its forward.
  bool device_stash = true;
  /// With device_stash and a measured host link, may shards offload their forward graphs to
  /// host memory and back instead of recomputing them (PartitionOptions::activation_offload)?
  bool activation_offload = true;
  /// On a discrete device, may plans recompute GPT-2 blocks' LayerNorm and GELU outputs in
  /// backward (PartitionOptions::selective_recompute)?
  bool selective_recompute = true;
  /// On a discrete device with a measured host link, may plans keep some shards' weights and
  /// optimizer state on the device between steps where the link cannot carry every shard's
  /// state up and back within a step (PartitionOptions::resident_state)?
  bool resident_state = true;
  /// On a discrete device with a measured host link, may the inputs recomputing shards keep
  /// for their backward wait in host memory (PartitionOptions::checkpoint_offload)?
  bool checkpoint_offload = true;
  /// On a discrete device with the state in host memory (and no global clipping), may a
  /// spilled shard stay on the device longer than its plan fetches it where the last steps'
  /// device memory shows room for it (agent/executor/lookahead.h): its weights kept from its
  /// forward to its backward, its backward's upload begun while the link is idle, the shard
  /// kept across the step's end for its next forward.
  bool lookahead = true;
  /// Where trials train (Build's `device` indexes these); empty: one CPU device.
  ExecutorDevices devices = {};
};

/// The partitioner's options for `trial` (its device budget set: WithDeviceBudget) as the
/// factory's executors plan it: the options' rates (bf16's for a bf16 trial), their optimizer
/// override where the state is in the host tier, their attention, and on a discrete device the
/// GPU's plan choices (graphs stashed on the device, offloads, selective recompute, resident
/// shards). `hydra plan` plans with these, so its plans are the ones `hydra run` trains.
PartitionOptions ExecutorPartitionOptions(const Trial& trial, const ExecutorOptions& options);

/// The start of the folder below `spill_dir` where an executor of `trial` keeps its spill files:
/// <spill_dir>/<namespace>_<trial name> (the trial's name alone where it has no namespace:
/// `hydra run`). Each executor's disk tier adds a suffix of its own (DiskTier::Folder::kUnique),
/// so two executors never share files, whatever their trials' names.
std::string SpillFolderStem(const std::string& spill_dir, const Trial& trial);

/// The executor factory `hydra run` and the agent use. Plans each trial's shards against
/// spec.resources.deviceMemoryBudget (partitioner in common/partitioner.h): a trial that fits
/// with its state in host memory trains on the plain in-memory executor (no recompute, no
/// copies); otherwise on the shard-spilling executor, which moves shards between the device,
/// host and disk tiers, prefetching the next shard while one computes, and steps each shard's
/// optimizer right after its backward. Per-step losses equal unsharded training's.
std::unique_ptr<ExecutorFactoryInterface> MakeExecutorFactory(ExecutorOptions options);

}  // namespace hydra::executor
