#include "controller/metrics/controller_metrics.h"

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <algorithm>
#include <mutex>
#include <utility>
#include <vector>

#include "common/trial_result.h"
#include "controller/metrics/metric_names.h"

namespace hydra::controller {

namespace mn = metric_names;

struct ControllerMetrics::Impl {
  std::shared_ptr<prometheus::Registry> registry = std::make_shared<prometheus::Registry>();
  prometheus::Family<prometheus::Counter>& reconciles = prometheus::BuildCounter()
                                                            .Name(mn::kReconcilesTotal)
                                                            .Help("Reconciles by result")
                                                            .Register(*registry);
  prometheus::Counter& errors = prometheus::BuildCounter()
                                    .Name(mn::kReconcileErrorsTotal)
                                    .Help("Reconciles that failed")
                                    .Register(*registry)
                                    .Add({});
  prometheus::Histogram& duration =
      prometheus::BuildHistogram()
          .Name(mn::kReconcileDurationSeconds)
          .Help("Time of one reconcile")
          .Register(*registry)
          .Add({}, prometheus::Histogram::BucketBoundaries{0.001, 0.005, 0.01, 0.025, 0.05, 0.1,
                                                           0.25, 0.5, 1, 2.5, 5, 10});
  prometheus::Gauge& depth = prometheus::BuildGauge()
                                 .Name(mn::kQueueDepth)
                                 .Help("Jobs waiting in the work queue")
                                 .Register(*registry)
                                 .Add({});
  prometheus::Family<prometheus::Gauge>& trials = prometheus::BuildGauge()
                                                      .Name(mn::kTrials)
                                                      .Help("Trials of a job by state")
                                                      .Register(*registry);
  prometheus::Family<prometheus::Counter>& restarts =
      prometheus::BuildCounter()
          .Name(mn::kTrialRestartsTotal)
          .Help("Trials sent back to placement (or failed for spec.maxRestarts), by reason")
          .Register(*registry);
  prometheus::Counter& agents_lost =
      prometheus::BuildCounter()
          .Name(mn::kAgentsLostTotal)
          .Help("Agents found lost: no answer over gRPC and gone from Prometheus")
          .Register(*registry)
          .Add({});
  prometheus::Gauge& leader = prometheus::BuildGauge()
                                  .Name(mn::kIsLeader)
                                  .Help("1 while this replica leads")
                                  .Register(*registry)
                                  .Add({});
  prometheus::Counter& assignments = prometheus::BuildCounter()
                                         .Name(mn::kAssignmentsTotal)
                                         .Help("Trials assigned to agents")
                                         .Register(*registry)
                                         .Add({});
  std::mutex mu;
  /// Series per job, removed when the job is deleted.
  std::map<std::pair<std::string, std::string>, std::vector<prometheus::Gauge*>> job_gauges;
  std::map<std::pair<std::string, std::string>, std::vector<prometheus::Counter*>> job_counters;
};

ControllerMetrics::ControllerMetrics() : impl_(std::make_unique<Impl>()) {}
ControllerMetrics::~ControllerMetrics() = default;

void ControllerMetrics::ObserveReconcile(const std::string& result, double seconds) {
  impl_->reconciles.Add({{"result", result}}).Increment();
  if (result == "error") impl_->errors.Increment();
  impl_->duration.Observe(seconds);
}
void ControllerMetrics::SetQueueDepth(size_t depth) {
  impl_->depth.Set(static_cast<double>(depth));
}
void ControllerMetrics::SetJobTrials(const std::string& ns, const std::string& job,
                                     const std::map<std::string, int>& by_state) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto& gauges = impl_->job_gauges[{ns, job}];
  gauges.clear();
  for (const char* s : kTrialStates) {
    auto it = by_state.find(s);
    auto& g = impl_->trials.Add({{"namespace", ns}, {"job", job}, {"state", s}});
    g.Set(it == by_state.end() ? 0 : it->second);
    gauges.push_back(&g);
  }
  // Restart counters start at 0 for every reason, so that the first restart is an increase
  // and dashboards see the series before anything went wrong.
  auto& counters = impl_->job_counters[{ns, job}];
  if (counters.empty()) {
    for (const char* reason : {"agent_lost", "agent_drained", "agent_forgot", "cancelled"}) {
      counters.push_back(
          &impl_->restarts.Add({{"namespace", ns}, {"job", job}, {"reason", reason}}));
    }
  }
}
void ControllerMetrics::AddTrialRestarts(const std::string& ns, const std::string& job,
                                         const std::string& reason, int n) {
  if (n <= 0) return;
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto& c = impl_->restarts.Add({{"namespace", ns}, {"job", job}, {"reason", reason}});
  c.Increment(n);
  auto& mine = impl_->job_counters[{ns, job}];
  if (std::find(mine.begin(), mine.end(), &c) == mine.end()) mine.push_back(&c);
}
void ControllerMetrics::ForgetJob(const std::string& ns, const std::string& job) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  for (auto* g : impl_->job_gauges[{ns, job}]) impl_->trials.Remove(g);
  for (auto* c : impl_->job_counters[{ns, job}]) impl_->restarts.Remove(c);
  impl_->job_gauges.erase({ns, job});
  impl_->job_counters.erase({ns, job});
}
void ControllerMetrics::AddAgentsLost(int n) {
  if (n > 0) impl_->agents_lost.Increment(n);
}
void ControllerMetrics::SetLeader(bool leader) { impl_->leader.Set(leader ? 1 : 0); }
void ControllerMetrics::AddAssignments(int n) {
  if (n > 0) impl_->assignments.Increment(n);
}
std::string ControllerMetrics::Render() const {
  return prometheus::TextSerializer().Serialize(impl_->registry->Collect());
}

}  // namespace hydra::controller
