#include "agent/scheduler/trial_scheduler.h"

#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <limits>
#include <map>

#include "agent/executor/checkpoint.h"
#include "common/cost_model.h"
#include "common/host_memory.h"
#include "common/job_json.h"
#include "common/partitioner.h"
#include "common/units.h"

namespace hydra::agent {
namespace {

using executor::CheckpointData;
using executor::CheckpointStore;
using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

double MeanOfLast(const std::vector<CurvePoint>& curve, size_t n) {
  if (curve.empty()) return std::numeric_limits<double>::quiet_NaN();
  n = std::min(n, curve.size());
  double sum = 0;
  for (size_t i = curve.size() - n; i < curve.size(); ++i) sum += curve[i].loss;
  return sum / static_cast<double>(n);
}

/// Bytes free to unprivileged writers under `dir` (its nearest existing ancestor); a huge number
/// when it cannot be read, leaving the executor's own check to report the problem.
int64_t FreeDiskBytes(const std::string& dir) {
  std::filesystem::path p(dir);
  struct statvfs vfs {};
  while (!p.empty() && ::statvfs(p.c_str(), &vfs) != 0) {
    if (p == p.parent_path()) return std::numeric_limits<int64_t>::max() / 4;
    p = p.parent_path();
  }
  if (p.empty()) return std::numeric_limits<int64_t>::max() / 4;
  return static_cast<int64_t>(vfs.f_bavail) * static_cast<int64_t>(vfs.f_frsize);
}

/// What a checkpoint carries besides the tensors: enough to continue the trial's record, and
/// the numeric environment it was trained in.
nlohmann::json ProgressMeta(const TrialResult& r, const std::string& fingerprint,
                            const TrialSchedulerOptions& options) {
  return {{"trial", r.trial.name},
          {"fingerprint", fingerprint},
          {"threads", options.threads},
          {"cpu", options.cpu},
          {"step", r.step},
          {"wallSeconds", r.wall_seconds},
          {"trainSeconds", r.train_seconds},
          {"trainedTokens", r.trained_tokens},
          {"trainCurve", CurveJson(r.train_curve)},
          {"valCurve", CurveJson(r.val_curve)},
          // What the weights are, so a checkpoint can be exported on its own (hydra export).
          {"model", TrialConfigJson(r.trial)["model"]}};
}

void RestoreProgress(const nlohmann::json& meta, TrialResult* r) {
  r->step = meta.at("step").get<int64_t>();
  r->wall_seconds = meta.at("wallSeconds").get<double>();
  r->train_seconds = meta.at("trainSeconds").get<double>();
  r->trained_tokens = meta.at("trainedTokens").get<int64_t>();
  r->train_curve = CurveFromJson(meta.at("trainCurve"));
  r->val_curve = CurveFromJson(meta.at("valCurve"));
  if (!r->train_curve.empty()) r->last_loss = r->train_curve.back().loss;
  if (r->train_seconds > 0) {
    r->tokens_per_second = static_cast<double>(r->trained_tokens) / r->train_seconds;
  }
}

/// The longest a trial waits, in steps, before trying a move again to a device where moves
/// found no room (TrialScheduler::Slot::no_room).
constexpr int64_t kMostStepsWithoutMoving = 64;

/// Keeps an executor whose tensors are on a lost GPU until the process ends, never destroyed:
/// its destructors would call into a CUDA context that errors (and could throw). Reachable to
/// the end, so leak checkers do not count it; the agent restarts to use that GPU again.
void KeepToTheEnd(std::unique_ptr<executor::TrialExecutorInterface> exec) {
  if (!exec) return;
  static std::mutex mu;
  static auto* kept = new std::vector<std::unique_ptr<executor::TrialExecutorInterface>>();
  std::lock_guard<std::mutex> lock(mu);
  kept->push_back(std::move(exec));
}

/// A trial's message when device `device` failed under it (DeviceFailure's `why`).
std::string FailedDeviceMessage(int device, const std::string& why) {
  return "device " + std::to_string(device) + " failed (" + why +
         "); the trial resumes from its last checkpoint on another device or agent";
}

/// Empty when a resume continues bit-exactly as far as the checkpoint tells (same threads per
/// device and CPU kind, or either unknown); else the notice that says it does not.
std::string NumericsNotice(const nlohmann::json& meta, const TrialSchedulerOptions& now) {
  const int then_threads = meta.value("threads", 0);
  const std::string then_cpu = meta.value("cpu", "");
  std::string differs;
  if (then_threads > 0 && now.threads > 0 && then_threads != now.threads) {
    differs =
        std::to_string(then_threads) + " threads per device, now " + std::to_string(now.threads);
  }
  if (!then_cpu.empty() && !now.cpu.empty() && then_cpu != now.cpu) {
    differs += (differs.empty() ? "" : "; ") + ("CPU " + then_cpu + ", now " + now.cpu);
  }
  if (differs.empty()) return "";
  return "the checkpoint was written with " + differs +
         ": the continuation equals an uninterrupted run within float tolerance only, not "
         "bit-exactly";
}

}  // namespace

/// One trial's run-time state. `r` and the executor belong to the thread that holds the trial
/// (running == true, or before it is queued); the flags and `published` are guarded by mu_.
struct TrialScheduler::Slot {
  size_t index = 0;
  PreparedTrial p;
  std::string key;               // TrialKey(p.trial): the trial's identity
  TrialResult r;                 // the worker's record
  double last_step_seconds = 0;  // compute time of its latest optimizer step
  TrialResult published;         // what readers see; copied from r at report points
  std::unique_ptr<executor::TrialExecutorInterface> exec;
  std::unique_ptr<CheckpointStore> store;
  int64_t saved_step = 0;
  bool admitted = false, started = false, running = false, done = false;
  bool cancel_requested = false;
  int64_t step_limit = 0;                       // early stopping: SetStepLimit's step (0: none)
  bool stop_requested = false;                  // StopEarly or Suspend was called
  const char* stop_state = kTrialEarlyStopped;  // what it ends as: EarlyStopped or Interrupted
  std::string stop_why;
  bool replaced = false;   // a later Submit of the same name took over
  bool announced = false;  // its Pending update went out: devices may take it
  int device = -1;
  int moving_from = -1;  // while its executor moves here from another device (MoveTo)
  // Moves that found no room (MoveTo undid them), by device: not tried there again before
  // `until` (a step), the wait doubling with each one (the memory others hold may stay held).
  struct NoRoom {
    int64_t until = 0;
    int64_t wait = 0;
  };
  std::map<int, NoRoom> no_room;
  int64_t device_bytes = 0;  // accounted device peak, for DeviceBytesInUse
  double est_step_seconds = 0;
  double ready_since = 0;
};

TrialScheduler::TrialScheduler(executor::ExecutorFactoryInterface* factory,
                               TrialObserverInterface* observer, TrialSchedulerOptions options,
                               std::unique_ptr<SchedulingPolicyInterface> policy)
    : factory_(factory),
      observer_(observer),
      options_(options),
      host_limit_(options.host_memory_bytes > 0 ? options.host_memory_bytes
                                                : DefaultHostMemoryBytes()),
      policy_(policy ? std::move(policy) : MakeShardedLrtfPolicy()),
      start_(Clock::now()) {
  const int devices = std::max(1, options_.devices);
  busy_.assign(devices, 0.0);
  running_since_.assign(devices, -1.0);
  on_device_.resize(devices);
  schedule_.busy_seconds.assign(devices, 0.0);
  for (int d = 0; d < devices; ++d) workers_.emplace_back(&TrialScheduler::Worker, this, d);
}

TrialScheduler::~TrialScheduler() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    shutdown_ = true;
  }
  cv_.notify_all();
  for (auto& w : workers_) w.join();
}

