#pragma once

#include <grpcpp/security/credentials.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "hydra/agent/v1/agent.grpc.pb.h"

namespace hydra::controller {

namespace v1 = ::hydra::agent::v1;

/// TLS settings for calling agents (PEM files); all empty: plaintext.
struct AgentTls {
  std::string ca_file;    ///< the agents' CA
  std::string cert_file;  ///< the controller's client certificate (mutual TLS)
  std::string key_file;
  /// The name the agents' certificates are checked against; empty: each endpoint's host.
  std::string server_name;
  /// More trusted CAs (PEM), beside ca_file's: the CA of jobs' own agent pods.
  std::string extra_ca_pem;
};

/// The agents as the controller uses them. An interface so that the reconciler's tests and the
/// controller benchmark can fake the agents at the gRPC boundary.
class AgentPoolInterface {
 public:
  virtual ~AgentPoolInterface() = default;
  virtual Status Assign(const std::string& endpoint, const v1::AssignTrialRequest& request,
                        v1::AssignTrialResponse* response) = 0;
  /// Cancels exactly the trial `trial` names (namespace, job, job uid and name).
  virtual Status Cancel(const std::string& endpoint, const v1::TrialRef& trial,
                        bool delete_checkpoints) = 0;
  /// Suspends exactly that trial: checkpointed, then INTERRUPTED (CancelTrial with checkpoint).
  virtual Status Suspend(const std::string& endpoint, const v1::TrialRef& trial) = 0;
  /// Early stopping: sets how far exactly the trial `trial` names may train, or stops it
  /// (LimitTrial).
  virtual Status Limit(const std::string& endpoint, const v1::LimitTrialRequest& request) = 0;
  /// The latest GetStatus of `endpoint` (refreshed in the background); NOT_FOUND if it was
  /// never reached, UNAVAILABLE if the last refresh failed (with the age of the data).
  virtual StatusOr<v1::GetStatusResponse> LastStatus(const std::string& endpoint) = 0;
  /// Asks the agent now (not the background copy); updates the copy.
  virtual StatusOr<v1::GetStatusResponse> FreshStatus(const std::string& endpoint) = 0;
  /// Endpoints to keep refreshing (the inventory's agents and those holding one job's trials;
  /// each job's pass tracks its own). An endpoint that no call has named for a while (the
  /// pool's `forget_after`) stops being polled and is forgotten.
  virtual void Track(const std::vector<std::string>& endpoints) = 0;
  /// Stops refreshing `endpoints` now and drops what is known of them: the job's own pods there
  /// are gone, and their addresses belong to nobody (or soon to another pod). A later Track
  /// that names one starts afresh.
  virtual void Forget(const std::vector<std::string>& endpoints) = 0;
  /// Seconds since `endpoint` last answered (since tracking began if it never did).
  virtual double SecondsSinceContact(const std::string& endpoint) = 0;
  /// Whether `endpoint` is an agent just seen whose first answer is still to be expected:
  /// tracked, never answered, and tracked for less than a first answer may take (a call's
  /// deadline and one retry: a connection or TLS handshake that missed the first deadline).
  /// Placement waits for it rather than giving every trial to the agents that happened to
  /// answer first.
  virtual bool FirstAnswerDue(const std::string& endpoint) = 0;
  /// With TLS: the name `endpoint`'s certificate must carry from now on (a job's own agent pod:
  /// a name of the job's), instead of the pool's default. A change drops the endpoint's channel
  /// and its last report (another agent may hold the address now).
  virtual void SetServerName(const std::string& endpoint, const std::string& server_name) = 0;
};

/// gRPC implementation: one channel and one long-lived poller thread per tracked endpoint,
/// calling GetStatus every `refresh` (a silent agent holds up no other), each call bounded by
/// `status_timeout`. A copy older than `refresh + status_timeout` (a call hangs: the network
/// is cut) reads UNAVAILABLE, so a cut-off agent is not reported alive from its last answer.
/// An endpoint no Track call has named for `forget_after` loses its poller and its entry.
class GrpcAgentPool : public AgentPoolInterface {
 public:
  static StatusOr<std::unique_ptr<GrpcAgentPool>> Create(
      const AgentTls& tls, std::chrono::milliseconds refresh = std::chrono::milliseconds(1000),
      std::chrono::milliseconds rpc_timeout = std::chrono::milliseconds(10000),
      std::chrono::milliseconds status_timeout = std::chrono::milliseconds(3000),
      std::chrono::milliseconds forget_after = std::chrono::minutes(2));
  ~GrpcAgentPool() override;

