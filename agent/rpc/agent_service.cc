#include "agent/rpc/agent_service.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <thread>

#include "agent/executor/checkpoint.h"
#include "common/file_util.h"
#include "common/partitioner.h"
#include "common/units.h"
#include "proto/trial_proto.h"

namespace hydra::agent {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr size_t kMaxPathBytes = 4096;
constexpr int kMaxHyperparameters = 64;
constexpr double kBusyWindowSeconds = 60;

double Now() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }

/// The attempt recorded in an ATTEMPT file; -1 if there is none (or it is unreadable).
int64_t RecordedAttempt(const std::string& path) {
  auto text = ReadFile(path);
  if (!text.ok()) return -1;
  try {
    return std::stoll(*text);
  } catch (...) {
    return -1;
  }
}

bool IsFinal(const std::string& state) {
  return IsFinalTrialState(state) || state == kTrialInterrupted;
}

}  // namespace

grpc::Status ToGrpc(const Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), status.message());
}

AgentService::AgentService(AgentConfig config, executor::ExecutorFactoryInterface* factory,
                           AgentMetrics* metrics)
    : config_(std::move(config)), metrics_(metrics) {
  TrialSchedulerOptions options;
  options.devices = static_cast<int>(std::max<size_t>(1, config_.devices.size()));
  options.host_memory_bytes = config_.host_memory_bytes;
  options.spill_dir = config_.spill_dir;
  options.refuse_over_host_memory = true;
  options.record_schedule = false;
  busy_history_.resize(options.devices);
  busy_ratio_.assign(options.devices, 0.0);
  scheduler_ = std::make_unique<TrialScheduler>(factory, static_cast<TrialObserverInterface*>(this),
                                                options);
  Tick();
}

AgentService::~AgentService() {
  // The scheduler's threads call back into this object: stop them first.
  scheduler_.reset();
}

bool AgentService::CallerAllowed(grpc::ServerContext* context, std::string* why) const {
  if (config_.required_client_identity.empty()) return true;
  auto auth = context->auth_context();
  if (auth && auth->IsPeerAuthenticated()) {
    for (const char* property : {"x509_subject_alternative_name", "x509_common_name"}) {
      for (const auto& value : auth->FindPropertyValues(property)) {
        if (std::string(value.data(), value.size()) == config_.required_client_identity) {
          return true;
        }
      }
    }
  }
  *why = "the caller's client certificate does not name " + config_.required_client_identity;
  return false;
}

Status AgentService::Confine(const std::string& field, const std::string& path,
                             const std::vector<std::string>& roots) const {
  if (path.empty()) return InvalidArgumentError(field + ": required");
  if (path.size() > kMaxPathBytes || path.find('\0') != std::string::npos) {
    return InvalidArgumentError(field + ": not a usable path (over " +
                                std::to_string(kMaxPathBytes) + " bytes or has a NUL)");
  }
  if (path.front() != '/') {
    return InvalidArgumentError(field + ": must be an absolute path (got '" + path + "')");
  }
  std::error_code ec;
  // Resolves symlinks of the part that exists and ".." everywhere.
  const fs::path resolved = fs::weakly_canonical(fs::path(path), ec);
  if (ec) return InvalidArgumentError(field + ": cannot resolve " + path + ": " + ec.message());
  const std::string r = resolved.string();
  for (const auto& root : roots) {
    if (r == root || r.rfind(root + "/", 0) == 0) return OkStatus();
  }
  std::string allowed;
  for (const auto& root : roots) allowed += (allowed.empty() ? "" : ", ") + root;
  return PermissionDeniedError(field + ": " + path + " (resolved: " + r +
                               ") is outside the allowed roots (" +
                               (allowed.empty() ? "none configured" : allowed) + ")");
}

