#include "agent/rpc/agent_service.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <optional>
#include <thread>

#include "agent/executor/checkpoint.h"
#include "agent/rpc/trial_paths.h"
#include "common/devices.h"
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

/// The attempt recorded in an ATTEMPT file; -1 if there is none (or it is unreadable, or
/// something other than the file the agent writes stands there).
int64_t RecordedAttempt(const std::string& path) {
  auto text = ReadOwnFile(path, 64);
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

/// The controller's shard plan, if any: contiguous ranges covering every layer; its boundaries
/// become the trial's.
Status CheckShardPlan(const v1::ShardPlan& plan, Trial* trial) {
  if (plan.shards_size() == 0) return OkStatus();
  const int last = static_cast<int>(trial->model.n_layer) + 1;
  int next = 0;
  for (int i = 0; i < plan.shards_size(); ++i) {
    const auto& sh = plan.shards(i);
    if (sh.first_layer() != next || sh.last_layer() < sh.first_layer() || sh.last_layer() > last) {
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
  trial->resources.shard_boundaries = wire::ShardBoundaries(plan);
  return OkStatus();
}

/// Every device of this node must hold the trial's device budget; unset, it gets theirs.
Status FitDeviceBudget(const AgentConfig& config, Trial* trial) {
  int64_t device_bytes = 0;
  for (const auto& d : config.devices) {
    device_bytes = device_bytes == 0 ? d.memory_bytes : std::min(device_bytes, d.memory_bytes);
  }
  auto& budget = trial->resources.device_memory_budget;
  if (!budget) {
    budget = device_bytes;
    return OkStatus();
  }
  if (*budget <= device_bytes) return OkStatus();
  return ResourceExhaustedError(
      "trial " + trial->name + " asks for a device memory budget of " + FormatBytes(*budget) +
      " (" + std::to_string(*budget) + " bytes); the devices of node " + config.node_name +
      " have " + FormatBytes(device_bytes) + " (" + std::to_string(device_bytes) + " bytes)");
}

}  // namespace

grpc::Status ToGrpc(const Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), status.message());
}