StatusOr<PreparedTrial> TrialScheduler::Prepare(const Trial& given,
                                                const std::string& checkpoint_dir) {
  PreparedTrial p;
  p.trial = given;
  // A model file (TorchScript) is loaded and checked now, and its layers become known.
  RETURN_IF_ERROR(factory_->Resolve(&p.trial));
  const Trial& trial = p.trial;
  p.checkpoint_dir = checkpoint_dir;
  const auto key = std::make_pair(trial.dataset.resolved_path, SampleWindow(trial));
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = data_.find(key);
    if (it != data_.end()) p.data = it->second;
  }
  if (!p.data) {
    ASSIGN_OR_RETURN(p.data, executor::TokenDataset::Open(trial.dataset, SampleWindow(trial)));
    std::lock_guard<std::mutex> lock(mu_);
    data_.emplace(key, p.data);
  }
  ASSIGN_OR_RETURN(p.admission, factory_->Admit(trial, *p.data));
  const int64_t host_bytes = p.admission.host_bytes;
  if (options_.refuse_over_host_memory && host_bytes > host_limit_) {
    return ResourceExhaustedError("trial " + trial.name + " needs " + FormatBytes(host_bytes) +
                                  " (" + std::to_string(host_bytes) +
                                  " bytes) of host memory for its state, more than the " +
                                  FormatBytes(host_limit_) + " (" + std::to_string(host_limit_) +
                                  " bytes) this node gives trials");
  }
  p.fingerprint = TrialFingerprint(trial);
  return p;
}

Status TrialScheduler::Submit(PreparedTrial trial) {
  auto slot = std::make_unique<Slot>();
  slot->r.trial = trial.trial;
  slot->est_step_seconds = trial.admission.est_step_seconds;
  slot->step_limit = trial.step_limit;
  slot->p = std::move(trial);
  slot->key = TrialKey(slot->p.trial);
  Publish(*slot);  // with its step limit: a queued trial reports the limit it will stop at
  TrialResult snapshot;
  Slot* raw = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (draining_) {
      return UnavailableError("draining: this node accepts no more trials");
    }
    if (EveryDeviceFailed()) {
      return UnavailableError("every device of this node failed (" +
                              failed_devices_.begin()->second + "): it accepts no more trials");
    }
    for (auto& s : slots_) {
      if (!s->replaced && s->key == slot->key) {
        const std::string& state = s->published.state;
        if (state == kTrialPending || state == kTrialRunning || state == kTrialSucceeded) {
          return AlreadyExistsError("trial " + TrialDisplayName(s->p.trial) + " is already here (" +
                                    state + ")");
        }
      }
    }
    // A trial that failed, was cancelled or interrupted may be assigned again: the new slot
    // replaces the old one in lookups (the old one keeps its schedule index).
    for (auto& s : slots_) {
      if (s->key == slot->key) s->replaced = true;
    }
    if (!clock_started_) {
      start_ = Clock::now();
      clock_started_ = true;
    }
    slot->index = next_index_++;
    snapshot = slot->published;
    raw = slot.get();
    slots_.push_back(std::move(slot));
  }
  // Reported before any device may take it, so that Pending always comes first.
  observer_->OnTrialUpdate(snapshot);
  std::string none_left;  // every device failed since the check above: it ends at once
  {
    std::lock_guard<std::mutex> lock(mu_);
    raw->announced = true;
    if (EveryDeviceFailed() && !raw->running && !raw->done) {
      raw->running = true;
      none_left =
          FailedDeviceMessage(failed_devices_.begin()->first, failed_devices_.begin()->second);
    }
  }
  if (!none_left.empty()) EndClaimed(*raw, kTrialInterrupted, none_left);
  cv_.notify_all();
  return OkStatus();
}

TrialScheduler::Slot* TrialScheduler::Find(const std::string& key) const {
  for (auto& s : slots_) {
    if (!s->replaced && s->key == key) return s.get();
  }
  return nullptr;
}

