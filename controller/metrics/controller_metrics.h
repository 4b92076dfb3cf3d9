#pragma once

#include <map>
#include <memory>
#include <string>

namespace hydra::controller {

/// hydra-controller's Prometheus metrics (names in controller/metrics/metric_names.h), in a
/// prometheus-cpp registry rendered for /metrics. Thread-safe.
class ControllerMetrics {
 public:
  ControllerMetrics();
  ~ControllerMetrics();
  void ObserveReconcile(const std::string& result, double seconds);
  void SetQueueDepth(size_t depth);
  /// Trials by state of one job; the gauge sums over jobs.
  void SetJobTrials(const std::string& job_key, const std::map<std::string, int>& by_state);
  void ForgetJob(const std::string& job_key);
  void SetLeader(bool leader);
  void AddAssignments(int n);
  std::string Render() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace hydra::controller
