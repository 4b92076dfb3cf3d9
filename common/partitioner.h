#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/cost_model.h"
#include "common/job.h"
#include "common/status.h"

namespace hydra {

/// How a shard's activations survive from its forward to its backward.
enum class ActivationPolicy {
  kStash,      ///< keep the forward's autograd graph in the host tier (Harmony): no recompute
  kRecompute,  ///< keep only the shard's input and recompute its forward in backward (Hydra)
  /// A discrete device: copy the forward's saved activations to the host tier on the
  /// write-back stream as the next shards compute, free their device memory, and copy them back
  /// for the backward beside the next shard's backward (activation offload): no recompute, and
  /// the graph holds device memory only while its copies run.
  kOffload,
};
const char* ActivationPolicyName(ActivationPolicy p);

/// Where a shard's optimizer steps. kDevice: its state moves to the device with the shard's
/// weights and back. kHost (ZeRO-Offload, Harmony): the state stays in the host tier, the
/// gradients go down and the host's fused optimizer updates the host copy of the weights,
/// which go up at the next fetch; the device never holds the optimizer state.
enum class OptimizerPlacement { kDevice, kHost };
const char* OptimizerPlacementName(OptimizerPlacement p);
/// The --optimizer flag of hydra run, hydra-agent and bench/spill: "auto" (unset: the cost model
/// chooses), "device" or "host". INVALID_ARGUMENT naming the choices for anything else.
StatusOr<std::optional<OptimizerPlacement>> ParseOptimizerFlag(const std::string& value);
/// The flag's values, for CLI11's IsMember in every binary that takes it.
inline const std::vector<std::string> kOptimizerFlagChoices = {"auto", "device", "host"};
/// The flag's help, the same in every binary that takes it.
inline constexpr const char* kOptimizerFlagHelp =
    "Where spilled trials' optimizers step: auto (the cost model, from the pilot's measured host "
    "link and host AdamW rate; on a CPU device: the device; the host where a trial fits the "
    "device budget no other way), device (the state moves with its "
    "shard), host (ZeRO-Offload: the state stays in host memory and the host's fused AdamW steps "
    "it, so the device budget holds larger shards); trials that fit the device unsharded, and "
    "those whose state is on disk, step on the device";

/// One shard: a contiguous range of layers and what it needs on the device.
struct ShardPlan {
  int first_layer = 0;  ///< index into ModelLayerCosts
  int last_layer = 0;   ///< inclusive
  std::string first_name, last_name;
  int64_t parameters = 0;
  int64_t state_bytes = 0;       ///< weights + optimizer state: what moves between tiers
  int64_t gradient_bytes = 0;    ///< exist on the device only during the shard's backward
  int64_t activation_bytes = 0;  ///< one micro-batch's autograd activations of the shard
  double forward_flops = 0;      ///< per micro-batch
  /// Forward FLOPs the backward repeats to rebuild attention scores (PartitionPlan::attention
  /// kRecomputed), per micro-batch; 0 otherwise.
  double attention_flops = 0;
  /// Forward FLOPs (in matrix-product FLOPs) the backward spends computing LayerNorm and GELU
  /// outputs again (PartitionPlan::selective_recompute), per micro-batch; 0 otherwise.
  double recompute_flops = 0;
  ActivationPolicy policy = ActivationPolicy::kStash;
  OptimizerPlacement optimizer = OptimizerPlacement::kDevice;
  /// A shard that recomputes (after one that recomputes too): the input it keeps for its
  /// backward waits in host memory instead of on the device (PartitionOptions::
  /// checkpoint_offload), copied out after its forward and back beside the backward after it.
  bool input_offloaded = false;
  /// Its weights and optimizer state stay on the device from their first upload on, across
  /// steps (PartitionOptions::resident_state): its optimizer steps there and nothing of its
  /// state crosses the host link in a step. Its state counts against the budget all step.
  bool resident = false;
  /// Forward + backward (+ recompute) of a whole step, and a spilled shard's
  /// kShardOverheadSeconds.
  double estimated_seconds = 0;
  /// Device bytes of the shard's compute beyond its state and gradients: its activations and
  /// the boundary activations of every micro-batch.
  int64_t workspace_bytes = 0;
  /// What the backward frees of workspace + gradients before its peak: autograd frees each
  /// layer's activations once its backward has run, while the layers before it still make
  /// their gradients (with one micro-batch; 0 with more). The backward's device bytes beyond
  /// the state are workspace_bytes + gradient_bytes less this.
  int64_t backward_freed_bytes = 0;
};

/// Where shards' state lives when they are not on the device.
enum class StateTier { kHost, kDisk };

/// The device compute rate assumed until one is measured (the pilot): 100 GFLOP/s.
inline constexpr double kDefaultFlopsPerSecond = 1.0e11;

/// What a shard of a spilled plan costs a step beyond its compute: the host's work for its
/// fetches, copies and evictions (on a GPU, some hundred CUDA calls), and the pipeline's
/// ramp at its edges. A guess, not a measurement; it keeps plans from cutting a model into
/// many shards for a sliver less recompute.
inline constexpr double kShardOverheadSeconds = 1e-3;

struct PartitionOptions {
  int64_t device_budget = 0;             ///< bytes; <= 0: unlimited (one shard)
  std::vector<int> explicit_boundaries;  ///< first layer index of shards 1..n-1; overrides
  StateTier state_tier = StateTier::kHost;
  /// Bandwidths that decide stash vs recompute: bytes/s between device and host, and the
  /// device's compute rate in FLOP/s. On a CPU device host<->device is free (same RAM).
  double host_link_bytes_per_second = 0;  ///< 0: infinite
  double flops_per_second = kDefaultFlopsPerSecond;
  /// Host memory bandwidth the fused host optimizer streams at (bytes/s); 0: unknown, so the
  /// optimizer steps on the device.
  double host_optimizer_bytes_per_second = 0;
  /// Overrides the cost model's choice of where the optimizer steps (tests; operators).
  std::optional<OptimizerPlacement> optimizer_placement;
  int64_t micro_batches = 1;
  /// Host bytes that stashed activations may use (with the state on disk, also the weights
  /// their autograd graphs hold); above it shards recompute instead. < 0: unlimited.
  int64_t host_activation_budget = -1;
  /// May the plan recompute the attention scores in backward (keeping q, k and v, not the
  /// H x T scores; agent/executor/attention.h) where that makes the step's estimated compute
  /// shorter or is the only way the trial fits? Off: every layer keeps its activations.
  bool attention_recompute = true;
  /// The executor runs attention as one fused kernel that keeps no scores (AttentionMemory::
  /// kFused: LibTorch 2.1+, the CUDA build): every plan counts that, and attention_recompute
  /// has nothing left to choose.
  bool fused_attention = false;
  /// The device has memory of its own (a GPU): a shard that stashes keeps its forward's
  /// autograd graph in device memory until its backward while its weights' memory is freed
  /// (and filled again, in place, for the backward), so its activations count against the
  /// device budget and host_activation_budget does not apply. The plan then stashes the shards
  /// whose forwards it can keep, packing the layers into the shards that recompute least. With
  /// the state on disk every shard but the last recomputes. Off: stashed graphs live in the
  /// host tier (a CPU device, whose memory is the host's).
  bool stash_on_device = false;
  /// With stash_on_device and a known host link: shards that can keep their graphs neither on
  /// the device nor recompute them may offload them to host memory (ActivationPolicy::kOffload)
  /// where the link copies them out before the backward begins and in beside the backward.
  bool activation_offload = false;
  /// May the plan recompute GPT-2 blocks' LayerNorm and GELU outputs in backward instead of
  /// keeping them (agent/executor/selective_recompute.h: 10 values of the width a token kept
  /// instead of 16) where the estimated step is shorter that way or the trial fits no other way?
  bool selective_recompute = false;
  /// With stash_on_device, the state in the host tier, a known host link and the optimizer on
  /// the device: may the plan keep some shards' state on the device between steps
  /// (ShardPlan::resident) where the link cannot carry every shard's weights and optimizer
  /// state up and back within the step's compute? Each resident shard's state then takes the
  /// budget all step (smaller shards for the rest, or more recompute): the plan keeps the
  /// shards whose residency shortens the estimated step (EstimatedStepSeconds with the link).
  bool resident_state = false;
  /// With stash_on_device and a known host link: may the inputs that recomputing shards keep
  /// for their backward (one [batch, context, width] activation a shard and micro-batch) wait
  /// in host memory (ShardPlan::input_offloaded; DeepSpeed's CPU checkpointing)? The plan is
  /// made with and without, and the shorter estimated step kept (or the one that fits: deep
  /// models at small budgets, where the kept inputs are what does not fit).
  bool checkpoint_offload = false;
};

struct PartitionPlan {
  std::vector<ShardPlan> shards;
  int64_t pinned_bytes = 0;  ///< parameters shared across shards (tied), resident all step
  int64_t buffer_bytes = 0;  ///< the layers' buffers (LayerCost::buffer_bytes), resident too
  int64_t peak_device_bytes = 0;
  int64_t total_state_bytes = 0;
  StateTier state_tier = StateTier::kHost;
  /// What every attention layer keeps for its backward. kRecomputed: the shards' activation
  /// bytes leave the scores out, and workspace and peak count one layer's scores, rebuilt in
  /// its backward; kFused: they leave them out, and peak counts one layer's fused backward.
  /// Workspace and peak count the most any one layer's backward allocates while it runs
  /// (BackwardTransientBytes).
  AttentionMemory attention = AttentionMemory::kKept;
  /// Stashed shards keep their graphs in device memory (PartitionOptions::stash_on_device);
  /// the peak counts them.
  bool stash_on_device = false;
  /// Host bytes the offloading shards' activations (and the offloaded inputs,
  /// ShardPlan::input_offloaded) take from their forward to their backward (all of them at
  /// once: the last forward ends before the first backward).
  int64_t offloaded_bytes = 0;
  /// GPT-2 blocks recompute their LayerNorm and GELU outputs in backward
  /// (PartitionOptions::selective_recompute): their activations leave them out, and one
  /// block's, computed again in its backward, is a transient the peak counts.
  bool selective_recompute = false;
  /// Bytes of the resident shards' state (ShardPlan::resident), on the device all step.
  int64_t resident_bytes = 0;
  /// With PartitionOptions::resident_state: seconds a step's copies over the host link take
  /// (the spilled shards' weights and optimizer state up and back, offloaded graphs out and
  /// in); the step takes at least that. 0 otherwise (the link left out of the estimate).
  double link_seconds = 0;
  /// The optimizer was left to the cost model, which chose the device, and no sharding fit
  /// with its state there: the shards' optimizer steps on the host, except where a shard's
  /// state fits on the device beside the plan and its step is faster there.
  bool optimizer_on_host_to_fit = false;
};

/// The options a trial's manifest implies: device budget, host budget (for stashed
/// activations), explicit boundaries, state tier and micro-batches.
PartitionOptions PartitionOptionsFor(const Trial& trial);

/// An --optimizer flag's value (ParseOptimizerFlag) on one trial's options: trials whose state
/// is on disk step on the device whatever it says (host stepping from disk is not built). The
/// agent's plans (ExecutorPartitionOptions) and the controller's plans of a trial on an agent
/// (PlanOptionsOn) both apply it here.
void ApplyOptimizerFlag(std::optional<OptimizerPlacement> flag, PartitionOptions* options);

/// Cuts the trial's layers into contiguous shards so that each shard's device need plus the
/// next shard's prefetch buffer fits the budget, then chooses each shard's activation policy
/// from the cost model, and whether attention scores are recomputed (options.
/// attention_recompute) by the estimated compute of a step with and without (or, with
/// options.fused_attention, counts them fused). Where options leave the optimizer's placement
/// to the cost model and the plan with it on the device does not fit (the state in the host
/// tier), the shards' optimizer steps on the host if that fits (each shard's on the device
/// where its state still fits and its step is faster there). RESOURCE_EXHAUSTED naming
/// the layer and bytes when one layer cannot fit; INVALID_ARGUMENT for unusable explicit
/// boundaries.
StatusOr<PartitionPlan> PlanShards(const Trial& trial, const PartitionOptions& options);

/// The plan's estimated step: its shards' estimated_seconds together, or the plan's
/// link_seconds where the copies take longer than that compute.
double EstimatedStepSeconds(const PartitionPlan& plan);

/// Where a sharded trial's optimizer steps when `options` leave it to the cost model: on the
/// host when that takes less time per step than moving the optimizer state to the device and
/// back (2 x its bytes over the host link); the host streams weights, gradients and state in
/// and weights and state out. On the device when either rate is unknown (a CPU device: the
/// link is free) or the state is on disk (host stepping from disk is not built). PlanShards
/// packs the shards for this choice (or for the host, where the device's plan does not fit), then
/// moves a shard's optimizer to the device where its compute (at options.flops_per_second) hides
/// the state's copies and the plan still fits.
OptimizerPlacement ChooseOptimizerPlacement(const Trial& trial, const PartitionOptions& options);

/// Disk bytes the trial's spill files may take at once: 0 with the state in the host tier;
/// otherwise the state, the temporary copy of the largest shard while it is rewritten, and the
/// gradients when global clipping parks them on disk, plus the files' 4 KiB alignment.
int64_t SpillDiskBytes(const Trial& trial, const PartitionPlan& plan);

/// A shard's layers as `hydra plan` names them: "block3", or "embed..block5".
std::string ShardLayers(const ShardPlan& shard);

/// A multi-line, human-readable rendering of the plan (used by `hydra plan`).
std::string FormatPlan(const Trial& trial, const PartitionPlan& plan);

}  // namespace hydra