Status AgentService::CheckAssignment(const v1::AssignTrialRequest& request, Trial* out) const {
  if (!request.has_trial()) return InvalidArgumentError("trial: required");
  const auto& spec = request.trial();
  if (spec.job().size() > 253) return InvalidArgumentError("trial.job: longer than 253 bytes");
  if (spec.namespace_().size() > 63) {
    return InvalidArgumentError("trial.namespace: longer than 63 bytes");
  }
  if (spec.hyperparameters_size() > kMaxHyperparameters) {
    return InvalidArgumentError("trial.hyperparameters: more than " +
                                std::to_string(kMaxHyperparameters));
  }
  if (spec.dataset().path().size() > kMaxPathBytes) {
    return InvalidArgumentError("trial.dataset.path: longer than " + std::to_string(kMaxPathBytes) +
                                " bytes");
  }
  ASSIGN_OR_RETURN(Trial trial, wire::TrialFromProto(spec));
  // Paths: the dataset must be readable and the checkpoints writable only inside the roots.
  RETURN_IF_ERROR(Confine("trial.dataset.path", trial.dataset.resolved_path, config_.data_roots));
  if (!trial.model.resolved_path.empty()) {
    if (spec.model().path().size() > kMaxPathBytes) {
      return InvalidArgumentError("trial.model.path: longer than " + std::to_string(kMaxPathBytes) +
                                  " bytes");
    }
    RETURN_IF_ERROR(Confine("trial.model.path", trial.model.resolved_path, config_.data_roots));
  }
  RETURN_IF_ERROR(Confine("checkpoint_dir", request.checkpoint_dir(), config_.checkpoint_roots));
  // The controller's shard plan, if any: contiguous ranges covering every layer.
  const auto& plan = request.shard_plan();
  if (plan.shards_size() > 0) {
    const int last = static_cast<int>(trial.model.n_layer) + 1;
    int next = 0;
    for (int i = 0; i < plan.shards_size(); ++i) {
      const auto& sh = plan.shards(i);
      if (sh.first_layer() != next || sh.last_layer() < sh.first_layer() ||
          sh.last_layer() > last) {
        return InvalidArgumentError(
            "shard_plan.shards[" + std::to_string(i) + "]: layers " +
            std::to_string(sh.first_layer()) + ".." + std::to_string(sh.last_layer()) +
            " do not continue the plan at layer " + std::to_string(next) +
            " (shards are contiguous ranges of layers 0.." + std::to_string(last) + ")");
      }
      next = sh.last_layer() + 1;
    }
    if (next != last + 1) {
      return InvalidArgumentError("shard_plan: ends at layer " + std::to_string(next - 1) +
                                  ", before the last layer " + std::to_string(last));
    }
    trial.resources.shard_boundaries = wire::ShardBoundaries(plan);
  }
  // Device memory: every device of this node must hold the trial's budget.
  int64_t device_bytes = 0;
  for (const auto& d : config_.devices) {
    device_bytes = device_bytes == 0 ? d.memory_bytes : std::min(device_bytes, d.memory_bytes);
  }
  if (!trial.resources.device_memory_budget) {
    trial.resources.device_memory_budget = device_bytes;
  } else if (*trial.resources.device_memory_budget > device_bytes) {
    return ResourceExhaustedError("trial " + trial.name + " asks for a device memory budget of " +
                                  FormatBytes(*trial.resources.device_memory_budget) + " (" +
                                  std::to_string(*trial.resources.device_memory_budget) +
                                  " bytes); the devices of node " + config_.node_name + " have " +
                                  FormatBytes(device_bytes) + " (" + std::to_string(device_bytes) +
                                  " bytes)");
  }
  *out = std::move(trial);
  return OkStatus();
}

