#include "agent/metrics/agent_metrics.h"

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <cmath>
#include <mutex>

#include "agent/metrics/metric_names.h"
#include "common/trial_result.h"

namespace hydra::agent {

namespace mn = metric_names;
using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;

struct AgentMetrics::Impl {
  explicit Impl(const std::string& node)
      : registry(std::make_shared<prometheus::Registry>()),
        node_labels{{"node", node}},
        info(BuildGauge()
                 .Name(mn::kAgentInfo)
                 .Help("hydra-agent identity: where its gRPC service listens (value 1)")
                 .Register(*registry)),
        mem_total(BuildGauge()
                      .Name(mn::kDeviceMemoryTotalBytes)
                      .Help("Device memory in bytes (a CPU device's budget)")
                      .Labels(node_labels)
                      .Register(*registry)),
        mem_free(BuildGauge()
                     .Name(mn::kDeviceMemoryFreeBytes)
                     .Help("Device memory not used by this agent's running trials, in bytes")
                     .Labels(node_labels)
                     .Register(*registry)),
        mem_used(BuildGauge()
                     .Name(mn::kDeviceMemoryUsedBytes)
                     .Help("Device memory used by this agent's running trials, in bytes")
                     .Labels(node_labels)
                     .Register(*registry)),
        allocated(BuildGauge()
                      .Name(mn::kGpuAllocatorAllocatedBytes)
                      .Help("Bytes in tensors of LibTorch's caching allocator on the GPU")
                      .Labels(node_labels)
                      .Register(*registry)),
        reserved(BuildGauge()
                     .Name(mn::kGpuAllocatorReservedBytes)
                     .Help("Bytes LibTorch's caching allocator holds from CUDA on the GPU "
                           "(allocated + cached)")
                     .Labels(node_labels)
                     .Register(*registry)),
        busy(BuildGauge()
                 .Name(mn::kDeviceBusyRatio)
                 .Help("Share of the last minute the device spent running training steps")
                 .Labels(node_labels)
                 .Register(*registry)),
        failed(BuildGauge()
                   .Name(mn::kDeviceFailed)
                   .Help("1 once the device failed (a lost GPU): it trains nothing more until the "
                         "agent restarts")
                   .Labels(node_labels)
                   .Register(*registry)),
        step(BuildGauge()
                 .Name(mn::kTrialStep)
                 .Help("Optimizer steps a trial has taken")
                 .Labels(node_labels)
                 .Register(*registry)),
        loss(BuildGauge()
                 .Name(mn::kTrialLoss)
                 .Help("A trial's latest loss (split: train = last step, validation = last "
                       "evaluation)")
                 .Labels(node_labels)
                 .Register(*registry)),
        tokens(BuildGauge()
                   .Name(mn::kTrialTokensPerSecond)
                   .Help("Tokens a trial trains per second of its training time")
                   .Labels(node_labels)
                   .Register(*registry)),
        spill(BuildCounter()
                  .Name(mn::kSpillBytesTotal)
                  .Help("Bytes of shard state moved to and from a spill tier")
                  .Labels(node_labels)
                  .Register(*registry)),
        tasks(BuildCounter()
                  .Name(mn::kShardTasksTotal)
                  .Help("Shard-tasks run, by phase")
                  .Labels(node_labels)
                  .Register(*registry)),
        checkpoint(BuildHistogram()
                       .Name(mn::kCheckpointDurationSeconds)
                       .Help("Time to write one trial checkpoint (temporary file, fsync, rename)")
                       .Labels(node_labels)
                       .Register(*registry)),
        trials(BuildGauge()
                   .Name(mn::kAgentTrials)
                   .Help("Trials this agent knows, by state")
                   .Labels(node_labels)
                   .Register(*registry)),
        checkpoint_seconds(
            checkpoint.Add({}, prometheus::Histogram::BucketBoundaries{
                                   0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300})) {}

  std::shared_ptr<prometheus::Registry> registry;
  prometheus::Labels node_labels;
  prometheus::Family<prometheus::Gauge>& info;
  prometheus::Family<prometheus::Gauge>& mem_total;
  prometheus::Family<prometheus::Gauge>& mem_free;
  prometheus::Family<prometheus::Gauge>& mem_used;
  prometheus::Family<prometheus::Gauge>& allocated;
  prometheus::Family<prometheus::Gauge>& reserved;
  prometheus::Family<prometheus::Gauge>& busy;
  prometheus::Family<prometheus::Gauge>& failed;
  prometheus::Family<prometheus::Gauge>& step;
  prometheus::Family<prometheus::Gauge>& loss;
  prometheus::Family<prometheus::Gauge>& tokens;
  prometheus::Family<prometheus::Counter>& spill;
  prometheus::Family<prometheus::Counter>& tasks;
  prometheus::Family<prometheus::Histogram>& checkpoint;
  prometheus::Family<prometheus::Gauge>& trials;
  prometheus::Histogram& checkpoint_seconds;
  std::string node, version;
  prometheus::Gauge* info_series = nullptr;
  std::mutex mu;  // guards info_series
};

AgentMetrics::AgentMetrics(const std::string& node, const std::string& version)
    : impl_(std::make_unique<Impl>(node)) {
  impl_->node = node;
  impl_->version = version;
  for (const char* state : kTrialStates) {
    impl_->trials.Add({{"state", state}}).Set(0);
  }
  // Counters with known label sets exist from the start at 0, so that rate() and alerts see
  // them before the first event.
  for (const char* direction : {"read", "write"}) {
    impl_->spill.Add({{"tier", "disk"}, {"direction", direction}});
  }
  for (const char* phase : {"forward", "backward", "optimizer", "evaluate"}) {
    impl_->tasks.Add({{"phase", phase}});
  }
}

AgentMetrics::~AgentMetrics() = default;

void AgentMetrics::SetInfo(const Info& info) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (impl_->info_series) impl_->info.Remove(impl_->info_series);
  prometheus::Labels labels{{"node", impl_->node},
                            {"grpc_endpoint", info.grpc_endpoint},
                            {"version", impl_->version},
                            {"optimizer", info.optimizer}};
  if (!info.dedicated_job_uid.empty()) labels["dedicated_job_uid"] = info.dedicated_job_uid;
  impl_->info_series = &impl_->info.Add(labels);
  impl_->info_series->Set(1);
}

