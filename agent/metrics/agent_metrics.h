#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "common/devices.h"
#include "common/job.h"
#include "common/status.h"

namespace hydra::agent {

/// hydra-agent's Prometheus metrics (names in agent/metrics/metric_names.h), kept in a
/// prometheus-cpp registry and rendered in the text exposition format for /metrics.
/// Thread-safe.
class AgentMetrics {
 public:
  /// `node` labels every series; hydra_agent_info appears once SetInfo is called.
  AgentMetrics(const std::string& node, const std::string& version);
  ~AgentMetrics();

  /// The text exposition format (version 0.0.4), as a scrape returns it.
  std::string Render() const;

  /// What hydra_agent_info says of the agent beyond its node and version.
  struct Info {
    std::string grpc_endpoint;
    /// An agent dedicated to one job (--dedicated-job): the controller's shared pool leaves it
    /// out. "": none.
    std::string dedicated_job_uid;
    /// --optimizer (auto, device or host): where the controller's placement lets spilled
    /// trials' optimizers step when it plans them on this agent.
    std::string optimizer = "auto";
  };
  /// hydra_agent_info{node, grpc_endpoint, version, optimizer[, dedicated_job_uid]} = 1
  /// (replacing any earlier one).
  void SetInfo(const Info& info);

  /// A device's memory and busy ratio, labelled `device` ("cuda:0"), and for a GPU also `gpu`
  /// (its index) and `UUID`, the labels dcgm-exporter's series carry, so queries join them.
  void SetDevice(const DeviceSpec& device, int64_t total_bytes, int64_t free_bytes,
                 int64_t used_bytes, double busy_ratio);
  /// Whether the device failed (hydra_device_failed), labelled like SetDevice.
  void SetDeviceFailed(const DeviceSpec& device, bool failed);
  /// A GPU's caching-allocator bytes (hydra_gpu_allocator_*), labelled like SetDevice.
  void SetGpuAllocator(const DeviceSpec& device, int64_t allocated_bytes, int64_t reserved_bytes);
  /// Trials per state; states missing from `counts` read 0.
  void SetTrialsByState(const std::map<std::string, int64_t>& counts);
  /// A trial's latest progress, labelled with its identity (namespace, job, job_uid, trial);
  /// a NaN loss leaves that split's series out.
  void SetTrialProgress(const Trial& trial, int64_t step, double train_loss, double validation_loss,
                        double tokens_per_second);
  /// Removes a trial's series (the agent forgot the trial).
  void RemoveTrial(const Trial& trial);
  void AddSpillBytes(const std::string& tier, const std::string& direction, int64_t bytes);
  void AddShardTasks(const std::string& phase, int64_t tasks);
  void ObserveCheckpoint(double seconds);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace hydra::agent
