#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "agent/executor/executor.h"
#include "agent/metrics/agent_metrics.h"
#include "agent/metrics/allocator_check.h"
#include "agent/rpc/dedicated_job.h"
#include "agent/scheduler/trial_scheduler.h"
#include "common/devices.h"
#include "hydra/agent/v1/agent.grpc.pb.h"

namespace hydra::agent {

namespace v1 = ::hydra::agent::v1;

struct AgentConfig {
  std::string node_name;
  std::string version;
  std::vector<DeviceSpec> devices;
  /// Absolute directories a trial may read datasets from and write checkpoints to; a path
  /// outside them (after resolving symlinks and "..") is PERMISSION_DENIED.
  std::vector<std::string> data_roots;
  std::vector<std::string> checkpoint_roots;
  int64_t host_memory_bytes = 0;  ///< host memory for trials' state; <= 0: 75% of the RAM
  std::string spill_dir;          ///< the executors' spill directory (disk admission)
  size_t max_trials = 1000;       ///< live trials (pending or running) at once
  /// Records of ended trials kept for GetStatus; past it the oldest are forgotten (with their
  /// metric series), so a long-lived agent's memory does not grow with the trials it ran.
  size_t max_finished_trials = 1000;
  size_t max_watchers = 16;  ///< concurrent WatchProgress streams
  /// With mutual TLS: the identity callers must present (a certificate's DNS or URI SAN when
  /// it has any, else its CN); empty: any certificate the CA signed.
  std::string required_client_identity;
  /// Set: the agent serves only this job's trials (--dedicated-job; a job-owned agent pod).
  std::optional<DedicatedJob> dedicated_job;
  /// CPU threads per device, recorded in checkpoints (a resume under another count is not
  /// bit-exact and says so). 0: unknown.
  int threads_per_device = 0;
};

/// hydra-agent's gRPC service (proto/hydra/agent/v1/agent.proto): checks each request, runs the
/// trials on a TrialScheduler over the node's devices, streams their progress and keeps the
/// metrics current. Thread-safe; gRPC calls it from its own threads.
class AgentService final : public v1::AgentService::Service, private TrialObserverInterface {
 public:
  /// `factory` and `metrics` (may be null) are borrowed and must outlive the service.
  AgentService(AgentConfig config, executor::ExecutorFactoryInterface* factory,
               AgentMetrics* metrics);
  ~AgentService() override;

  grpc::Status AssignTrial(grpc::ServerContext* context, const v1::AssignTrialRequest* request,
                           v1::AssignTrialResponse* response) override;
  grpc::Status CancelTrial(grpc::ServerContext* context, const v1::CancelTrialRequest* request,
                           v1::CancelTrialResponse* response) override;
  grpc::Status LimitTrial(grpc::ServerContext* context, const v1::LimitTrialRequest* request,
                          v1::LimitTrialResponse* response) override;
  grpc::Status GetStatus(grpc::ServerContext* context, const v1::GetStatusRequest* request,
                         v1::GetStatusResponse* response) override;
  grpc::Status WatchProgress(grpc::ServerContext* context, const v1::WatchProgressRequest* request,
                             grpc::ServerWriter<v1::TrialEvent>* writer) override;
  grpc::Status Drain(grpc::ServerContext* context, const v1::DrainRequest* request,
                     v1::DrainResponse* response) override;

  /// Checkpoints every trial (as Drain) and ends the progress streams: SIGTERM's path. Waits
  /// for the drain however long it takes (the kubelet's grace period bounds it).
  Status Shutdown(const std::string& reason);

  /// Empty when the agent takes assignments, else why not (for /readyz): shut down, draining,
  /// or every device failed.
  std::string NotReadyReason() const;
  /// Empty while the agent is of use, else why a restart is needed (for /healthz): every
  /// device failed (lost GPUs come back, if at all, only in a new process).
  std::string NotLiveReason() const;

  /// Refreshes device and trial-count metrics and the busy ratios, and forgets the oldest
  /// ended trials past max_finished_trials; main calls it every second (tests call it
  /// directly).
  void Tick();

  /// The node's devices as GetStatus reports them.
  std::vector<v1::Device> Devices() const;