  Status Assign(const std::string& endpoint, const v1::AssignTrialRequest& request,
                v1::AssignTrialResponse* response) override;
  Status Cancel(const std::string& endpoint, const v1::TrialRef& trial,
                bool delete_checkpoints) override;
  Status Suspend(const std::string& endpoint, const v1::TrialRef& trial) override;
  Status Limit(const std::string& endpoint, const v1::LimitTrialRequest& request) override;
  StatusOr<v1::GetStatusResponse> LastStatus(const std::string& endpoint) override;
  void Track(const std::vector<std::string>& endpoints) override;
  void Forget(const std::vector<std::string>& endpoints) override;
  StatusOr<v1::GetStatusResponse> FreshStatus(const std::string& endpoint) override;
  double SecondsSinceContact(const std::string& endpoint) override;
  bool FirstAnswerDue(const std::string& endpoint) override;
  void SetServerName(const std::string& endpoint, const std::string& server_name) override;

  /// Pollers running now (one per tracked endpoint; tests check that none leak).
  size_t pollers() const;

 private:
  Status CallCancel(const std::string& endpoint, const v1::CancelTrialRequest& request);
  /// One endpoint's poller: stopped and joined when the endpoint is no longer tracked.
  struct Poller {
    std::atomic<bool> stop{false}, finished{false};
    std::mutex mu;
    std::condition_variable cv;
    std::thread thread;
  };
  struct Entry {
    std::shared_ptr<grpc::Channel> channel;  ///< the stub's
    std::shared_ptr<v1::AgentService::Stub> stub;
    std::string server_name;  ///< empty: the pool's
    v1::GetStatusResponse last;
    bool ever_ok = false, last_ok = false;
    std::string last_error;
    std::chrono::steady_clock::time_point last_ok_at;
    std::chrono::steady_clock::time_point tracked_since = std::chrono::steady_clock::now();
    std::chrono::steady_clock::time_point last_wanted = tracked_since;  // latest Track naming it
    std::shared_ptr<Poller> poller;
  };
  GrpcAgentPool() = default;
  std::shared_ptr<v1::AgentService::Stub> StubFor(const std::string& endpoint);
  /// The entry's stub, dialled with its server name if it has none (needs mu_ held).
  std::shared_ptr<v1::AgentService::Stub> StubLocked(const std::string& endpoint, Entry& e);
  /// Stops the entry's poller and hands it to Reap (needs mu_ held).
  void Retire(Entry& e);
  /// One GetStatus; the answer is kept if `poller` still owns the endpoint (null: always).
  /// Whether it answered.
  bool Refresh(const std::string& endpoint, const Poller* poller);
  /// Drives the endpoint's channel to connect for up to `refresh_`; whether it connected (false
  /// at once if it was connected already: the agent answered with an error). A failed
  /// call leaves gRPC reconnecting in the background, where a TLS handshake advances only on
  /// a backup poller's ticks seconds apart and can miss its connect deadline again and again.
  bool AwaitConnection(const std::string& endpoint, const Poller* poller);
  void Poll(std::string endpoint, std::shared_ptr<Poller> poller);
  /// Logs an answer that differs from the last one kept in `e` (needs mu_ held).
  static void LogTransition(const std::string& endpoint, const Entry& e, const grpc::Status& s);
  /// Joins retired pollers that finished (all of them with `all`); needs mu_ not held.
  void Reap(bool all);

  std::shared_ptr<grpc::ChannelCredentials> creds_;
  std::string server_name_;
  std::chrono::milliseconds refresh_{1000}, rpc_timeout_{10000}, status_timeout_{3000};
  std::chrono::milliseconds forget_after_{120000};
  mutable std::mutex mu_;
  std::map<std::string, Entry> entries_;
  std::vector<std::shared_ptr<Poller>> retired_;  // stopped, maybe not yet joined
};

/// grpc::Status -> hydra::Status (same code numbers), with the endpoint in the message.
hydra::Status FromGrpc(const grpc::Status& s, const std::string& what);

}  // namespace hydra::controller