grpc::Status AgentService::AssignTrial(grpc::ServerContext* context,
                                       const v1::AssignTrialRequest* request,
                                       v1::AssignTrialResponse* response) {
  std::string why;
  if (!CallerAllowed(context, &why)) return grpc::Status(grpc::PERMISSION_DENIED, why);
  Trial trial;
  if (Status s = CheckAssignment(*request, &trial); !s.ok()) return ToGrpc(s);
  const std::string ckpt_dir = fs::path(request->checkpoint_dir()).lexically_normal().string();
  std::map<std::string, std::string> states;
  for (const auto& [name, state] : scheduler_->States()) states[name] = state;
  int64_t superseded_here = -1;  // an older attempt of this trial still active on this node
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shut_down_) return grpc::Status(grpc::UNAVAILABLE, "the agent is shutting down");
    size_t known = 0;
    for (const auto& [name, info] : trials_) {
      auto it = states.find(name);
      const bool active = it != states.end() && !IsFinal(it->second);
      known += 1;
      if (name == trial.name && it != states.end() && active && request->attempt() > 0 &&
          info.attempt < request->attempt()) {
        // The controller gave up on that attempt (this node was cut off, say) and now brings
        // the trial back: the old copy must stop before the new one may start.
        superseded_here = info.attempt;
        break;
      }
      if (name == trial.name && it != states.end() && (active || it->second == kTrialSucceeded)) {
        return grpc::Status(grpc::ALREADY_EXISTS, "trial " + name + " is already on node " +
                                                      config_.node_name + " (" + it->second + ")");
      }
      if (active && info.checkpoint_dir == ckpt_dir) {
        return grpc::Status(grpc::FAILED_PRECONDITION,
                            "checkpoint_dir " + ckpt_dir + " is in use by trial " + name);
      }
    }
    if (known >= config_.max_trials && !trials_.count(trial.name)) {
      return grpc::Status(grpc::RESOURCE_EXHAUSTED, "node " + config_.node_name +
                                                        " already holds " + std::to_string(known) +
                                                        " trials (the limit)");
    }
  }
  if (superseded_here >= 0) {
    Status cancelled = scheduler_->Cancel(trial.name);
    return grpc::Status(grpc::UNAVAILABLE,
                        "trial " + trial.name + ": attempt " + std::to_string(superseded_here) +
                            " is still stopping on node " + config_.node_name + " (" +
                            (cancelled.ok() ? "cancelled" : cancelled.message()) +
                            "); retry attempt " + std::to_string(request->attempt()));
  }
  // Resume-from: what the checkpoint directory holds must match what the controller expects.
  const auto steps = executor::CheckpointStore(ckpt_dir).Steps();
  const int64_t want = request->resume_from_step();
  if (want < 0 && !steps.empty()) {
    return grpc::Status(grpc::FAILED_PRECONDITION, "resume_from_step " + std::to_string(want) +
                                                       " asks for a fresh start, but " + ckpt_dir +
                                                       " holds the checkpoint of step " +
                                                       std::to_string(steps.back()));
  }
  if (want > 0 && (steps.empty() || steps.back() != want)) {
    return grpc::Status(
        grpc::FAILED_PRECONDITION,
        "resume_from_step " + std::to_string(want) + ": the newest checkpoint in " + ckpt_dir +
            " is " +
            (steps.empty() ? std::string("none") : "of step " + std::to_string(steps.back())));
  }
  const int64_t attempt = request->attempt();
  if (attempt < 0) return grpc::Status(grpc::INVALID_ARGUMENT, "attempt: must be >= 0");
  const std::string attempt_file = (fs::path(ckpt_dir) / "ATTEMPT").string();
  if (attempt > 0) {
    const int64_t recorded = RecordedAttempt(attempt_file);
    if (recorded > attempt) {
      return grpc::Status(grpc::FAILED_PRECONDITION,
                          "stale assignment: attempt " + std::to_string(attempt) + " of trial " +
                              trial.name + ", but attempt " + std::to_string(recorded) +
                              " already owns " + ckpt_dir);
    }
  }
  auto prepared = scheduler_->Prepare(trial, ckpt_dir);
  if (!prepared.ok()) return ToGrpc(prepared.status());
  if (attempt > 0) {
    // Record our fencing token; from now on an older holder of the trial stops at its next
    // step or checkpoint, and we stop if a newer one appears.
    std::error_code ec;
    fs::create_directories(ckpt_dir, ec);
    Status written = WriteFileAtomically(attempt_file, std::to_string(attempt) + "\n");
    if (!written.ok()) return ToGrpc(written.WithContext("recording the attempt"));
    const std::string name = trial.name;
    prepared->fence = [attempt_file, attempt, name]() -> Status {
      const int64_t now = RecordedAttempt(attempt_file);
      if (now == attempt) return OkStatus();
      return Status(StatusCode::kAborted,
                    now < 0
                        ? "superseded: the checkpoint directory of " + name + " is gone"
                        : "superseded: attempt " + std::to_string(now) + " of " + name +
                              " runs elsewhere (this was attempt " + std::to_string(attempt) + ")");
    };
  }
  TrialInfo info;
  info.job = request->trial().job();
  info.ns = request->trial().namespace_();
  info.checkpoint_dir = ckpt_dir;
  info.attempt = attempt;
  if (auto plan = PlanShards(trial, PartitionOptionsFor(trial)); plan.ok()) {
    wire::ShardPlanToProto(*plan, &info.plan);
  }
  std::optional<TrialInfo> previous;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = trials_.find(trial.name); it != trials_.end()) previous = it->second;
    trials_[trial.name] = info;
  }
  Status submitted = scheduler_->Submit(std::move(prepared).value());
  if (!submitted.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    if (previous) {
      trials_[trial.name] = *previous;
    } else {
      trials_.erase(trial.name);
    }
    return ToGrpc(submitted);
  }
  auto r = scheduler_->Get(trial.name);
  if (r.ok()) *response->mutable_trial() = ToStatus(*r);
  return grpc::Status::OK;
}

