#pragma once

#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "common/trial_result.h"
#include "controller/agentclient/agent_client.h"
#include "controller/reconciler/reconciler.h"

namespace hydra::fakes {

namespace v1 = ::hydra::agent::v1;

/// Agents faked at the gRPC boundary, for unit tests of the reconciler's phases: each answers
/// GetStatus with its node, devices, dedicated job and the trials assigned to it; Assign queues
/// a trial (PENDING), Cancel, Suspend and Limit act on it as an agent would. The shared pool's
/// inventory (Prometheus) is the agents added with `shared`.
class FakeAgentPool : public controller::AgentPoolInterface,
                      public controller::InventorySourceInterface {
 public:
  struct Agent {
    std::string node;
    int64_t device_bytes = int64_t{16} << 30;
    bool shared = true;  ///< in the shared pool's inventory
    v1::JobRef dedicated;
    bool reachable = true;
    double silent_seconds = 0;
    bool hide_trials = false;       ///< LastStatus leaves the trials out
    bool first_answer_due = false;  ///< just tracked: its first GetStatus has not come back
    std::map<std::string, v1::TrialStatus> trials;  ///< by trial name
  };

  /// An agent with one device of `device_bytes` at `endpoint`.
  void AddAgent(const std::string& endpoint, const std::string& node, bool shared = true,
                int64_t device_bytes = int64_t{16} << 30) {
    std::lock_guard<std::mutex> lock(mu_);
    Agent& a = agents_[endpoint];
    a.node = node;
    a.shared = shared;
    a.device_bytes = device_bytes;
  }
  /// The agent of one job's pod (--dedicated-job).
  void AddPodAgent(const std::string& endpoint, const std::string& node, const std::string& ns,
                   const std::string& job, const std::string& uid) {
    AddAgent(endpoint, node, /*shared=*/false);
    std::lock_guard<std::mutex> lock(mu_);
    v1::JobRef& j = agents_[endpoint].dedicated;
    j.set_namespace_(ns);
    j.set_name(job);
    j.set_uid(uid);
  }
  void RemoveAgent(const std::string& endpoint) {
    std::lock_guard<std::mutex> lock(mu_);
    agents_.erase(endpoint);
  }
  /// Unreachable agents answer UNAVAILABLE and have been silent for `silent_seconds`.
  void SetReachable(const std::string& endpoint, bool reachable, double silent_seconds = 0) {
    std::lock_guard<std::mutex> lock(mu_);
    agents_[endpoint].reachable = reachable;
    agents_[endpoint].silent_seconds = silent_seconds;
  }
  /// Sets what the agent reports of trial `name` (it must have been assigned there).
  void SetTrialState(const std::string& endpoint, const std::string& name, v1::TrialState state,
                     int64_t step = 0, const std::string& message = "") {
    std::lock_guard<std::mutex> lock(mu_);
    v1::TrialStatus& t = agents_[endpoint].trials[name];
    t.set_state(state);
    t.set_step(step);
    t.set_message(message);
  }
  /// With `hide`, the agent's status reports no trials (a polled report older than the
  /// assignments); FreshStatus still shows them.
  void HideTrials(const std::string& endpoint, bool hide) {
    std::lock_guard<std::mutex> lock(mu_);
    agents_[endpoint].hide_trials = hide;
  }
  /// Trials assigned to `endpoint`, by name.
  std::map<std::string, v1::TrialStatus> TrialsOn(const std::string& endpoint) {
    std::lock_guard<std::mutex> lock(mu_);
    return agents_[endpoint].trials;
  }
  std::vector<std::string> tracked() {
    std::lock_guard<std::mutex> lock(mu_);
    return tracked_;
  }
  /// Calls made, as "Assign ep trial", "Cancel ep trial", "Suspend ep trial", "Limit ep trial".
  std::vector<std::string> calls() {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_;
  }
  /// The last AssignTrial request for trial `name` (empty if none).
  v1::AssignTrialRequest LastAssignment(const std::string& name) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = assigned_.find(name);
    return it == assigned_.end() ? v1::AssignTrialRequest() : it->second;
  }
  /// The next Assign fails with `status`.
  void FailNextAssign(Status status) {
    std::lock_guard<std::mutex> lock(mu_);
    assign_failures_.push_back(std::move(status));
  }