AgentService::AgentService(AgentConfig config, executor::ExecutorFactoryInterface* factory,
                           AgentMetrics* metrics)
    : config_(std::move(config)), factory_(factory), metrics_(metrics) {
  TrialSchedulerOptions options;
  options.devices = static_cast<int>(std::max<size_t>(1, config_.devices.size()));
  options.device_memory_bytes = DiscreteDeviceMemory(config_.devices);
  options.host_memory_bytes = config_.host_memory_bytes;
  options.spill_dir = config_.spill_dir;
  options.refuse_over_host_memory = true;
  options.record_schedule = false;
  options.threads = config_.threads_per_device;
  options.cpu = CpuModelName();
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
  const std::string& want = config_.required_client_identity;
  if (want.empty()) return true;
  auto auth = context->auth_context();
  if (auth && auth->IsPeerAuthenticated()) {
    // A certificate's SANs identify it when it has any; its CN only when it has none (RFC
    // 6125's rule for servers, applied to clients).
    auto names = auth->FindPropertyValues("x509_subject_alternative_name");
    if (names.empty()) names = auth->FindPropertyValues("x509_common_name");
    for (const auto& value : names) {
      if (std::string(value.data(), value.size()) == want) return true;
    }
  }
  *why = "the caller's client certificate does not name " + want +
         " (in its SANs, or its CN when it has no SAN)";
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

namespace {

/// A request's trial identity: all four parts, so that only that exact trial is `what`.
Status CheckRef(const v1::TrialRef& ref, const std::string& what) {
  for (const auto& [field, value] :
       {std::pair<const char*, const std::string*>{"trial.namespace", &ref.namespace_()},
        {"trial.job", &ref.job()},
        {"trial.jobUid", &ref.job_uid()},
        {"trial.name", &ref.name()}}) {
    if (value->empty()) {
      return InvalidArgumentError(std::string(field) +
                                  ": required (a trial is namespace, job, job uid and name; only "
                                  "that exact trial is " +
                                  what + ")");
    }
  }
  return OkStatus();
}

}  // namespace

Status AgentService::CheckAssignment(const v1::AssignTrialRequest& request, Trial* out,
                                     std::string* checkpoint_dir) const {
  if (!request.has_trial()) return InvalidArgumentError("trial: required");
  if (request.step_limit() < 0) {
    return InvalidArgumentError("step_limit: " + std::to_string(request.step_limit()) +
                                " is negative (0: train to the end)");
  }
  const auto& spec = request.trial();
  if (spec.hyperparameters_size() > kMaxHyperparameters) {
    return InvalidArgumentError("trial.hyperparameters: more than " +
                                std::to_string(kMaxHyperparameters));
  }
  for (const auto& [field, value] :
       {std::pair<const char*, const std::string*>{"trial.dataset.path", &spec.dataset().path()},
        {"trial.model.path", &spec.model().path()},
        {"trial.model.init.path", &spec.model().init().path()},
        {"checkpoint_dir", &request.checkpoint_dir()}}) {
    if (value->size() > kMaxPathBytes) {
      return InvalidArgumentError(std::string(field) + ": longer than " +
                                  std::to_string(kMaxPathBytes) + " bytes");
    }
  }
  // The identity: all four parts, so that nothing can address another tenant's trial.
  for (const auto& [field, value] :
       {std::pair<const char*, const std::string*>{"trial.namespace", &spec.namespace_()},
        {"trial.job", &spec.job()},
        {"trial.jobUid", &spec.job_uid()}}) {
    if (value->empty()) {
      return InvalidArgumentError(std::string(field) +
                                  ": required (a trial is namespace, job, job uid and name)");
    }
  }
  RETURN_IF_ERROR(CheckDedicatedJob(config_.dedicated_job, spec.namespace_(), spec.job(),
                                    spec.job_uid(), "assigned"));
  ASSIGN_OR_RETURN(Trial trial, wire::TrialFromProto(spec));
  // Paths: the dataset must be readable and the checkpoints writable only inside the roots.
  RETURN_IF_ERROR(Confine("trial.dataset.path", trial.dataset.resolved_path, config_.data_roots));
  if (!trial.model.resolved_path.empty()) {
    RETURN_IF_ERROR(Confine("trial.model.path", trial.model.resolved_path, config_.data_roots));
  }
  if (trial.model.init) {
    RETURN_IF_ERROR(
        Confine("trial.model.init.path", trial.model.init->resolved_path, config_.data_roots));
  }
  RETURN_IF_ERROR(Confine("checkpoint_dir", request.checkpoint_dir(), config_.checkpoint_roots));
  ASSIGN_OR_RETURN(*checkpoint_dir, ResolvePath(request.checkpoint_dir()));
  RETURN_IF_ERROR(CheckCheckpointLayout(trial, *checkpoint_dir, config_.checkpoint_roots));
  RETURN_IF_ERROR(CheckShardPlan(request.shard_plan(), &trial));
  RETURN_IF_ERROR(FitDeviceBudget(config_, &trial));
  *out = std::move(trial);
  return OkStatus();
}

grpc::Status AgentService::CheckAgainstKnown(const Trial& trial, int64_t attempt,
                                             const std::string& dir, int64_t* superseded) const {
  std::map<std::string, std::string> states;
  for (const auto& [key, state] : scheduler_->States()) states[key] = state;
  const std::string key = TrialKey(trial);
  std::lock_guard<std::mutex> lock(mu_);
  if (shut_down_) return grpc::Status(grpc::UNAVAILABLE, "the agent is shutting down");
  size_t live = 0;
  for (const auto& [k, info] : trials_) {
    auto it = states.find(k);
    if (it == states.end()) continue;
    const bool active = !IsFinal(it->second);
    live += active;
    if (k == key) {
      if (active && attempt > 0 && info.attempt < attempt) {
        // The controller gave up on that attempt (this node was cut off, say) and now brings
        // the trial back: the old copy must stop before the new one may start.
        *superseded = info.attempt;
      } else if (active || it->second == kTrialSucceeded) {
        if (attempt > 0 && info.attempt > attempt) {
          return grpc::Status(grpc::FAILED_PRECONDITION,
                              "stale assignment: attempt " + std::to_string(attempt) + " of " +
                                  TrialDisplayName(trial) + ", but attempt " +
                                  std::to_string(info.attempt) + " is here (" + it->second + ")");
        }
        return grpc::Status(grpc::ALREADY_EXISTS, "trial " + TrialDisplayName(trial) +
                                                      " (attempt " + std::to_string(info.attempt) +
                                                      ") is already on node " + config_.node_name +
                                                      " (" + it->second + ")");
      }
    } else if (active && PathsNest(info.checkpoint_dir, dir)) {
      return grpc::Status(grpc::FAILED_PRECONDITION,
                          "checkpoint_dir " + dir + " is, contains or lies inside " +
                              info.checkpoint_dir + ", the checkpoint directory of another trial");
    }
  }
  if (*superseded < 0 && live >= config_.max_trials) {
    return grpc::Status(grpc::RESOURCE_EXHAUSTED,
                        "node " + config_.node_name + " already trains " + std::to_string(live) +
                            " trials (--max-trials " + std::to_string(config_.max_trials) + ")");
  }
  return grpc::Status::OK;
}

StatusOr<std::string> AgentService::OwnedCheckpointDir(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = trials_.find(key);
  if (it == trials_.end()) return std::string();
  const TrialInfo& info = it->second;
  for (const auto& [other, other_info] : trials_) {
    if (other_info.assigned > info.assigned &&
        PathsNest(other_info.checkpoint_dir, info.checkpoint_dir)) {
      return FailedPreconditionError("checkpoint_dir " + info.checkpoint_dir +
                                     " is also that of trial " + other +
                                     ", assigned later: its files are kept");
    }
  }
  // A newer attempt of this very trial (ATTEMPT, on another node) is not spared: the caller
  // deletes the trial, and removing ATTEMPT stops that copy at its fence.
  return info.checkpoint_dir;
}

StatusOr<std::function<Status()>> AgentService::Fence(const Trial& trial, int64_t attempt,
                                                      const std::string& dir) const {
  const std::string attempt_file = (fs::path(dir) / "ATTEMPT").string();
  const int64_t recorded = RecordedAttempt(attempt_file);
  if (recorded > attempt) {
    return FailedPreconditionError("stale assignment: attempt " + std::to_string(attempt) +
                                   " of trial " + TrialDisplayName(trial) + ", but attempt " +
                                   std::to_string(recorded) + " already owns " + dir);
  }
  // Record our fencing token; from now on an older holder of the trial stops at its next step
  // or checkpoint, and we stop if a newer one appears.
  RETURN_IF_ERROR(CreateCheckedDirectory(dir));
  RETURN_IF_ERROR(WriteFileAtomically(attempt_file, std::to_string(attempt) + "\n")
                      .WithContext("recording the attempt"));
  const std::string name = TrialDisplayName(trial);
  return std::function<Status()>([attempt_file, attempt, name]() -> Status {
    const int64_t now = RecordedAttempt(attempt_file);
    if (now == attempt) return OkStatus();
    return Status(StatusCode::kAborted,
                  now < 0
                      ? "superseded: the checkpoint directory of " + name + " is gone"
                      : "superseded: attempt " + std::to_string(now) + " of " + name +
                            " runs elsewhere (this was attempt " + std::to_string(attempt) + ")");
  });
}

grpc::Status AgentService::AssignTrial(grpc::ServerContext* context,
                                       const v1::AssignTrialRequest* request,
                                       v1::AssignTrialResponse* response) {
  std::string why;
  if (!CallerAllowed(context, &why)) return grpc::Status(grpc::PERMISSION_DENIED, why);
  const int64_t attempt = request->attempt();
  if (attempt < 0) return grpc::Status(grpc::INVALID_ARGUMENT, "attempt: must be >= 0");
  if (const std::string dead = NotLiveReason(); !dead.empty()) {
    return grpc::Status(grpc::UNAVAILABLE, "node " + config_.node_name + ": " + dead);
  }
  Trial trial;
  std::string ckpt_dir;
  if (Status s = CheckAssignment(*request, &trial, &ckpt_dir); !s.ok()) return ToGrpc(s);
  const std::string key = TrialKey(trial);
  int64_t superseded = -1;
  if (grpc::Status s = CheckAgainstKnown(trial, attempt, ckpt_dir, &superseded); !s.ok()) {
    return s;
  }
  if (superseded >= 0) {
    Status cancelled = scheduler_->Cancel(key);
    return grpc::Status(grpc::UNAVAILABLE,
                        "trial " + TrialDisplayName(trial) + ": attempt " +
                            std::to_string(superseded) + " is still stopping on node " +
                            config_.node_name + " (" +
                            (cancelled.ok() ? "cancelled" : cancelled.message()) +
                            "); retry attempt " + std::to_string(attempt));
  }
  // Resume-from: what the checkpoint directory holds must match what the controller expects.
  const auto listed = executor::CheckpointStore(ckpt_dir).Steps();
  if (!listed.ok()) return ToGrpc(listed.status());
  const std::vector<int64_t>& steps = *listed;
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
  auto prepared = scheduler_->Prepare(trial, ckpt_dir);
  if (!prepared.ok()) return ToGrpc(prepared.status());
  if (attempt > 0) {
    auto fence = Fence(trial, attempt, ckpt_dir);
    if (!fence.ok()) return ToGrpc(fence.status());
    prepared->fence = std::move(fence).value();
  } else if (Status s = CreateCheckedDirectory(ckpt_dir); !s.ok()) {
    return ToGrpc(s);
  }
  prepared->step_limit = request->step_limit();
  TrialInfo info;
  info.checkpoint_dir = ckpt_dir;
  info.attempt = attempt;
  wire::ShardPlanToProto(prepared->admission.plan, &info.plan);
  std::optional<TrialInfo> previous;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = trials_.find(key); it != trials_.end()) previous = it->second;
    info.assigned = ++assignments_;
    trials_[key] = info;
  }
  Status submitted = scheduler_->Submit(std::move(prepared).value());
  if (!submitted.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    if (previous) {
      trials_[key] = *previous;
    } else {
      trials_.erase(key);
    }
    return ToGrpc(submitted);
  }
  auto r = scheduler_->Get(key);
  if (r.ok()) *response->mutable_trial() = ToStatus(*r);
  return grpc::Status::OK;
}