grpc::Status AgentService::CancelTrial(grpc::ServerContext* context,
                                       const v1::CancelTrialRequest* request,
                                       v1::CancelTrialResponse* response) {
  std::string why;
  if (!CallerAllowed(context, &why)) return grpc::Status(grpc::PERMISSION_DENIED, why);
  if (request->name().empty()) return grpc::Status(grpc::INVALID_ARGUMENT, "name: required");
  Status cancelled = scheduler_->Cancel(request->name());
  // An ended trial can still have its checkpoints removed.
  const bool ended = cancelled.code() == StatusCode::kFailedPrecondition;
  if (!cancelled.ok() && !(ended && request->delete_checkpoints())) return ToGrpc(cancelled);
  // A running trial stops after its current step: wait for that (up to 30 s or the caller's
  // deadline) so that the reply says CANCELLED; otherwise it says RUNNING and the progress
  // stream reports the end.
  const auto give_up = Clock::now() + std::chrono::seconds(30);
  auto r = scheduler_->Get(request->name());
  while (r.ok() && !IsFinal(r->state) && Clock::now() < give_up && !context->IsCancelled()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    r = scheduler_->Get(request->name());
  }
  if (request->delete_checkpoints() && r.ok() && IsFinal(r->state)) {
    std::string dir;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (auto it = trials_.find(request->name()); it != trials_.end()) {
        dir = it->second.checkpoint_dir;
      }
    }
    // The directory was confined to the checkpoint roots when the trial was assigned.
    std::error_code ec;
    if (!dir.empty()) fs::remove_all(dir, ec);
    if (ec) {
      return grpc::Status(grpc::INTERNAL, "removing " + dir + ": " + ec.message());
    }
  }
  if (r.ok()) *response->mutable_trial() = ToStatus(*r);
  return grpc::Status::OK;
}

std::vector<v1::Device> AgentService::Devices() const {
  std::vector<v1::Device> out;
  std::vector<double> busy;
  {
    std::lock_guard<std::mutex> lock(mu_);
    busy = busy_ratio_;
  }
  for (size_t d = 0; d < config_.devices.size(); ++d) {
    v1::Device dev;
    dev.set_name(config_.devices[d].name);
    const int64_t total = config_.devices[d].memory_bytes;
    const int64_t used = scheduler_->DeviceBytesInUse(static_cast<int>(d));
    dev.set_memory_total_bytes(total);
    dev.set_memory_used_bytes(used);
    dev.set_memory_free_bytes(std::max<int64_t>(0, total - used));
    dev.set_busy_ratio(d < busy.size() ? busy[d] : 0.0);
    out.push_back(dev);
  }
  return out;
}

grpc::Status AgentService::GetStatus(grpc::ServerContext* context, const v1::GetStatusRequest*,
                                     v1::GetStatusResponse* response) {
  std::string why;
  if (!CallerAllowed(context, &why)) return grpc::Status(grpc::PERMISSION_DENIED, why);
  response->set_node_name(config_.node_name);
  response->set_version(config_.version);
  response->set_draining(scheduler_->draining());
  for (auto& d : Devices()) *response->add_devices() = std::move(d);
  for (const auto& r : scheduler_->Snapshot()) *response->add_trials() = ToStatus(r);
  return grpc::Status::OK;
}

