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
  /// Trials by state of one job (`hydra_controller_trials{namespace,job,state}`); the job's
  /// restart counters appear (at 0) with its first call.
  void SetJobTrials(const std::string& ns, const std::string& job,
                    const std::map<std::string, int>& by_state);
  /// Adds n restarts of a job's trials for one reason (agent_lost, agent_drained, ...).
  void AddTrialRestarts(const std::string& ns, const std::string& job, const std::string& reason,
                        int n);
  /// Adds agents found lost (no answer and gone from Prometheus).
  void AddAgentsLost(int n);
  /// Drops a deleted job's series.
  void ForgetJob(const std::string& ns, const std::string& job);
  void SetLeader(bool leader);
  void AddAssignments(int n);
  std::string Render() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace hydra::controller