StatusOr<TrialScheduler::Slot*> TrialScheduler::FindUnended(const std::string& key) const {
  Slot* slot = Find(key);
  if (slot == nullptr) return NotFoundError("no trial " + key + " on this node");
  if (slot->done) {
    return FailedPreconditionError("trial " + TrialDisplayName(slot->p.trial) + " already ended (" +
                                   slot->published.state + ")");
  }
  return slot;
}

Status TrialScheduler::Cancel(const std::string& key) {
  Slot* slot = nullptr;
  {
    std::unique_lock<std::mutex> lock(mu_);
    ASSIGN_OR_RETURN(slot, FindUnended(key));
    slot->cancel_requested = true;
    if (slot->running) return OkStatus();  // the worker ends it after the current step
    slot->running = true;                  // claim it from the workers
  }
  EndClaimed(*slot, kTrialCancelled, "cancelled");
  return OkStatus();
}

Status TrialScheduler::SetStepLimit(const std::string& key, int64_t step) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ASSIGN_OR_RETURN(Slot * slot, FindUnended(key));
    slot->step_limit = std::max<int64_t>(0, step);
    // Readers see the new limit at once (the record itself belongs to the worker).
    slot->published.step_limit = PublishedLimit(*slot);
  }
  cv_.notify_all();
  return OkStatus();
}

Status TrialScheduler::StopEarly(const std::string& key, const std::string& why) {
  return RequestStop(key, kTrialEarlyStopped, "stopped early (" + why + ")");
}

Status TrialScheduler::Suspend(const std::string& key, const std::string& why) {
  return RequestStop(key, kTrialInterrupted, why);
}

Status TrialScheduler::RequestStop(const std::string& key, const char* state,
                                   const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ASSIGN_OR_RETURN(Slot * slot, FindUnended(key));
    // A suspension does not undo an early stop already asked for.
    if (slot->stop_requested && slot->stop_state == kTrialEarlyStopped) return OkStatus();
    slot->stop_requested = true;
    slot->stop_state = state;
    slot->stop_why = why;
  }
  cv_.notify_all();
  return OkStatus();
}

int TrialScheduler::BoundDevice(const Slot& slot, bool claimed) const {
  // Read under mu_ while no one else has claimed the slot: its executor does not change then.
  return slot.exec && (claimed || !slot.running) ? slot.exec->BoundDevice() : -1;
}

bool TrialScheduler::MayMoveFrom(const Slot& slot, int bound, int to) const {
  if (failed_devices_.count(bound)) return false;  // what it holds there is lost
  // Only while its own device runs another trial, and where its executor can move now (between
  // steps; a spilled trial's next shard may run on any free GPU within a step too); not yet
  // again where a move found no room.
  const auto it = slot.no_room.find(to);
  const bool no_room = it != slot.no_room.end() && slot.r.step < it->second.until;
  return bound >= 0 && static_cast<size_t>(bound) < on_device_.size() &&
         !on_device_[bound].empty() && !no_room && slot.exec->MayMoveNow();
}

TrialScheduler::Candidates TrialScheduler::CandidatesFor(int device) const {
  const int64_t device_free = DeviceMemoryFree(device);
  Candidates here, moved;  // moved: trials bound to a busy device, taken only if `here` is empty
  for (auto& s : slots_) {
    if (s->done || !s->admitted || s->running || !s->announced) continue;
    if (s->stop_requested || (s->started && AtLimit(*s))) continue;  // waits for a decision
    const int bound = BoundDevice(*s);
    const bool mine = bound < 0 || bound == device;
    if (!mine && !MayMoveFrom(*s, bound, device)) continue;
    if (bound != device && device_free >= 0 && DeviceNeed(*s) > device_free) {
      here.device_full = here.device_full || mine;
      continue;
    }
    // Remaining time: to the step the trial may reach now (its early-stopping limit).
    const double remaining =
        s->est_step_seconds * static_cast<double>(std::max<int64_t>(0, LimitOf(*s) - s->r.step));
    Candidates& to = mine ? here : moved;
    to.runnable.push_back({s->index, remaining, s->ready_since, s->r.step});
    to.slots.push_back(s.get());
  }
  if (here.runnable.empty()) {
    here.runnable = std::move(moved.runnable);
    here.slots = std::move(moved.slots);
  }
  return here;
}

int64_t TrialScheduler::DeviceNeed(const Slot& slot) const {
  return slot.p.admission.plan.peak_device_bytes;
}

int64_t TrialScheduler::DeviceMemoryFree(int device) const {
  const auto& memory = options_.device_memory_bytes;
  if (static_cast<size_t>(device) >= memory.size() || memory[device] <= 0) return -1;
  int64_t free = memory[device];
  for (const auto& s : slots_) {
    if (s->done || (!s->running && !s->exec)) continue;
    // A claimed trial's executor is not ours to read: count it where it last ran, and on the
    // device it is moving from until the move is done.
    const int bound = s->running ? s->device : BoundDevice(*s);
    if (bound == device || (s->running && s->moving_from == device)) free -= DeviceNeed(*s);
  }
  return free;
}

int64_t TrialScheduler::LimitOf(const Slot& slot) const {
  const int64_t steps = slot.r.trial.training.steps;
  return slot.step_limit > 0 ? std::min(slot.step_limit, steps) : steps;
}

bool TrialScheduler::AtLimit(const Slot& slot) const {
  const int64_t limit = LimitOf(slot);
  return limit < slot.r.trial.training.steps && slot.r.step >= limit;
}

TrialScheduler::Slot* TrialScheduler::ClaimStopRequested() {
  for (auto& s : slots_) {
    if (s->stop_requested && !s->done && !s->running && s->announced && !s->replaced &&
        !OnFailedDevice(*s)) {  // that one's device ends it (EndTrialsOn)
      s->running = true;
      return s.get();
    }
  }
  return nullptr;
}