 private:
  /// What the agent keeps of a trial besides the scheduler's record; keyed by TrialKey.
  struct TrialInfo {
    std::string checkpoint_dir;  // resolved; checked against the trial's identity
    v1::ShardPlan plan;
    std::string last_state;  // to tell state changes from steps in the event stream
    int64_t attempt = 0;
    std::vector<std::string> warnings;  // the trial's notices, newest last (at most 10)
    uint64_t assigned = 0;              // the order of assignments on this agent, from 1
  };
  struct Watcher {
    std::string job, ns;                            // filters; empty: all
    std::map<std::string, v1::TrialEvent> pending;  // latest event per trial (TrialKey), coalesced
    std::deque<std::string> order;                  // trials with a pending event, oldest first
    bool dropped = false;
    std::condition_variable cv;
  };

  // TrialObserverInterface, called by the scheduler's threads.
  void OnTrialUpdate(const TrialResult& snapshot) override;
  void OnTrialMessage(const Trial& trial, const std::string& message) override;
  void OnStep(const std::string& trial, int device, double seconds, int64_t shards,
              bool evaluated) override;
  void OnCheckpoint(const std::string& trial, double seconds) override;

  Status CheckAssignment(const v1::AssignTrialRequest& request, Trial* trial,
                         std::string* checkpoint_dir) const;
  /// What stops `trial` (its attempt `attempt`, in `dir`) from joining the trials this agent
  /// holds; an older attempt of it still active here goes into `superseded`.
  grpc::Status CheckAgainstKnown(const Trial& trial, int64_t attempt, const std::string& dir,
                                 int64_t* superseded) const;
  /// The checkpoint directory of the ended trial `key` if its files are still the trial's own
  /// to delete: no trial assigned to this agent after it uses the directory (a job created
  /// again under the same name, say). Empty if the agent has no record of the trial;
  /// FAILED_PRECONDITION, the files kept, otherwise.
  StatusOr<std::string> OwnedCheckpointDir(const std::string& key) const;
  /// Records the fencing token and returns the fence the scheduler calls before each step.
  StatusOr<std::function<Status()>> Fence(const Trial& trial, int64_t attempt,
                                          const std::string& dir) const;
  Status Confine(const std::string& field, const std::string& path,
                 const std::vector<std::string>& roots) const;
  void ForgetFinished();
  /// Starts the scheduler's drain once (on its own thread) and waits until it ends or
  /// `deadline`; DEADLINE_EXCEEDED then (the drain goes on).
  Status DrainUntil(const std::string& reason, std::chrono::system_clock::time_point deadline);
  bool CallerAllowed(grpc::ServerContext* context, std::string* why) const;
  v1::TrialStatus ToStatus(const TrialResult& result) const;
  void Broadcast(v1::TrialEvent event);
  static bool Wanted(const Watcher& w, const std::string& ns, const std::string& job);
  /// Whether a progress stream wants this trial's events (needs mu_ held).
  bool Watched(const Trial& trial) const;

  /// Each GPU's caching-allocator bytes to the metrics, checked against the ledger.
  void CheckAllocators(const std::vector<v1::Device>& devices);

  AgentConfig config_;
  executor::ExecutorFactoryInterface* factory_;
  AgentMetrics* metrics_;
  std::mutex tick_mu_;  // one Tick at a time (main's timer, Drain's gRPC thread); guards:
  AllocatorLedgerCheck allocator_check_;
  std::unique_ptr<TrialScheduler> scheduler_;

  mutable std::mutex mu_;  // guards trials_, watchers_, spill_seen_, busy_history_, shut_down_,
                           // drain_
  std::map<std::string, TrialInfo> trials_;  // by TrialKey
  uint64_t assignments_ = 0;                 // TrialInfo::assigned of the latest
  std::vector<Watcher*> watchers_;
  std::map<std::string, std::pair<int64_t, int64_t>> spill_seen_;    // disk read/written so far
  std::vector<std::deque<std::pair<double, double>>> busy_history_;  // (time, busy seconds)
  std::vector<double> busy_ratio_;
  bool shut_down_ = false;
  std::shared_future<Status> drain_;  // the drain under way or done; invalid before the first
};

/// hydra::Status -> grpc::Status (the codes are the same numbers).
grpc::Status ToGrpc(const Status& status);

}  // namespace hydra::agent
