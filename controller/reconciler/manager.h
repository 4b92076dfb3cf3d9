#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "controller/kube/watcher.h"
#include "controller/metrics/controller_metrics.h"
#include "controller/reconciler/reconciler.h"
#include "controller/reconciler/work_queue.h"

namespace hydra::controller {

/// Runs the controller loop: watchers on MultiModelJobs (per namespace, or all) feed a work
/// queue; `workers` threads reconcile one job each at a time, requeueing as the reconciler
/// asks (errors after 2 s). Reconciling waits while `leading` reads false.
class Manager {
 public:
  /// All borrowed; `metrics` may be null.
  Manager(kube::KubeClientInterface* kube, Reconciler* reconciler, ControllerMetrics* metrics,
          std::vector<std::string> namespaces, int workers, const std::atomic<bool>* leading);
  ~Manager();

  void Start();
  void Stop();
  /// True once every watcher delivered its first list.
  bool synced() const;
  size_t queue_depth() { return queue_.Depth(); }

 private:
  void Work();

  kube::KubeClientInterface* kube_;
  Reconciler* reconciler_;
  ControllerMetrics* metrics_;
  std::vector<std::string> namespaces_;
  int workers_;
  const std::atomic<bool>* leading_;
  WorkQueue queue_;
  std::atomic<bool> stop_{false};
  std::vector<std::unique_ptr<kube::Watcher>> watchers_;
  std::vector<std::thread> threads_;
};

}  // namespace hydra::controller