grpc::Status AgentService::CancelTrial(grpc::ServerContext* context,
                                       const v1::CancelTrialRequest* request,
                                       v1::CancelTrialResponse* response) {
  std::string why;
  if (!CallerAllowed(context, &why)) return grpc::Status(grpc::PERMISSION_DENIED, why);
  const auto& ref = request->trial();
  if (Status s = CheckRef(ref, "cancelled"); !s.ok()) return ToGrpc(s);
  if (Status s = CheckDedicatedJob(config_.dedicated_job, ref.namespace_(), ref.job(),
                                   ref.job_uid(), "cancelled");
      !s.ok()) {
    return ToGrpc(s);
  }
  if (request->checkpoint() && request->delete_checkpoints()) {
    return grpc::Status(grpc::INVALID_ARGUMENT,
                        "checkpoint and delete_checkpoints: a suspended trial keeps its "
                        "checkpoints; ask for one or the other");
  }
  const std::string key = wire::TrialKeyOf(ref);
  Status cancelled =
      request->checkpoint() ? scheduler_->Suspend(key, kSuspendedReason) : scheduler_->Cancel(key);
  // An ended trial can still have its checkpoints removed.
  const bool ended = cancelled.code() == StatusCode::kFailedPrecondition;
  if (!cancelled.ok() && !(ended && request->delete_checkpoints())) return ToGrpc(cancelled);
  if (request->checkpoint()) {
    // A suspension is not waited for: the trial checkpoints after its current step and the
    // progress stream and GetStatus report it INTERRUPTED (the controller reads it there).
    if (auto r = scheduler_->Get(key); r.ok()) *response->mutable_trial() = ToStatus(*r);
    return grpc::Status::OK;
  }
  // A running trial stops after its current step: wait for that (up to 30 s or the caller's
  // deadline) so that the reply says CANCELLED; otherwise it says RUNNING and the progress
  // stream reports the end.
  const auto until_deadline = context->deadline() - std::chrono::system_clock::now();
  const auto wait = std::min<std::chrono::steady_clock::duration>(
      std::chrono::seconds(30),
      std::max<std::chrono::steady_clock::duration>(
          std::chrono::seconds(0),
          std::chrono::duration_cast<std::chrono::steady_clock::duration>(until_deadline)));
  auto r = scheduler_->WaitEnded(key, Clock::now() + wait);
  if (request->delete_checkpoints() && r.ok() && IsFinal(r->state)) {
    // Only the trial's own files, in the directory checked against its identity when it
    // was assigned, and only while nobody else's are there.
    auto dir = OwnedCheckpointDir(key);
    if (!dir.ok()) return ToGrpc(dir.status());
    if (!dir->empty()) {
      if (Status removed = RemoveTrialFiles(*dir); !removed.ok()) return ToGrpc(removed);
    }
  }
  if (r.ok()) *response->mutable_trial() = ToStatus(*r);
  return grpc::Status::OK;
}