void TrialScheduler::ParkClaimed(Slot& slot, std::unique_lock<std::mutex>& lock) {
  lock.unlock();
  Status parked = Park(slot);
  if (!parked.ok()) {
    EndClaimed(slot, kTrialInterrupted,
               CheckedFailure(slot, "checkpoint while waiting: " + parked.message()));
  }
  lock.lock();
  if (parked.ok()) {
    slot.admitted = false;
    slot.started = false;
    slot.running = false;
  }
}

TrialScheduler::Slot* TrialScheduler::ClaimParkable(int device) {
  for (auto& s : slots_) {
    if (device >= 0 && BoundDevice(*s) != device) continue;
    if (OnFailedDevice(*s)) continue;  // its checkpoint cannot be written: EndTrialsOn ends it
    if (s->admitted && s->started && !s->done && !s->running && AtLimit(*s)) {
      s->running = true;
      return s.get();
    }
  }
  return nullptr;
}

Status TrialScheduler::FinishStep(Slot& slot) {
  Status finished;
  while (finished.ok() && slot.exec && slot.exec->InStep()) {
    bool stepped = false, evaluated = false;
    size_t task = 0;
    try {
      finished = TaskOnce(slot, &stepped, &evaluated, &task);
    } catch (const std::exception& e) {
      finished = InternalError(std::string("unexpected error: ") + e.what());
    }
  }
  return finished;
}

void TrialScheduler::StopClaimed(Slot& slot) {
  TrialResult* r = &slot.r;
  // Another device may have begun the next step's shard-tasks before the stop arrived: a
  // checkpoint needs a step boundary.
  Status s = FinishStep(slot);
  if (s.ok() && slot.started && slot.exec && r->step > slot.saved_step) s = SaveCheckpoint(slot);
  std::string why;
  const char* state = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    why = slot.stop_why;
    state = slot.stop_state;
  }
  if (!s.ok())
    observer_->OnTrialMessage(r->trial, CheckedFailure(slot, why + ": checkpoint: " + s.message()));
  // An early-stopped trial's record is final; a suspended one resumes and goes on.
  if (state == kTrialEarlyStopped) CloseRecord(r);
  EndClaimed(slot, state, why);
}

Status TrialScheduler::Park(Slot& slot) {
  if (slot.r.step > slot.saved_step) RETURN_IF_ERROR(SaveCheckpoint(slot));
  DropExecutor(slot);  // the caller marks it not started: Start resumes it from the checkpoint
  return OkStatus();
}

Status TrialScheduler::EvaluateAtStep(Slot& slot) {
  TrialResult* r = &slot.r;
  if (!slot.exec || (!r->val_curve.empty() && r->val_curve.back().step == r->step)) {
    return OkStatus();
  }
  auto val = slot.exec->Evaluate();
  if (!val.ok()) return val.status();
  AppendBounded(&r->val_curve, {r->step, *val});
  return OkStatus();
}

void TrialScheduler::CloseRecord(TrialResult* r) {
  if (!r->val_curve.empty()) r->final_val_loss = r->val_curve.back().loss;
  r->final_train_loss = MeanOfLast(r->train_curve, 10);
  r->eta_seconds = 0;
}

bool TrialScheduler::EveryDeviceFailed() const { return failed_devices_.size() >= busy_.size(); }

bool TrialScheduler::OnFailedDevice(const Slot& slot, bool claimed) const {
  return failed_devices_.count(BoundDevice(slot, claimed)) > 0;
}

void TrialScheduler::DropExecutor(Slot& slot) {
  bool lost = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    lost = OnFailedDevice(slot, /*claimed=*/true);
  }
  if (lost) KeepToTheEnd(std::move(slot.exec));
  slot.exec.reset();
}

void TrialScheduler::EndClaimed(Slot& slot, const char* state, const std::string& why) {
  DropExecutor(slot);
  slot.r.state = state;
  slot.r.message = why + " at step " + std::to_string(slot.r.step);
  TrialResult snapshot;
  {
    std::lock_guard<std::mutex> lock(mu_);
    slot.running = false;
    slot.done = true;
    Publish(slot);
    snapshot = slot.published;
    ++reporting_;  // WaitIdle waits for this report too
  }
  cv_.notify_all();
  observer_->OnTrialUpdate(snapshot);
  {
    std::lock_guard<std::mutex> lock(mu_);
    --reporting_;
  }
  cv_.notify_all();
}

Status TrialScheduler::Drain(const std::string& reason) {
  std::vector<Slot*> todo;
  {
    std::unique_lock<std::mutex> lock(mu_);
    draining_ = true;
    paused_ = true;
    cv_.notify_all();
    cv_.wait(lock, [&] {
      for (auto& s : slots_) {
        if (s->running) return false;
      }
      return true;
    });
    for (auto& s : slots_) {
      if (s->done) continue;
      s->running = true;  // claimed: nothing else touches it now
      todo.push_back(s.get());
    }
  }
  Status first;
  for (Slot* slot : todo) {
    // A step half done (some shards stepped) cannot be checkpointed: finish it first.
    Status finished = FinishStep(*slot);
    if (!finished.ok()) {
      observer_->OnTrialMessage(
          slot->r.trial,
          CheckedFailure(*slot, "finishing the step on drain: " + finished.message()));
      if (first.ok()) first = finished;
      EndClaimed(*slot, kTrialInterrupted, reason);
      continue;
    }
    if (slot->started && slot->r.step > slot->saved_step) {
      Status s = SaveCheckpoint(*slot);
      if (!s.ok()) {
        observer_->OnTrialMessage(slot->r.trial,
                                  CheckedFailure(*slot, "checkpoint on drain: " + s.message()));
        if (first.ok()) first = s;
      }
    }
    EndClaimed(*slot, kTrialInterrupted, reason);
  }
  return first;
}