  Status Assign(const std::string& endpoint, const v1::AssignTrialRequest& request,
                v1::AssignTrialResponse*) override {
    std::lock_guard<std::mutex> lock(mu_);
    calls_.push_back("Assign " + endpoint + " " + request.trial().name());
    assigned_[request.trial().name()] = request;
    if (!assign_failures_.empty()) {
      Status s = assign_failures_.front();
      assign_failures_.erase(assign_failures_.begin());
      return s;
    }
    auto it = agents_.find(endpoint);
    if (it == agents_.end() || !it->second.reachable) return Unreachable(endpoint);
    v1::TrialStatus& t = it->second.trials[request.trial().name()];
    t.set_name(request.trial().name());
    t.set_job(request.trial().job());
    t.set_namespace_(request.trial().namespace_());
    t.set_job_uid(request.trial().job_uid());
    t.set_attempt(request.attempt());
    t.set_state(v1::PENDING);
    t.set_steps(request.trial().training().steps());
    t.set_step_limit(request.step_limit());
    t.set_last_checkpoint_step(-1);
    return OkStatus();
  }
  Status Cancel(const std::string& endpoint, const v1::TrialRef& trial, bool) override {
    return Act("Cancel", endpoint, trial, v1::CANCELLED, "");
  }
  Status Suspend(const std::string& endpoint, const v1::TrialRef& trial) override {
    return Act("Suspend", endpoint, trial, v1::INTERRUPTED,
               std::string(kSuspendedReason) + " at step 0");
  }
  Status Limit(const std::string& endpoint, const v1::LimitTrialRequest& request) override {
    return Act("Limit", endpoint, request.trial(),
               request.stop() ? v1::EARLY_STOPPED : v1::TRIAL_STATE_UNSPECIFIED, "");
  }
  StatusOr<v1::GetStatusResponse> LastStatus(const std::string& endpoint) override {
    return Report(endpoint, /*fresh=*/false);
  }
  StatusOr<v1::GetStatusResponse> FreshStatus(const std::string& endpoint) override {
    return Report(endpoint, /*fresh=*/true);
  }
  StatusOr<v1::GetStatusResponse> Report(const std::string& endpoint, bool fresh) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = agents_.find(endpoint);
    if (it == agents_.end() || (it->second.first_answer_due && !fresh)) {
      return NotFoundError(endpoint + ": never reached");
    }
    if (!it->second.reachable) return Unreachable(endpoint);
    it->second.first_answer_due = false;  // asked now, and it answered (as the pool's ever_ok)
    const Agent& a = it->second;
    v1::GetStatusResponse r;
    r.set_node_name(a.node);
    auto* dev = r.add_devices();
    dev->set_name("cpu:0");
    dev->set_memory_total_bytes(a.device_bytes);
    dev->set_memory_free_bytes(a.device_bytes);
    *r.mutable_dedicated_job() = a.dedicated;
    if (fresh || !a.hide_trials) {
      for (const auto& [name, t] : a.trials) *r.add_trials() = t;
    }
    return r;
  }
  void Track(const std::vector<std::string>& endpoints) override {
    std::lock_guard<std::mutex> lock(mu_);
    tracked_ = endpoints;
  }
  void Forget(const std::vector<std::string>& endpoints) override {
    std::lock_guard<std::mutex> lock(mu_);
    forgotten_.insert(forgotten_.end(), endpoints.begin(), endpoints.end());
  }
  /// Every endpoint Forget was called with, in order.
  std::vector<std::string> forgotten() {
    std::lock_guard<std::mutex> lock(mu_);
    return forgotten_;
  }
  double SecondsSinceContact(const std::string& endpoint) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = agents_.find(endpoint);
    return it == agents_.end() ? 1e9 : it->second.silent_seconds;
  }
  bool FirstAnswerDue(const std::string& endpoint) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = agents_.find(endpoint);
    return it != agents_.end() && it->second.first_answer_due;
  }
  /// An agent (AddAgent) just seen, whose first GetStatus has not come back (`due`), or has.
  void SetFirstAnswerDue(const std::string& endpoint, bool due) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = agents_.find(endpoint);
    if (it != agents_.end()) it->second.first_answer_due = due;
  }
  void SetServerName(const std::string& endpoint, const std::string& server_name) override {
    std::lock_guard<std::mutex> lock(mu_);
    server_names_[endpoint] = server_name;
  }
  /// The TLS name each endpoint's certificate must carry, as the reconciler set it.
  std::map<std::string, std::string> server_names() {
    std::lock_guard<std::mutex> lock(mu_);
    return server_names_;
  }
  StatusOr<std::vector<controller::AgentInventory>> Inventory() override {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<controller::AgentInventory> out;
    for (const auto& [ep, a] : agents_) {
      if (!a.shared) continue;
      controller::AgentInventory inv;
      inv.node = a.node;
      inv.endpoint = ep;
      controller::DeviceInventory d;
      d.name = "cpu:0";
      d.total_bytes = d.free_bytes = a.device_bytes;
      inv.devices.push_back(d);
      out.push_back(inv);
    }
    return out;
  }

 private:
  static Status Unreachable(const std::string& endpoint) {
    return UnavailableError(endpoint + ": connection refused");
  }
  Status Act(const char* what, const std::string& endpoint, const v1::TrialRef& ref,
             v1::TrialState state, const std::string& message) {
    std::lock_guard<std::mutex> lock(mu_);
    calls_.push_back(std::string(what) + " " + endpoint + " " + ref.name());
    auto it = agents_.find(endpoint);
    if (it == agents_.end() || !it->second.reachable) return Unreachable(endpoint);
    auto t = it->second.trials.find(ref.name());
    if (t == it->second.trials.end() || t->second.job_uid() != ref.job_uid()) {
      return NotFoundError(endpoint + ": no trial " + ref.name());
    }
    if (state != v1::TRIAL_STATE_UNSPECIFIED) {
      t->second.set_state(state);
      t->second.set_message(message);
    }
    return OkStatus();
  }

  std::mutex mu_;
  std::map<std::string, Agent> agents_;
  std::vector<std::string> tracked_, calls_, forgotten_;
  std::map<std::string, std::string> server_names_;
  std::vector<Status> assign_failures_;
  std::map<std::string, v1::AssignTrialRequest> assigned_;  // the last request per trial
};

}  // namespace hydra::fakes