v1::TrialStatus AgentService::ToStatus(const TrialResult& r) const {
  v1::TrialStatus out;
  wire::TrialResultToProto(r, &out);
  if (r.device >= 0 && r.device < static_cast<int>(config_.devices.size())) {
    out.set_device(config_.devices[r.device].name);
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = trials_.find(r.trial.name); it != trials_.end()) {
    out.set_job(it->second.job);
    out.set_namespace_(it->second.ns);
    out.set_checkpoint_dir(it->second.checkpoint_dir);
    *out.mutable_shard_plan() = it->second.plan;
    out.set_attempt(it->second.attempt);
    for (const auto& w : it->second.warnings) out.add_warnings(w);
  }
  return out;
}

grpc::Status AgentService::WatchProgress(grpc::ServerContext* context,
                                         const v1::WatchProgressRequest* request,
                                         grpc::ServerWriter<v1::TrialEvent>* writer) {
  std::string why;
  if (!CallerAllowed(context, &why)) return grpc::Status(grpc::PERMISSION_DENIED, why);
  Watcher w;
  w.job = request->job();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shut_down_) return grpc::Status(grpc::UNAVAILABLE, "the agent is shutting down");
    watchers_.push_back(&w);
  }
  auto unregister = [&] {
    std::lock_guard<std::mutex> lock(mu_);
    watchers_.erase(std::remove(watchers_.begin(), watchers_.end(), &w), watchers_.end());
  };
  // The snapshot first; events that arrive meanwhile wait in `w` and follow it.
  for (const auto& r : scheduler_->Snapshot()) {
    v1::TrialEvent e;
    e.set_kind(v1::TrialEvent::SNAPSHOT);
    *e.mutable_trial() = ToStatus(r);
    if (!w.job.empty() && e.trial().job() != w.job) continue;
    if (!writer->Write(e)) {
      unregister();
      return grpc::Status::OK;  // the client went away
    }
  }
  std::vector<v1::TrialEvent> batch;
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      w.cv.wait_for(lock, std::chrono::milliseconds(250),
                    [&] { return !w.order.empty() || shut_down_; });
      if (context->IsCancelled() || (shut_down_ && w.order.empty())) break;
      for (const auto& name : w.order) {
        batch.push_back(std::move(w.pending[name]));
        w.pending.erase(name);
      }
      w.order.clear();
      if (!batch.empty() && w.dropped) {
        batch.front().set_events_dropped(true);
        w.dropped = false;
      }
    }
    bool ok = true;
    for (const auto& e : batch) {
      if (!(ok = writer->Write(e))) break;
    }
    batch.clear();
    if (!ok) break;  // the client went away mid-stream
  }
  unregister();
  return grpc::Status::OK;
}

grpc::Status AgentService::Drain(grpc::ServerContext* context, const v1::DrainRequest*,
                                 v1::DrainResponse* response) {
  std::string why;
  if (!CallerAllowed(context, &why)) return grpc::Status(grpc::PERMISSION_DENIED, why);
  Status s = scheduler_->Drain("drained");
  for (const auto& r : scheduler_->Snapshot()) *response->add_trials() = ToStatus(r);
  Tick();
  return ToGrpc(s);
}

Status AgentService::Shutdown(const std::string& reason) {
  Status s = scheduler_->Drain(reason);
  Tick();
  {
    std::lock_guard<std::mutex> lock(mu_);
    shut_down_ = true;
    for (Watcher* w : watchers_) w->cv.notify_all();
  }
  return s;
}

std::string AgentService::NotReadyReason() const {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shut_down_) return "shutting down";
  }
  if (scheduler_->draining()) return "draining: accepts no trials";
  return "";
}