bool TrialScheduler::draining() const {
  std::lock_guard<std::mutex> lock(mu_);
  return draining_;
}

bool TrialScheduler::WaitIdle(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, timeout, [&] {
    for (auto& s : slots_) {
      if (!s->done) return false;
    }
    return reporting_ == 0;
  });
}

std::vector<TrialResult> TrialScheduler::Snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<TrialResult> out;
  for (auto& s : slots_) {
    if (!s->replaced) out.push_back(s->published);
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> TrialScheduler::States() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::pair<std::string, std::string>> out;
  for (auto& s : slots_) {
    if (!s->replaced) out.emplace_back(s->key, s->published.state);
  }
  return out;
}

StatusOr<TrialResult> TrialScheduler::Get(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (const Slot* s = Find(key)) return s->published;
  return NotFoundError("no trial " + key + " on this node");
}

StatusOr<TrialResult> TrialScheduler::Forget(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  const Slot* slot = Find(key);
  if (slot == nullptr) return NotFoundError("no trial " + key + " on this node");
  if (!slot->done || slot->running || reporting_ > 0) {
    return FailedPreconditionError("trial " + key + " has not ended (or is being reported)");
  }
  TrialResult last = slot->published;
  // Every slot of the key goes: the current one and the runs it replaced.
  slots_.erase(std::remove_if(slots_.begin(), slots_.end(),
                              [&](const std::unique_ptr<Slot>& s) {
                                return s->key == key && s->done && !s->running;
                              }),
               slots_.end());
  return last;
}

StatusOr<TrialResult> TrialScheduler::WaitEnded(const std::string& key,
                                                std::chrono::steady_clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  // Looked up on every wake-up: Forget may drop the slot meanwhile. `done` is set with the
  // final record published; reporting_ covers its delivery.
  cv_.wait_until(lock, deadline, [&] {
    const Slot* slot = Find(key);
    return slot == nullptr || (slot->done && reporting_ == 0);
  });
  if (const Slot* slot = Find(key)) return slot->published;
  return NotFoundError("no trial " + key + " on this node");
}

Schedule TrialScheduler::schedule() const {
  std::lock_guard<std::mutex> lock(mu_);
  Schedule out = schedule_;
  out.busy_seconds = busy_;
  out.makespan = Seconds(Clock::now() - start_);
  return out;
}

std::vector<double> TrialScheduler::BusySeconds() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<double> out = busy_;
  const double now = Seconds(Clock::now() - start_);
  for (size_t d = 0; d < out.size(); ++d) {
    if (running_since_[d] >= 0) out[d] += std::max(0.0, now - running_since_[d]);
  }
  return out;
}

int64_t TrialScheduler::DeviceBytesInUse(int device) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (device < 0 || device >= static_cast<int>(on_device_.size())) return 0;
  // A device with memory of its own (a GPU) holds the plans of the trials bound to it between
  // their steps too: what admission counts there.
  if (const int64_t free = DeviceMemoryFree(device); free >= 0) {
    return options_.device_memory_bytes[device] - free;
  }
  int64_t bytes = 0;
  for (const Slot* s : on_device_[device]) bytes += s->device_bytes;
  return bytes;
}

void TrialScheduler::Publish(Slot& slot) {
  slot.published = slot.r;
  slot.published.step_limit = PublishedLimit(slot);
}

int64_t TrialScheduler::PublishedLimit(const Slot& slot) const {
  const int64_t limit = LimitOf(slot);
  return limit < slot.r.trial.training.steps ? limit : 0;
}

void TrialScheduler::Worker(int device) {
  const int64_t host_limit = host_limit_;
  TrialResult snapshot;
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    if (shutdown_) break;
    if (auto failed = failed_devices_.find(device); failed != failed_devices_.end()) {
      const std::string why = FailedDeviceMessage(device, failed->second);
      lock.unlock();
      EndTrialsOn(device, why);  // the trials it held; it takes no more
      lock.lock();
      break;
    }
    if (paused_) {
      cv_.wait(lock);
      continue;
    }
    if (options_.hold && options_.hold->load()) {
      cv_.wait_for(lock, std::chrono::milliseconds(20));  // the flag changes without a notify
      continue;
    }
    const bool blocked = AdmitWaiting(host_limit);
    // Early stopping: stop requested trials; make room by parking trials waiting at their
    // step limit when others wait for admission.
    if (Slot* stop = ClaimStopRequested()) {
      lock.unlock();
      StopClaimed(*stop);
      lock.lock();
      continue;
    }
    if (Slot* park = blocked ? ClaimParkable(-1) : nullptr) {
      ParkClaimed(*park, lock);
      continue;
    }
    Candidates c = CandidatesFor(device);
    if (c.runnable.empty()) {
      // Trials waiting at an early-stopping limit may hold the memory another one needs.
      if (Slot* park = c.device_full ? ClaimParkable(device) : nullptr) {
        ParkClaimed(*park, lock);
        continue;
      }
      cv_.wait(lock);
      continue;
    }
    Slot& slot = *c.slots[policy_->Pick(c.runnable)];
    Turn turn = ClaimTurn(slot, device);
    lock.unlock();
    RunTurn(slot, &turn);
    SettleTurn(slot, &turn);
    lock.lock();
    EndTurn(slot, turn, &snapshot, lock);
  }
  cv_.notify_all();
}

