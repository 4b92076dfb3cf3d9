#include "controller/metrics/controller_metrics.h"

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <mutex>

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
                                                      .Help("Trials of all jobs by state")
                                                      .Register(*registry);
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
  std::map<std::string, std::map<std::string, int>> per_job;

  void Publish() {
    std::map<std::string, int> sum;
    for (const auto& [job, states] : per_job) {
      for (const auto& [s, n] : states) sum[s] += n;
    }
    for (const char* s : {kTrialPending, kTrialRunning, kTrialSucceeded, kTrialFailed,
                          kTrialInterrupted, kTrialCancelled}) {
      trials.Add({{"state", s}}).Set(sum.count(s) ? sum[s] : 0);
    }
  }
};

ControllerMetrics::ControllerMetrics() : impl_(std::make_unique<Impl>()) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->Publish();
}
ControllerMetrics::~ControllerMetrics() = default;

void ControllerMetrics::ObserveReconcile(const std::string& result, double seconds) {
  impl_->reconciles.Add({{"result", result}}).Increment();
  if (result == "error") impl_->errors.Increment();
  impl_->duration.Observe(seconds);
}
void ControllerMetrics::SetQueueDepth(size_t depth) {
  impl_->depth.Set(static_cast<double>(depth));
}
void ControllerMetrics::SetJobTrials(const std::string& job_key,
                                     const std::map<std::string, int>& by_state) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->per_job[job_key] = by_state;
  impl_->Publish();
}
void ControllerMetrics::ForgetJob(const std::string& job_key) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->per_job.erase(job_key);
  impl_->Publish();
}
void ControllerMetrics::SetLeader(bool leader) { impl_->leader.Set(leader ? 1 : 0); }
void ControllerMetrics::AddAssignments(int n) {
  if (n > 0) impl_->assignments.Increment(n);
}
std::string ControllerMetrics::Render() const {
  return prometheus::TextSerializer().Serialize(impl_->registry->Collect());
}

}  // namespace hydra::controller