void AgentService::Broadcast(v1::TrialEvent event) {
  // Needs mu_ held.
  for (Watcher* w : watchers_) {
    if (!w->job.empty() && event.trial().job() != w->job) continue;
    const std::string& name = event.trial().name();
    auto it = w->pending.find(name);
    if (it == w->pending.end()) {
      w->order.push_back(name);
      w->pending.emplace(name, event);
    } else {
      // Coalesce: the client gets the latest status; a state change stays a state change.
      const bool state = it->second.kind() == v1::TrialEvent::STATE;
      it->second = event;
      if (state) it->second.set_kind(v1::TrialEvent::STATE);
      w->dropped = true;
    }
    w->cv.notify_all();
  }
}

void AgentService::OnTrialUpdate(const TrialResult& snapshot) {
  v1::TrialEvent event;
  *event.mutable_trial() = ToStatus(snapshot);
  std::string job;
  int64_t read_delta = 0, write_delta = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = trials_.find(snapshot.trial.name);
    if (it != trials_.end()) job = it->second.job;
    auto& seen = spill_seen_[snapshot.trial.name];
    // A new run of the trial (resubmitted) restarts the executor's counters.
    if (snapshot.disk_bytes_read < seen.first || snapshot.disk_bytes_written < seen.second) {
      seen = {0, 0};
    }
    read_delta = snapshot.disk_bytes_read - seen.first;
    write_delta = snapshot.disk_bytes_written - seen.second;
    seen = {snapshot.disk_bytes_read, snapshot.disk_bytes_written};
    const bool state_changed = it == trials_.end() || it->second.last_state != snapshot.state;
    if (it != trials_.end()) it->second.last_state = snapshot.state;
    event.set_kind(state_changed ? v1::TrialEvent::STATE : v1::TrialEvent::STEP);
    Broadcast(event);
  }
  if (metrics_) {
    metrics_->SetTrialProgress(event.trial().namespace_(), job, snapshot.trial.name, snapshot.step,
                               event.trial().train_loss(), event.trial().validation_loss(),
                               snapshot.tokens_per_second);
    metrics_->AddSpillBytes("disk", "read", read_delta);
    metrics_->AddSpillBytes("disk", "write", write_delta);
  }
}

void AgentService::OnTrialMessage(const std::string& trial, const std::string& message) {
  std::fprintf(stderr, "hydra-agent: %s: %s\n", trial.c_str(), message.c_str());
  std::lock_guard<std::mutex> lock(mu_);
  auto it = trials_.find(trial);
  if (it == trials_.end()) return;
  it->second.warnings.push_back(message);
  if (it->second.warnings.size() > 10) it->second.warnings.erase(it->second.warnings.begin());
}

void AgentService::OnStep(const std::string&, int, double, int64_t shards, bool evaluated) {
  if (!metrics_) return;
  metrics_->AddShardTasks("forward", shards);
  metrics_->AddShardTasks("backward", shards);
  metrics_->AddShardTasks("optimizer", shards);
  if (evaluated) metrics_->AddShardTasks("evaluate", shards);
}

void AgentService::OnCheckpoint(const std::string&, double seconds) {
  if (metrics_) metrics_->ObserveCheckpoint(seconds);
}

void AgentService::Tick() {
  const double now = Now();
  const auto busy = scheduler_->BusySeconds();
  std::map<std::string, int64_t> counts;
  for (const auto& [name, state] : scheduler_->States()) counts[state] += 1;
  std::vector<double> ratios;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t d = 0; d < busy_history_.size() && d < busy.size(); ++d) {
      auto& h = busy_history_[d];
      h.push_back({now, busy[d]});
      while (h.size() > 2 && h[1].first <= now - kBusyWindowSeconds) h.pop_front();
      const double span = h.back().first - h.front().first;
      busy_ratio_[d] =
          span > 0 ? std::clamp((h.back().second - h.front().second) / span, 0.0, 1.0) : 0.0;
    }
    ratios = busy_ratio_;
  }
  if (!metrics_) return;
  for (const auto& d : Devices()) {
    metrics_->SetDevice(d.name(), d.memory_total_bytes(), d.memory_free_bytes(),
                        d.memory_used_bytes(), d.busy_ratio());
  }
  metrics_->SetTrialsByState(counts);
}

}  // namespace hydra::agent