bool TrialScheduler::AdmitWaiting(int64_t host_limit) {
  // Admission: trials join, in order, while their state fits the host memory and their
  // spill files fit the spill directory's free space.
  int64_t admitted_bytes = 0, unwritten_disk = 0;
  bool any_admitted = false;
  for (auto& s : slots_) {
    if (!s->admitted || s->done) continue;
    any_admitted = true;
    admitted_bytes += s->p.admission.host_bytes;
    // Spill files not yet written are not yet taken from the free space.
    if (!s->started) unwritten_disk += s->p.admission.disk_bytes;
  }
  int64_t disk_free = -1;  // read once per pass, only when a waiting trial spills to disk
  for (auto& s : slots_) {
    if (s->admitted || s->done) continue;
    if (AtLimit(*s)) continue;  // parked at its early-stopping limit: needs no room yet
    // The first waiting trial is admitted even alone over a limit: it must run sometime (and
    // fails with the numbers if it cannot).
    if (any_admitted && admitted_bytes + s->p.admission.host_bytes > host_limit) return true;
    if (any_admitted && s->p.admission.disk_bytes > 0 && !options_.spill_dir.empty()) {
      if (disk_free < 0) {
        disk_free = options_.free_disk_bytes ? options_.free_disk_bytes(options_.spill_dir)
                                             : FreeDiskBytes(options_.spill_dir);
      }
      if (unwritten_disk + s->p.admission.disk_bytes > disk_free) return true;
    }
    s->admitted = true;
    any_admitted = true;
    admitted_bytes += s->p.admission.host_bytes;
    unwritten_disk += s->p.admission.disk_bytes;
  }
  return false;
}

TrialScheduler::Turn TrialScheduler::ClaimTurn(Slot& slot, int device) {
  slot.running = true;
  slot.device = device;
  const int bound = BoundDevice(slot, /*claimed=*/true);
  slot.moving_from = bound >= 0 && bound != device ? bound : -1;
  on_device_[device].push_back(&slot);
  running_since_[device] = Seconds(Clock::now() - start_);
  Turn turn;
  turn.device = device;
  turn.moved_from = slot.moving_from;
  turn.task_step = slot.r.step;
  return turn;
}

void TrialScheduler::RunTurn(Slot& slot, Turn* turn) {
  const int device = turn->device;
  Status& s = turn->s;
  try {
    if (!slot.started) s = Start(slot);
    // Taken from a busy device: what the executor keeps on a device comes here first. No
    // room here (memory other processes hold): the move was undone, it waits for its own.
    bool no_room = false;
    if (s.ok() && slot.moving_from >= 0) {
      s = slot.exec->MoveTo(device);
      no_room = s.code() == StatusCode::kUnavailable;
      turn->move_failed = !s.ok() && !no_room;
    }
    bool at_limit = false;  // a trial resumed at (or past) its early-stopping limit waits
    {
      std::lock_guard<std::mutex> relock(mu_);
      if (no_room) {
        Slot::NoRoom& n = slot.no_room[device];
        n.wait = std::min<int64_t>(std::max<int64_t>(1, 2 * n.wait), kMostStepsWithoutMoving);
        n.until = slot.r.step + n.wait;
      } else if (s.ok() && turn->moved_from >= 0) {
        slot.no_room.erase(device);  // it found room: the next wait starts short again
      }
      slot.moving_from = -1;  // its old device's memory is free now (or it stayed there)
      at_limit = AtLimit(slot);
    }
    if (no_room) {
      observer_->OnTrialMessage(slot.r.trial, s.message());
      s = OkStatus();
    }
    const bool runs = s.ok() && !no_room;
    // Resumed at or past its limit without an evaluation there (a checkpoint of another
    // run): evaluated now, so that early stopping has a result to decide on.
    if (runs && at_limit) s = EvaluateAtStep(slot);
    // A trial resumed from its final checkpoint only needs finishing.
    if (runs && s.ok() && !at_limit && slot.r.step < slot.r.trial.training.steps) {
      turn->t0 = Clock::now();
      s = TaskOnce(slot, &turn->stepped, &turn->evaluated, &turn->task);
      turn->t1 = Clock::now();
      turn->tasked = true;
    }
    if (runs && s.ok() && slot.r.step >= slot.r.trial.training.steps) s = Finish(slot);
  } catch (const std::exception& e) {
    // Nothing may escape a worker thread: the trial fails, the others go on.
    s = InternalError(std::string("unexpected error: ") + e.what());
  }
}

void TrialScheduler::SettleTurn(Slot& slot, Turn* turn) {
  const Status& s = turn->s;
  // A failure a device caused (its GPU lost: this one, or the one a failed move came from):
  // not the trial's; that device runs no more.
  int failed_device = turn->device;
  std::optional<std::string> device_failed;
  if (!s.ok() && s.code() != StatusCode::kAborted) {
    device_failed = CheckDevice(turn->device);
    if (!device_failed && turn->move_failed) {
      failed_device = turn->moved_from;
      device_failed = CheckDevice(turn->moved_from);
    }
  }
  if (device_failed) {
    slot.r.state = kTrialInterrupted;
    slot.r.message = FailedDeviceMessage(failed_device, *device_failed) + " (" + s.message() + ")";
    // On a GPU whose context is lost (the one it is bound to, or its failed move's source).
    KeepToTheEnd(std::move(slot.exec));
  } else if (!s.ok()) {
    // ABORTED: fenced off (the trial moved to another agent); not a failure of the trial.
    // UNAVAILABLE: its checkpoint could not be written (a full disk); it can resume.
    slot.r.state = s.code() == StatusCode::kAborted       ? kTrialCancelled
                   : s.code() == StatusCode::kUnavailable ? kTrialInterrupted
                                                          : kTrialFailed;
    slot.r.message = s.message();
    DropExecutor(slot);
  }
  {
    std::lock_guard<std::mutex> relock(mu_);
    turn->cancelled = slot.cancel_requested && s.ok() && slot.r.state != kTrialSucceeded;
  }
  if (turn->cancelled) {
    DropExecutor(slot);
    slot.r.state = kTrialCancelled;
    slot.r.message = "cancelled at step " + std::to_string(slot.r.step);
  }
  // Still bound to a device that failed while it was ours (it stayed there: a move here
  // found no room): no device will run it; it ends as the others there did.
  turn->stranded =
      s.ok() && !turn->cancelled && slot.r.state != kTrialSucceeded && EndIfOnFailedDevice(slot);
  if (turn->stepped && observer_) {
    observer_->OnStep(slot.r.trial.name, turn->device, slot.last_step_seconds, slot.r.shards,
                      turn->evaluated);
  }
}

