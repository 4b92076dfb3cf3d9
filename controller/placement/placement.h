#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/job.h"
#include "common/partitioner.h"
#include "common/status.h"

namespace hydra::controller {

struct DeviceInventory {
  std::string name;  ///< "cpu:0", "cuda:1"
  int64_t total_bytes = 0;
  int64_t free_bytes = 0;
  std::string uuid;  ///< a GPU's UUID label ("GPU-…"), which dcgm-exporter's series carry too
  /// dcgm-exporter's DCGM_FI_DEV_FB_FREE for this GPU (bytes), matched by UUID; -1: none.
  /// It counts every process on the GPU, which the agent's own ledger cannot see.
  int64_t dcgm_free_bytes = -1;
  /// What the agent's own process holds on this GPU for trials, which DCGM counts as used:
  /// LibTorch's caching allocator's reserved bytes (hydra_gpu_allocator_reserved_bytes, its
  /// cache included, which outlives the trials that filled it); -1: not reported (an agent
  /// without the series).
  int64_t process_bytes = -1;

  /// The most a trial may plan for on this device: its total, but on a GPU that other
  /// processes share no more than DCGM's free memory plus what this agent's process holds
  /// there (without process_bytes, what its trials' plans hold).
  int64_t UsableBytes() const;
  /// Free for new work: UsableBytes less what the agent's trials' plans hold, at most the
  /// agent's free memory.
  int64_t AvailableBytes() const;
};

/// One agent as Prometheus reports it.
struct AgentInventory {
  std::string node;
  std::string endpoint;  ///< gRPC host:port (hydra_agent_info's grpc_endpoint)
  std::string version;
  std::vector<DeviceInventory> devices;
  /// Where the agent lets spilled trials' optimizers step (its --optimizer, hydra_agent_info's
  /// `optimizer` label): nullopt for auto (the cost model, the host where only that fits);
  /// the device for an agent whose info does not say (older agents planned that way).
  std::optional<OptimizerPlacement> optimizer = OptimizerPlacement::kDevice;

  int64_t MaxDeviceBytes() const;  ///< the largest UsableBytes: what a shard plan may use
  int64_t FreeBytes() const;       ///< the devices' AvailableBytes, summed
  bool LimitedByDcgm() const;      ///< some device's UsableBytes is below its total
};

/// Reads the inventory: agents (hydra_agent_info), their devices' total and free memory (and a
/// GPU's UUID label), and DCGM_FI_DEV_FB_FREE (MiB) per GPU, matched to a device by node
/// (its Hostname or hostname label) and UUID. Agents
/// without device series are left out (their data is stale or incomplete).
/// Only series of the Prometheus scrape job `agent_scrape_job` (its `job` label; "" for any)
/// count: anything else Prometheus scrapes could export a fake hydra_agent_info. Samples of the
/// wrong type or out of range are skipped with a log line.
class PrometheusClient {
 public:
  explicit PrometheusClient(std::string base_url);
  struct Sample {
    std::map<std::string, std::string> labels;
    double value = 0;
  };
  /// An instant query; UNAVAILABLE when Prometheus cannot be reached or answers an error.
  /// Samples without string labels and a finite value are left out (logged).
  StatusOr<std::vector<Sample>> Query(const std::string& promql) const;
  const std::string& base_url() const { return base_url_; }

 private:
  std::string base_url_;
};

StatusOr<std::vector<AgentInventory>> FetchInventory(const PrometheusClient& prometheus,
                                                     const std::string& agent_scrape_job);

/// A trial waiting for an agent, and the one it got.
struct TrialToPlace {
  Trial trial;
  double remaining_seconds = 0;  ///< estimated compute left: the longest go first
};
struct Placement {
  std::string trial;
  std::string endpoint, node;
  PartitionPlan plan;  ///< for the agent's device memory
};

/// How the controller plans `trial` on `agent` to see whether it fits there: the trial's own
/// options (PartitionOptionsFor) with the agent's optimizer placement, and on an agent with GPUs
/// ("cuda" devices) what a GPU agent's plans may do whatever its link (fused attention, graphs kept
/// in the GPU's memory, selective recompute), so that a trial that fits a GPU only that way is not
/// kept waiting. The agent makes the plan it trains with (AssignTrial sends the controller's only
/// for a manifest's shardBoundaries).
PartitionOptions PlanOptionsOn(const Trial& trial, const AgentInventory& agent);

/// Places trials longest-remaining-first, each onto the agent with the most free device memory
/// per trial it already trains (`load`: trials per endpoint, updated as trials are placed)
/// whose devices can hold the trial's shard plan. With `one_per_device`, an agent takes no more
/// trials than it has devices (a job's own agents while more of its pods are starting). Trials
/// that fit no agent are returned in `waiting` with the reason.
std::vector<Placement> PlaceTrials(std::vector<TrialToPlace> trials,
                                   const std::vector<AgentInventory>& agents,
                                   std::map<std::string, int>* load,
                                   std::map<std::string, std::string>* waiting,
                                   bool one_per_device = false);

/// Remaining compute of a trial from the cost model: 6 FLOPs per parameter per token.
double EstimatedRemainingSeconds(const Trial& trial, int64_t steps_done);

}  // namespace hydra::controller