grpc::Status AgentService::LimitTrial(grpc::ServerContext* context,
                                      const v1::LimitTrialRequest* request,
                                      v1::LimitTrialResponse* response) {
  std::string why;
  if (!CallerAllowed(context, &why)) return grpc::Status(grpc::PERMISSION_DENIED, why);
  const auto& ref = request->trial();
  if (Status s = CheckRef(ref, "limited"); !s.ok()) return ToGrpc(s);
  if (Status s = CheckDedicatedJob(config_.dedicated_job, ref.namespace_(), ref.job(),
                                   ref.job_uid(), "limited");
      !s.ok()) {
    return ToGrpc(s);
  }
  if (!request->stop() && request->step_limit() < 0) {
    return grpc::Status(grpc::INVALID_ARGUMENT,
                        "step_limit: " + std::to_string(request->step_limit()) +
                            " is negative (0: train to the end)");
  }
  const std::string key = wire::TrialKeyOf(ref);
  const Status done =
      request->stop()
          ? scheduler_->StopEarly(key, request->reason().empty() ? "stopped early by the controller"
                                                                 : request->reason())
          : scheduler_->SetStepLimit(key, request->step_limit());
  if (!done.ok()) return ToGrpc(done);
  if (auto r = scheduler_->Get(key); r.ok()) *response->mutable_trial() = ToStatus(*r);
  return grpc::Status::OK;
}