void TrialScheduler::EndTurn(Slot& slot, const Turn& turn, TrialResult* snapshot,
                             std::unique_lock<std::mutex>& lock) {
  const int device = turn.device;
  if (!turn.s.ok() || turn.cancelled || turn.stranded || slot.r.state == kTrialSucceeded) {
    slot.done = true;
  }
  if (turn.tasked) {
    // One shard-task (a whole step for an unsharded trial), timed without set-up and
    // finishing; the next task of the trial may run on any device.
    const double start = Seconds(turn.t0 - start_);
    const double end = Seconds(turn.t1 - start_);
    if (options_.record_schedule) {
      schedule_.tasks.push_back({slot.index, turn.task_step, turn.task, device, start, end});
    }
    slot.ready_since = end;
  }
  // Busy: the whole time the device held the trial (set-up, step, evaluation, checkpoint).
  busy_[device] += std::max(0.0, Seconds(Clock::now() - start_) - running_since_[device]);
  running_since_[device] = -1;
  auto& on = on_device_[device];
  on.erase(std::remove(on.begin(), on.end(), &slot), on.end());
  Publish(slot);
  // Report a copy taken while the trial is still ours: once `running` is cleared another
  // device may step it and grow its curves. Assigned into the worker's buffer, whose
  // capacity stays: a small model's trial reports thousands of steps a second.
  *snapshot = slot.published;
  slot.running = false;
  ++reporting_;  // WaitIdle waits for this report too
  cv_.notify_all();
  lock.unlock();
  observer_->OnTrialUpdate(*snapshot);
  lock.lock();
  --reporting_;
  cv_.notify_all();
}

std::optional<std::string> TrialScheduler::CheckDevice(int device) {
  std::optional<std::string> failed = factory_->DeviceFailure(device);
  if (failed) {
    std::lock_guard<std::mutex> lock(mu_);
    failed_devices_[device] = *failed;
    cv_.notify_all();  // that device's worker, if it waits, ends its trials and stops
  }
  return failed;
}

std::string TrialScheduler::CheckedFailure(Slot& slot, const std::string& what) {
  int bound = -1;
  {
    std::lock_guard<std::mutex> lock(mu_);
    bound = BoundDevice(slot, /*claimed=*/true);
  }
  const auto failed = bound >= 0 ? CheckDevice(bound) : std::nullopt;
  return failed ? FailedDeviceMessage(bound, *failed) + " (" + what + ")" : what;
}

void TrialScheduler::EndTrialsOn(int device, const std::string& why) {
  std::vector<Slot*> bound;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Once every device failed, no device will run the others either.
    const bool none_left = EveryDeviceFailed();
    for (auto& s : slots_) {
      // Not yet announced: Submit ends it after its Pending update.
      if (s->done || s->running || !s->announced) continue;
      if (BoundDevice(*s) != device && !none_left) continue;
      s->running = true;  // claimed: no other device takes it meanwhile
      bound.push_back(s.get());
    }
  }
  for (Slot* s : bound) EndClaimed(*s, kTrialInterrupted, why);  // not freed on the lost GPU
}

bool TrialScheduler::EndIfOnFailedDevice(Slot& slot) {
  std::string why;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const int bound = BoundDevice(slot, /*claimed=*/true);
    auto it = failed_devices_.find(bound);
    if (it == failed_devices_.end()) return false;
    why = FailedDeviceMessage(bound, it->second);
  }
  KeepToTheEnd(std::move(slot.exec));  // on the lost GPU
  slot.r.state = kTrialInterrupted;
  slot.r.message = why + " at step " + std::to_string(slot.r.step);
  return true;
}

std::map<int, std::string> TrialScheduler::FailedDevices() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failed_devices_;
}

Status TrialScheduler::Start(Slot& slot) {
  if (slot.p.fence) RETURN_IF_ERROR(slot.p.fence());
  TrialResult* r = &slot.r;
  const Trial& trial = r->trial;
  auto created = factory_->Build(trial, slot.p.data, slot.p.admission, slot.device);
  if (!created.ok()) return created.status();
  slot.exec = std::move(created).value();
  const auto stats = slot.exec->stats();
  r->shards = stats.shards;
  r->peak_device_bytes = stats.peak_device_bytes;
  slot.device_bytes = stats.peak_device_bytes;
  slot.store = std::make_unique<CheckpointStore>(slot.p.checkpoint_dir);
  // A directory that cannot be listed is not an empty one: UNAVAILABLE (the trial is
  // interrupted and resumes later), never a fresh start over its checkpoints.
  ASSIGN_OR_RETURN(const std::vector<int64_t> steps, slot.store->Steps());
  if (!steps.empty()) {
    std::vector<std::string> warnings;
    auto ckpt = slot.store->LoadLatest(&warnings);
    for (const auto& w : warnings) observer_->OnTrialMessage(trial, w);
    if (!ckpt.ok()) return ckpt.status().WithContext("resuming " + trial.name);
    const std::string found = ckpt->meta.value("fingerprint", "");
    if (found != slot.p.fingerprint) {
      return FailedPreconditionError(
          "the checkpoints in " + slot.store->dir() +
          " were made for a different configuration of " + trial.name +
          "; discard them (hydra run --restart) or use another directory");
    }
    try {
      RestoreProgress(ckpt->meta, r);
    } catch (const nlohmann::json::exception& e) {
      return DataLossError("checkpoint metadata in " + slot.store->dir() + ": " + e.what());
    }
    RETURN_IF_ERROR(slot.exec->ImportState(r->step, ckpt->buffers)
                        .WithContext("resuming " + trial.name + " from " + slot.store->dir()));
    r->resumed_from_step = r->step;
    r->last_checkpoint_step = r->step;
    slot.saved_step = r->step;
    observer_->OnTrialMessage(trial,
                              "resumed from the checkpoint of step " + std::to_string(r->step));
    if (std::string n = NumericsNotice(ckpt->meta, options_); !n.empty()) {
      observer_->OnTrialMessage(trial, n);
    }
  }
  slot.started = true;
  r->state = kTrialRunning;
  return OkStatus();
}

