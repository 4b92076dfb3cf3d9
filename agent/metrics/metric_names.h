#pragma once

/// Every metric hydra-agent exports, in one place: docs/metrics.md lists them, the controller's
/// PromQL queries and the Grafana dashboards use exactly these names. Every series also has the
/// label `node` (the agent's --node-name), so queries join the agent's series per node.
namespace hydra::agent::metric_names {

// Gauge, value 1. Labels: node, grpc_endpoint, version. Where to reach the agent.
inline constexpr char kAgentInfo[] = "hydra_agent_info";
// Gauges in bytes. Labels: node, device (+ gpu, UUID on a GPU: dcgm-exporter's labels, for
// joins). Total is the device's memory (a CPU device's
// budget); used is what this agent's running trials hold (on a GPU, every trial it holds,
// between steps too); free = total - used.
inline constexpr char kDeviceMemoryTotalBytes[] = "hydra_device_memory_total_bytes";
inline constexpr char kDeviceMemoryFreeBytes[] = "hydra_device_memory_free_bytes";
inline constexpr char kDeviceMemoryUsedBytes[] = "hydra_device_memory_used_bytes";
// Gauges in bytes, GPUs only. Labels: node, device, gpu, UUID. What LibTorch's caching
// allocator holds on the GPU now: allocated is in tensors, reserved is taken from CUDA
// (allocated plus cached free blocks; reserved - allocated is the cache and its fragmentation).
inline constexpr char kGpuAllocatorAllocatedBytes[] = "hydra_gpu_allocator_allocated_bytes";
inline constexpr char kGpuAllocatorReservedBytes[] = "hydra_gpu_allocator_reserved_bytes";
// Gauge in [0, 1]. Labels: node, device (+ gpu, UUID). Share of the last minute the device ran
// steps.
inline constexpr char kDeviceBusyRatio[] = "hydra_device_busy_ratio";
// Gauge, 0 or 1. Labels: node, device (+ gpu, UUID). 1 once the device failed (a GPU whose
// CUDA context an error left unusable, such as an Xid's illegal address or a GPU fallen off the
// bus): it trains nothing more until the agent restarts, its free memory reads 0.
inline constexpr char kDeviceFailed[] = "hydra_device_failed";
// Gauges. Labels: node, job, trial (+ split="train"|"validation" for the loss).
inline constexpr char kTrialStep[] = "hydra_trial_step";
inline constexpr char kTrialLoss[] = "hydra_trial_loss";
inline constexpr char kTrialTokensPerSecond[] = "hydra_trial_tokens_per_second";
// Counter in bytes. Labels: node, tier ("disk"), direction ("read"|"write").
inline constexpr char kSpillBytesTotal[] = "hydra_spill_bytes_total";
// Counter. Labels: node, phase ("forward"|"backward"|"optimizer"|"evaluate").
inline constexpr char kShardTasksTotal[] = "hydra_shard_tasks_total";
// Histogram in seconds. Labels: node.
inline constexpr char kCheckpointDurationSeconds[] = "hydra_checkpoint_duration_seconds";
// Gauge. Labels: node, state ("Pending"|"Running"|"Succeeded"|"Failed"|"Interrupted"|
// "Cancelled").
inline constexpr char kAgentTrials[] = "hydra_agent_trials";

}  // namespace hydra::agent::metric_names