std::string AgentMetrics::Render() const {
  return prometheus::TextSerializer().Serialize(impl_->registry->Collect());
}

namespace {

prometheus::Labels DeviceLabels(const DeviceSpec& device) {
  prometheus::Labels l{{"device", device.name}};
  if (device.kind == DeviceKind::kCuda) {
    l["gpu"] = std::to_string(device.index);
    if (!device.uuid.empty()) l["UUID"] = device.uuid;
  }
  return l;
}

}  // namespace

void AgentMetrics::SetDevice(const DeviceSpec& device, int64_t total_bytes, int64_t free_bytes,
                             int64_t used_bytes, double busy_ratio) {
  const prometheus::Labels l = DeviceLabels(device);
  impl_->mem_total.Add(l).Set(static_cast<double>(total_bytes));
  impl_->mem_free.Add(l).Set(static_cast<double>(free_bytes));
  impl_->mem_used.Add(l).Set(static_cast<double>(used_bytes));
  impl_->busy.Add(l).Set(busy_ratio);
}

void AgentMetrics::SetDeviceFailed(const DeviceSpec& device, bool failed) {
  impl_->failed.Add(DeviceLabels(device)).Set(failed ? 1.0 : 0.0);
}

void AgentMetrics::SetGpuAllocator(const DeviceSpec& device, int64_t allocated_bytes,
                                   int64_t reserved_bytes) {
  const prometheus::Labels l = DeviceLabels(device);
  impl_->allocated.Add(l).Set(static_cast<double>(allocated_bytes));
  impl_->reserved.Add(l).Set(static_cast<double>(reserved_bytes));
}

void AgentMetrics::SetTrialsByState(const std::map<std::string, int64_t>& counts) {
  for (const char* state : kTrialStates) {
    auto it = counts.find(state);
    impl_->trials.Add({{"state", state}})
        .Set(it == counts.end() ? 0.0 : static_cast<double>(it->second));
  }
}

namespace {

prometheus::Labels TrialLabels(const Trial& t) {
  return {{"namespace", t.namespace_}, {"job", t.job}, {"job_uid", t.job_uid}, {"trial", t.name}};
}

prometheus::Labels WithSplit(prometheus::Labels l, const char* split) {
  l["split"] = split;
  return l;
}

/// Removes the series of `family` with exactly `labels`, if it exists (Add would create it).
template <typename T>
void RemoveSeries(prometheus::Family<T>& family, const prometheus::Labels& labels) {
  if (family.Has(labels)) family.Remove(&family.Add(labels));
}

}  // namespace

void AgentMetrics::SetTrialProgress(const Trial& trial, int64_t step, double train_loss,
                                    double validation_loss, double tokens_per_second) {
  const prometheus::Labels l = TrialLabels(trial);
  impl_->step.Add(l).Set(static_cast<double>(step));
  impl_->tokens.Add(l).Set(tokens_per_second);
  if (std::isfinite(train_loss)) impl_->loss.Add(WithSplit(l, "train")).Set(train_loss);
  if (std::isfinite(validation_loss)) {
    impl_->loss.Add(WithSplit(l, "validation")).Set(validation_loss);
  }
}

void AgentMetrics::RemoveTrial(const Trial& trial) {
  const prometheus::Labels l = TrialLabels(trial);
  RemoveSeries(impl_->step, l);
  RemoveSeries(impl_->tokens, l);
  RemoveSeries(impl_->loss, WithSplit(l, "train"));
  RemoveSeries(impl_->loss, WithSplit(l, "validation"));
}

void AgentMetrics::AddSpillBytes(const std::string& tier, const std::string& direction,
                                 int64_t bytes) {
  if (bytes <= 0) return;
  impl_->spill.Add({{"tier", tier}, {"direction", direction}})
      .Increment(static_cast<double>(bytes));
}

void AgentMetrics::AddShardTasks(const std::string& phase, int64_t tasks) {
  if (tasks <= 0) return;
  impl_->tasks.Add({{"phase", phase}}).Increment(static_cast<double>(tasks));
}

void AgentMetrics::ObserveCheckpoint(double seconds) { impl_->checkpoint_seconds.Observe(seconds); }

}  // namespace hydra::agent