Status TrialScheduler::SaveCheckpoint(Slot& slot) {
  if (slot.p.fence) RETURN_IF_ERROR(slot.p.fence());
  const auto t0 = Clock::now();
  auto state = slot.exec->ExportState();
  if (!state.ok()) return state.status();
  CheckpointData c{ProgressMeta(slot.r, slot.p.fingerprint, options_), std::move(state).value()};
  if (Status saved = slot.store->Save(slot.r.step, c); !saved.ok()) {
    // A full disk is the storage's problem, not the trial's: it can resume from its previous
    // checkpoint (here once space is freed, or on another node).
    if (saved.code() != StatusCode::kResourceExhausted) return saved;
    return UnavailableError("checkpoint of step " + std::to_string(slot.r.step) + ": " +
                            saved.message() +
                            "; the trial can resume from its previous checkpoint");
  }
  slot.saved_step = slot.r.step;
  slot.r.last_checkpoint_step = slot.r.step;
  observer_->OnCheckpoint(slot.r.trial.name, Seconds(Clock::now() - t0));
  return OkStatus();
}

Status TrialScheduler::TaskOnce(Slot& slot, bool* stepped, bool* evaluated, size_t* task) {
  // Fencing at step boundaries: an older holder stops before its next step or checkpoint.
  if (slot.p.fence && !slot.exec->InStep()) RETURN_IF_ERROR(slot.p.fence());
  auto t = slot.exec->RunTask();
  if (!t.ok()) return t.status();
  *task = t->task;
  if (!t->step) return OkStatus();
  *stepped = true;
  return AfterStep(slot, *t->step, evaluated);
}

Status TrialScheduler::AfterStep(Slot& slot, const executor::StepMetrics& m, bool* evaluated) {
  TrialResult* r = &slot.r;
  const auto& tr = r->trial.training;
  const auto start = Clock::now();
  slot.last_step_seconds = m.seconds;
  r->step = slot.exec->step();
  AppendBounded(&r->train_curve, {r->step, m.loss});
  r->last_loss = m.loss;
  r->train_seconds += m.seconds;
  r->trained_tokens += m.tokens;
  r->tokens_per_second = static_cast<double>(r->trained_tokens) / r->train_seconds;
  const auto stats = slot.exec->stats();
  r->disk_bytes_read = stats.disk_bytes_read;
  r->disk_bytes_written = stats.disk_bytes_written;
  r->peak_device_bytes = stats.peak_device_bytes;
  r->device = slot.device;
  int64_t limit = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    limit = LimitOf(slot);
  }
  // Evaluated every evalEverySteps, and where early stopping compares (the step limit).
  const bool scheduled = tr.eval_every_steps > 0 && r->step % tr.eval_every_steps == 0;
  if ((scheduled || r->step == limit) && r->step < tr.steps) {
    RETURN_IF_ERROR(EvaluateAtStep(slot));
    *evaluated = true;
  }
  r->wall_seconds += m.seconds + Seconds(Clock::now() - start);
  if (tr.checkpoint_every_steps > 0 && r->step % tr.checkpoint_every_steps == 0 &&
      r->step < tr.steps) {
    const auto c0 = Clock::now();
    RETURN_IF_ERROR(SaveCheckpoint(slot));
    r->wall_seconds += Seconds(Clock::now() - c0);
  }
  {
    // Online refinement of the remaining-time estimate: the measured mean step time.
    std::lock_guard<std::mutex> lock(mu_);
    slot.est_step_seconds = r->wall_seconds / static_cast<double>(r->step);
  }
  r->eta_seconds =
      slot.est_step_seconds * static_cast<double>(std::max<int64_t>(0, limit - r->step));
  return OkStatus();
}

Status TrialScheduler::Finish(Slot& slot) {
  TrialResult* r = &slot.r;
  const auto start = Clock::now();
  RETURN_IF_ERROR(EvaluateAtStep(slot));
  CloseRecord(r);
  if (slot.saved_step != r->step) RETURN_IF_ERROR(SaveCheckpoint(slot));
  // Past the final checkpoint a full disk (the model files, result.json) is the storage's
  // problem: the trial is interrupted, and a resume from that checkpoint finishes it.
  auto full_disk_resumes = [](Status s) {
    if (s.code() != StatusCode::kResourceExhausted) return s;
    return UnavailableError(s.message() +
                            "; the trial finishes from its final checkpoint when it resumes");
  };
  if (factory_->WritesModelFiles(r->trial)) {
    // The trained weights where Python reads them, next to the checkpoints:
    // torch.load(<dir>/model.pt), GPT2LMHeadModel.from_pretrained(<dir>).
    auto state = slot.exec->ExportState();
    if (!state.ok()) return state.status();
    RETURN_IF_ERROR(
        full_disk_resumes(factory_->WriteModelFiles(r->trial, *state, slot.p.checkpoint_dir)));
  }
  r->wall_seconds += Seconds(Clock::now() - start);
  r->peak_device_bytes = slot.exec->stats().peak_device_bytes;
  TrialResult final_result = *r;
  final_result.state = kTrialSucceeded;
  RETURN_IF_ERROR(full_disk_resumes(observer_->OnTrialSucceeding(final_result)));
  r->state = kTrialSucceeded;
  slot.exec.reset();  // free the trial's memory for the trials still waiting
  return OkStatus();
}

}  // namespace hydra::agent
