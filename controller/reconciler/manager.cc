#include "controller/reconciler/manager.h"

#include <iostream>

namespace hydra::controller {

Manager::Manager(kube::KubeClientInterface* kube, Reconciler* reconciler,
                 ControllerMetrics* metrics, std::vector<std::string> namespaces, int workers,
                 const std::atomic<bool>* leading)
    : kube_(kube),
      reconciler_(reconciler),
      metrics_(metrics),
      namespaces_(std::move(namespaces)),
      workers_(workers),
      leading_(leading) {
  if (namespaces_.empty()) namespaces_.push_back("");  // all namespaces
}

Manager::~Manager() { Stop(); }

void Manager::Start() {
  for (const auto& ns : namespaces_) {
    watchers_.push_back(std::make_unique<kube::Watcher>(
        kube_, kMultiModelJobs, ns, [this](const std::string& type, const kube::Json& o) {
          const std::string key = kube::ObjectKey(o);
          if (type == "DELETED") {
            if (metrics_) {
              metrics_->ForgetJob(o["metadata"].value("namespace", ""),
                                  o["metadata"].value("name", ""));
            }
            return;
          }
          queue_.Add(key);
        }));
    watchers_.back()->Start();
  }
  for (int w = 0; w < workers_; ++w) threads_.emplace_back(&Manager::Work, this);
}

void Manager::Stop() {
  stop_ = true;
  queue_.ShutDown();
  for (auto& t : threads_) t.join();
  threads_.clear();
  for (auto& w : watchers_) w->Stop();
}

bool Manager::synced() const {
  for (const auto& w : watchers_) {
    if (!w->synced()) return false;
  }
  return !watchers_.empty();
}

void Manager::Work() {
  while (auto key = queue_.Get()) {
    while (leading_ && !leading_->load() && !stop_) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (stop_) {
      queue_.Done(*key);
      break;
    }
    const auto slash = key->find('/');
    const std::string ns = key->substr(0, slash), name = key->substr(slash + 1);
    const auto t0 = std::chrono::steady_clock::now();
    auto r = reconciler_->Reconcile(ns, name);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    queue_.Done(*key);
    if (metrics_) metrics_->SetQueueDepth(queue_.Depth());
    if (!r.ok()) {
      if (metrics_) metrics_->ObserveReconcile("error", seconds);
      std::cerr << "hydra-controller: " << *key << ": " << r.status().message() << "\n";
      queue_.AddAfter(*key, std::chrono::seconds(2));
      continue;
    }
    if (metrics_) {
      metrics_->ObserveReconcile(r->requeue_after.count() > 0 ? "requeue" : "success", seconds);
      metrics_->AddAssignments(r->assigned);
      metrics_->SetJobTrials(ns, name, r->trials_by_state);
      metrics_->AddAgentsLost(r->agents_lost);
      for (const auto& [reason, n] : r->restarts_by_reason) {
        metrics_->AddTrialRestarts(ns, name, reason, n);
      }
    }
    if (r->requeue_after.count() > 0) queue_.AddAfter(*key, r->requeue_after);
  }
}

}  // namespace hydra::controller
