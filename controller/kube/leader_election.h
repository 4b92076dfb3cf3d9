#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "controller/kube/kube_client_interface.h"

namespace hydra::kube {

struct LeaderElectionConfig {
  std::string lease_namespace;
  std::string lease_name;
  std::string identity;                             ///< this candidate, e.g. the pod name
  std::chrono::milliseconds lease_duration{15000};  ///< others wait this long after a renewal
  std::chrono::milliseconds renew_deadline{10000};  ///< the leader gives up if it cannot renew
  std::chrono::milliseconds retry_period{2000};     ///< between attempts
};

/// Leader election on a coordination.k8s.io/v1 Lease, as client-go's leaderelection does: a
/// candidate takes the Lease when it is free or its holder has not renewed it for
/// lease_duration (measured on this candidate's clock from when it saw the renewal, so clock
/// skew does not matter), renews it every retry_period with optimistic concurrency, and stops
/// leading when it cannot renew within renew_deadline. Callbacks run on the elector's thread.
class LeaderElector {
 public:
  LeaderElector(KubeClientInterface* client, LeaderElectionConfig config,
                std::function<void()> on_started_leading, std::function<void()> on_stopped_leading);
  ~LeaderElector();

  void Start();
  /// Stops campaigning. With `release`, a leader hands the Lease back (holder cleared) so that
  /// another candidate takes over at once; without, others wait for it to expire.
  void Stop(bool release = true);

  bool IsLeader() const { return leader_.load(); }
  /// The holder in the Lease as last read.
  std::string observed_holder() const;

 private:
  void Run();
  /// One attempt; true if this candidate holds the Lease afterwards.
  bool TryAcquireOrRenew();

  KubeClientInterface* client_;
  LeaderElectionConfig config_;
  std::function<void()> on_started_, on_stopped_;
  std::atomic<bool> stop_{false}, leader_{false};
  mutable std::mutex mu_;
  std::string observed_holder_, observed_renew_;
  std::chrono::steady_clock::time_point observed_at_;
  std::chrono::steady_clock::time_point last_renewed_;
  std::thread thread_;
};

/// Time as Kubernetes' MicroTime ("2026-11-22T02:30:00.123456Z") and Time ("...:00Z").
std::string MicroTimeNow();
std::string TimeNow();

}  // namespace hydra::kube