std::vector<v1::Device> AgentService::Devices() const {
  std::vector<v1::Device> out;
  std::vector<double> busy;
  {
    std::lock_guard<std::mutex> lock(mu_);
    busy = busy_ratio_;
  }
  const auto failed = scheduler_->FailedDevices();
  for (size_t d = 0; d < config_.devices.size(); ++d) {
    v1::Device dev;
    dev.set_name(config_.devices[d].name);
    dev.set_uuid(config_.devices[d].uuid);
    dev.set_model(config_.devices[d].model);
    const int64_t total = config_.devices[d].memory_bytes;
    const int64_t used = scheduler_->DeviceBytesInUse(static_cast<int>(d));
    auto it = failed.find(static_cast<int>(d));
    dev.set_memory_total_bytes(total);
    dev.set_memory_used_bytes(used);
    // A failed device has no room for anyone: placement counts on the others.
    dev.set_memory_free_bytes(it != failed.end() ? 0 : std::max<int64_t>(0, total - used));
    if (it != failed.end()) dev.set_failure(it->second);
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
  if (config_.dedicated_job) {
    auto* job = response->mutable_dedicated_job();
    job->set_namespace_(config_.dedicated_job->namespace_);
    job->set_name(config_.dedicated_job->name);
    job->set_uid(config_.dedicated_job->uid);
  }
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
  if (auto it = trials_.find(TrialKey(r.trial)); it != trials_.end()) {
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
  w.ns = request->namespace_();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shut_down_) return grpc::Status(grpc::UNAVAILABLE, "the agent is shutting down");
    if (watchers_.size() >= config_.max_watchers) {
      return grpc::Status(grpc::RESOURCE_EXHAUSTED,
                          "node " + config_.node_name + " already serves " +
                              std::to_string(watchers_.size()) + " progress streams (the limit)");
    }
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
    if (!Wanted(w, e.trial().namespace_(), e.trial().job())) continue;
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
      for (const auto& key : w.order) {
        batch.push_back(std::move(w.pending[key]));
        w.pending.erase(key);
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

Status AgentService::DrainUntil(const std::string& reason,
                                std::chrono::system_clock::time_point deadline) {
  std::shared_future<Status> drain;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!drain_.valid()) {
      drain_ = std::async(std::launch::async, [this, reason] {
                 return scheduler_->Drain(reason);
               }).share();
    }
    drain = drain_;
  }
  if (drain.wait_until(deadline) != std::future_status::ready) {
    return DeadlineExceededError(
        "the drain goes on (running steps end, then every trial is checkpointed); GetStatus "
        "reports the trials INTERRUPTED once it is done");
  }
  return drain.get();
}

grpc::Status AgentService::Drain(grpc::ServerContext* context, const v1::DrainRequest*,
                                 v1::DrainResponse* response) {
  std::string why;
  if (!CallerAllowed(context, &why)) return grpc::Status(grpc::PERMISSION_DENIED, why);
  Status s = DrainUntil("drained", context->deadline());
  for (const auto& r : scheduler_->Snapshot()) *response->add_trials() = ToStatus(r);
  Tick();
  return ToGrpc(s);
}

Status AgentService::Shutdown(const std::string& reason) {
  Status s = DrainUntil(reason, std::chrono::system_clock::time_point::max());
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
  return NotLiveReason();
}

std::string AgentService::NotLiveReason() const {
  const auto failed = scheduler_->FailedDevices();
  if (failed.empty() || failed.size() < config_.devices.size()) return "";
  std::string why = "every device failed:";
  for (const auto& [d, what] : failed) {
    why += " " + config_.devices[static_cast<size_t>(d)].name + ": " + what + ";";
  }
  return why + " restart the agent";
}

bool AgentService::Wanted(const Watcher& w, const std::string& ns, const std::string& job) {
  return (w.job.empty() || job == w.job) && (w.ns.empty() || ns == w.ns);
}

bool AgentService::Watched(const Trial& trial) const {
  // Needs mu_ held.
  return std::any_of(watchers_.begin(), watchers_.end(),
                     [&](const Watcher* w) { return Wanted(*w, trial.namespace_, trial.job); });
}

void AgentService::Broadcast(v1::TrialEvent event) {
  // Needs mu_ held.
  for (Watcher* w : watchers_) {
    if (!Wanted(*w, event.trial().namespace_(), event.trial().job())) continue;
    // By the whole identity: trials of one name in two namespaces or jobs are two trials.
    const std::string key = wire::TrialKeyOf(event.trial());
    auto it = w->pending.find(key);
    if (it == w->pending.end()) {
      w->order.push_back(key);
      w->pending.emplace(key, event);
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
  // The status message is built only for a progress stream that wants it: a trial of a small
  // model reports every step, thousands a second.
  bool watched = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    watched = Watched(snapshot.trial);
  }
  v1::TrialEvent event;
  if (watched) *event.mutable_trial() = ToStatus(snapshot);
  const std::string key = TrialKey(snapshot.trial);
  int64_t read_delta = 0, write_delta = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = trials_.find(key);
    auto& seen = spill_seen_[key];
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
    if (watched) Broadcast(event);
  }
  if (metrics_) {
    metrics_->SetTrialProgress(snapshot.trial, snapshot.step, LatestLoss(snapshot.train_curve),
                               LatestLoss(snapshot.val_curve), snapshot.tokens_per_second);
    metrics_->AddSpillBytes("disk", "read", read_delta);
    metrics_->AddSpillBytes("disk", "write", write_delta);
  }
}

void AgentService::OnTrialMessage(const Trial& trial, const std::string& message) {
  std::fprintf(stderr, "hydra-agent: %s: %s\n", TrialDisplayName(trial).c_str(), message.c_str());
  std::lock_guard<std::mutex> lock(mu_);
  auto it = trials_.find(TrialKey(trial));
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

void AgentService::ForgetFinished() {
  std::vector<std::string> ended;  // oldest first
  for (const auto& [key, state] : scheduler_->States()) {
    if (IsFinal(state)) ended.push_back(key);
  }
  if (ended.size() <= config_.max_finished_trials) return;
  ended.resize(ended.size() - config_.max_finished_trials);
  for (const auto& key : ended) {
    auto forgotten = scheduler_->Forget(key);
    if (!forgotten.ok()) continue;  // resubmitted meanwhile
    if (metrics_) metrics_->RemoveTrial(forgotten->trial);
    std::lock_guard<std::mutex> lock(mu_);
    trials_.erase(key);
    spill_seen_.erase(key);
  }
}

void AgentService::Tick() {
  std::lock_guard<std::mutex> one_at_a_time(tick_mu_);
  ForgetFinished();
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
  const auto devices = Devices();
  for (size_t i = 0; i < devices.size(); ++i) {
    const auto& d = devices[i];
    metrics_->SetDevice(config_.devices[i], d.memory_total_bytes(), d.memory_free_bytes(),
                        d.memory_used_bytes(), d.busy_ratio());
    metrics_->SetDeviceFailed(config_.devices[i], !d.failure().empty());
  }
  CheckAllocators(devices);
  metrics_->SetTrialsByState(counts);
}

void AgentService::CheckAllocators(const std::vector<v1::Device>& devices) {
  for (size_t i = 0; i < devices.size(); ++i) {
    const auto bytes = factory_->AllocatorBytes(static_cast<int>(i));
    if (!bytes) continue;
    metrics_->SetGpuAllocator(config_.devices[i], bytes->allocated, bytes->reserved);
    const std::string said =
        allocator_check_.Observe(config_.devices[i], devices[i].memory_used_bytes(), *bytes);
    if (!said.empty()) std::fprintf(stderr, "hydra-agent: %s\n", said.c_str());
  }
}

}  // namespace hydra::agent
