#pragma once

#include <string>

#include "agent/executor/spilling_executor.h"
#include "common/devices.h"
#include "common/job.h"
#include "common/status.h"

namespace hydra::executor {

/// What a short pilot run measured for the trial's heaviest layer.
struct PilotResult {
  std::string layer;            ///< the layer timed: the most forward FLOPs by the cost model
  double layer_seconds = 0;     ///< measured forward + backward of it, one micro-batch
  double layer_flops = 0;       ///< the cost model's FLOPs for the same work (3x forward)
  double flops_per_second = 0;  ///< achieved rate: layer_flops / layer_seconds
  std::string device;           ///< where it ran: "cpu", or "cuda:0 (NVIDIA H100 80GB HBM3)"
  /// How the layer's attention ran: as the executors run it (ExecutorAttention: fused in the
  /// CUDA build), so that the rate is the one a trial's shards reach.
  AttentionMemory attention = AttentionMemory::kKept;
};

/// Times a forward and backward of the trial's heaviest layer at its micro-batch, on a random
/// batch (two warm-up rounds, then the mean of three; the last layer of a token model through
/// its loss against random targets, as training runs it: GPT-2's fused LM head and loss, whose
/// backward only scales what its forward computed), to check the cost model's time estimates
/// and to calibrate them. Every family: GPT-2 and the MLP are built with one block or hidden
/// layer (the others are the same), the ResNet whole, a TorchScript module as loaded (the trial
/// must be resolved). On `device`: the CPU with the current LibTorch threading, or a GPU (the
/// CUDA build), whose queued kernels are waited for before the clock is read. Attention runs as
/// the executors run it (fused where LibTorch has it): timed with the T x T scores kept, a GPT-2
/// medium block in bf16 on an H200 reached 134.5 TFLOP/s, some 0.6 of what the model trained at.
StatusOr<PilotResult> RunPilot(const Trial& trial, const DeviceSpec& device = DeviceSpec());

/// The trial MeasureLinkRates times a whole GPT-2 block of, in `precision`: GPT-2 medium's
/// width (1024), heads (16) and context (1024) at micro-batch 8, a small vocabulary (the block,
/// not the head, is the heaviest layer). What a model's layers reach together (elementwise
/// steps, attention, LayerNorms and the products' own shapes) rather than a square product's
/// peak: on an H200 GPT-2 medium trained unsharded in bf16 at about a third of the 4096^3
/// product's rate.
Trial BlockPilotTrial(Precision precision);

/// The rates that decide where a spilled shard's optimizer steps (ChooseOptimizerPlacement and
/// PlanShards' per-shard refinement): ExecutorOptions' host_link_bytes_per_second,
/// host_optimizer_bytes_per_second, flops_per_second and bf16_flops_per_second.
struct LinkRates {
  double host_link_bytes_per_second = 0;  ///< pinned host memory to the device
  /// The host's fused AdamW, in bytes of weights, gradients and state streamed (28 a
  /// parameter: weights read and written, gradients read, two moments read and written).
  double host_optimizer_bytes_per_second = 0;
  /// The device's matrix product rate (FLOP/s) in fp32 and in bf16: what compute the copies
  /// of a shard's optimizer state can hide behind. 0: the products failed (logged).
  double device_flops_per_second = 0;
  double device_bf16_flops_per_second = 0;
  /// The rate of a whole block's forward and backward (BlockPilotTrial; the cost model's FLOPs
  /// over the measured time) in fp32 and in bf16: what the factory plans compute with where
  /// measured. 0: the block failed (logged).
  double block_flops_per_second = 0;
  double block_bf16_flops_per_second = 0;
};

/// Measures them for `device` (the pilot of the host link, issue 17): on a GPU, copies of
/// 256 MiB from pinned memory (one warm-up, the mean of three), three AdamW steps over 16M
/// parameters on the host with the current threading, 4096^3 matrix products on the GPU
/// in fp32 and bf16 (two warm-ups, the mean of three), and BlockPilotTrial's block in both
/// (RunPilot). A CPU device has no link to measure
/// (zeros: its optimizer steps where its state is). INTERNAL with LibTorch's message if a copy
/// fails.
StatusOr<LinkRates> MeasureLinkRates(const DeviceSpec& device);

/// Measures the link rates of the first of `options->devices` when it is a GPU and sets
/// options' host_link_bytes_per_second, host_optimizer_bytes_per_second, flops_per_second and
/// bf16_flops_per_second from them (the block's rates; the matrix products' where a block
/// failed) (where spilled shards' optimizers step, and the shards'
/// estimated seconds). Returns a line for the log: what was measured, or, from "warning: ",
/// why the optimizers step on the device; empty for CPU devices. With `options->threads` set,
/// configures the CPU threads first (ConfigureCpuThreads): the host optimizer is timed on them.
std::string UseMeasuredLinkRates(ExecutorOptions* options);

}  // namespace hydra::executor
