#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "agent/executor/executor.h"
#include "common/job.h"
#include "common/scheduler.h"
#include "common/status.h"
#include "common/trial_result.h"

namespace hydra::agent {

/// What the scheduler reports. Called on worker threads (and on the thread calling Cancel or
/// Drain), never under the scheduler's lock; implementations serialise themselves.
class TrialObserverInterface {
 public:
  virtual ~TrialObserverInterface() = default;
  /// After every step, evaluation and state change; `snapshot` is a copy.
  virtual void OnTrialUpdate(const TrialResult& snapshot) = 0;
  /// A notice about one trial (a corrupt checkpoint skipped, a resume).
  virtual void OnTrialMessage(const Trial& trial, const std::string& message) = 0;
  /// One optimizer step ran on `device` for `seconds`, as `shards` shard-tasks per phase;
  /// `evaluated` when an evaluation followed it.
  virtual void OnStep(const std::string& trial, int device, double seconds, int64_t shards,
                      bool evaluated) {}
  /// A checkpoint of `trial` was written in `seconds`.
  virtual void OnCheckpoint(const std::string& trial, double seconds) {}
  /// Runs before a trial is marked Succeeded (the final checkpoint is written); an error fails
  /// the trial, but RESOURCE_EXHAUSTED (a full disk) interrupts it: it finishes when resumed.
  /// The local runner writes result.json here.
  virtual Status OnTrialSucceeding(const TrialResult& result) { return OkStatus(); }
};

struct TrialSchedulerOptions {
  int devices = 1;  ///< devices (worker threads) training trials at once
  /// Memory of each device whose trials keep state on it (a GPU; an executor's BoundDevice):
  /// such trials are started on a device only while the device peaks (plans'
  /// peak_device_bytes) of the trials bound to it fit. Empty, or 0 for a device: no limit
  /// (CPU devices, whose trials move between them freely).
  std::vector<int64_t> device_memory_bytes = {};
  /// Host memory the admitted trials' state may use; trials past it wait, in order, until
  /// earlier ones finish. <= 0: DefaultHostMemoryBytes() (75% of the RAM or of the cgroup's
  /// limit, whichever is less), read once at construction.
  int64_t host_memory_bytes = 0;
  /// Refuse (RESOURCE_EXHAUSTED) a trial whose state alone exceeds host_memory_bytes. When
  /// false such a trial runs alone once everything before it finished.
  bool refuse_over_host_memory = false;
  /// When it reads true, devices take no new steps (a Ctrl-C handler sets it; Drain follows).
  /// May be null. Borrowed.
  const std::atomic<bool>* hold = nullptr;
  /// Where disk-tier trials spill (ExecutorOptions::spill_dir): trials are admitted only while
  /// the spill files of all admitted trials fit its free space. Empty: no disk admission.
  std::string spill_dir = {};
  /// Free bytes under a directory; empty: statvfs. Tests set it.
  std::function<int64_t(const std::string& dir)> free_disk_bytes = {};
  /// Keep every step in schedule() (the local runner draws it); a long-lived agent does not.
  bool record_schedule = true;
  /// The numeric environment trials train in (float results are bit-identical only for the
  /// same thread count per device and CPU kind): recorded in every checkpoint; a resume under
  /// another is reported as a notice. 0 / empty: unknown (not compared).
  int threads = 0;
  std::string cpu = {};
};

/// A trial that passed the checks and can be queued: what Prepare returns.
struct PreparedTrial {
  Trial trial;
  std::string checkpoint_dir;  ///< where its checkpoints are written and resumed from
  std::shared_ptr<const executor::TokenDataset> data;
  /// The factory's admission: the plan the executor is built from, the host and spill bytes
  /// it takes while admitted, the first estimate of an optimizer step.
  Admission admission;
  std::string fingerprint;  ///< of its configuration; guards resuming
  /// Called before every step and checkpoint; ABORTED stops the trial as Cancelled with its
  /// message (another agent took the trial over: fencing). May be empty.
  std::function<Status()> fence;
  /// Early stopping: the trial trains to this step at most, evaluates there and waits until
  /// SetStepLimit raises it or StopEarly ends it. 0: to the end.
  int64_t step_limit = 0;
};

/// The node's device loop, shared by `hydra run` and hydra-agent: trials arrive (Submit), wait
/// for host memory in order, and whenever a device is free it takes the admitted trial the
/// policy picks (Sharded-LRTF: longest estimated remaining time) and runs its next optimizer
/// step. A trial whose executor is bound to a device (a GPU holding its state) runs there,
/// unless that device is busy with another trial and another device has nothing of its own to
/// run: the trial then moves (TrialExecutorInterface::MoveTo) where its executor may move now
/// (between steps; a spilled trial within a step too). A move that finds no room (MoveTo undid
/// it) leaves the trial on its own device, and is tried again there only after 1, 2, 4 ... 64
/// of the trial's steps (reset by a move that succeeds). A device whose GPU failed (the
/// factory's DeviceFailure) runs nothing more; the trials it held end Interrupted. Others
/// run on any device. Trials resume from the newest checkpoint in their directory, checkpoint
/// as their training settings say, can be cancelled, and are checkpointed by Drain.
/// Thread-safe.
class TrialScheduler {
 public:
  /// `factory` and `observer` are borrowed and must outlive the scheduler. Starts the device
  /// threads.
  TrialScheduler(executor::ExecutorFactoryInterface* factory, TrialObserverInterface* observer,
                 TrialSchedulerOptions options,
                 std::unique_ptr<SchedulingPolicyInterface> policy = nullptr);
  /// Stops the device threads after their current step; unfinished trials are not
  /// checkpointed (call Drain first for that).
  ~TrialScheduler();

  /// Checks a trial without queueing it: its dataset opens, the executor factory admits it
  /// (RESOURCE_EXHAUSTED / INVALID_ARGUMENT) and, with refuse_over_host_memory, its state fits
  /// the host memory. No side effects besides caching the opened dataset.
  StatusOr<PreparedTrial> Prepare(const Trial& trial, const std::string& checkpoint_dir);

  /// Queues a prepared trial. Trials are known by TrialKey (their identity). ALREADY_EXISTS if
  /// a trial of that identity is known (and not cancelled, failed or interrupted: those are
  /// replaced), UNAVAILABLE while draining.
  Status Submit(PreparedTrial trial);

  /// Stops the trial of identity `key` (TrialKey): now if it is not running, else after its
  /// current step. Its executor (and spill files) are freed; its checkpoints stay. NOT_FOUND
  /// for an unknown trial, FAILED_PRECONDITION for one that already ended.
  Status Cancel(const std::string& key);

  /// Early stopping: the trial of `key` trains to `step` at most (evaluating there) and then
  /// waits, its device going to other trials; a waiting trial is checkpointed and leaves host
  /// memory when a trial waiting for admission needs the room. `step` >= its steps, or 0,
  /// lifts the limit. NOT_FOUND / FAILED_PRECONDITION as Cancel.
  Status SetStepLimit(const std::string& key, int64_t step);

  /// Early stopping: ends the trial of `key` as EarlyStopped after its current step, on a
  /// device thread (never on the caller's: an observer may call this). Its step is
  /// checkpointed and its checkpoints stay; its final validation loss is its last evaluation.
  /// NOT_FOUND / FAILED_PRECONDITION as Cancel.
  Status StopEarly(const std::string& key, const std::string& why);

  /// Suspension (spec.suspend): ends the trial of `key` as Interrupted ("<why> at step N")
  /// after its current step, on a device thread, with that step checkpointed: Submitting it
  /// again resumes it there. NOT_FOUND / FAILED_PRECONDITION as Cancel.
  Status Suspend(const std::string& key, const std::string& why);

  /// Stops accepting trials, lets running steps end, then checkpoints every started,
  /// unfinished trial and marks every unfinished trial Interrupted with message
  /// "<reason> at step N". Returns the first checkpoint error (the others still run).
  Status Drain(const std::string& reason);

  /// True once Drain started.
  bool draining() const;

  /// Waits until no trial is Pending or Running and their last updates reached the observer,
  /// at most `timeout`. True if so.
  bool WaitIdle(std::chrono::milliseconds timeout);

  /// Every trial submitted, in submission order.
  std::vector<TrialResult> Snapshot() const;
  /// Key (TrialKey) and state of every trial, in submission order (cheap: no curves copied).
  std::vector<std::pair<std::string, std::string>> States() const;
  /// One trial by its key; NOT_FOUND if unknown.
  StatusOr<TrialResult> Get(const std::string& key) const;
  /// Drops an ended trial's record (a long-lived agent keeps only so many) and returns it;
  /// NOT_FOUND if unknown, FAILED_PRECONDITION if it has not ended.
  StatusOr<TrialResult> Forget(const std::string& key);
  /// Waits until the trial of `key` ended (and its last update reached the observer) or
  /// `deadline` passed, and returns it as it then stands; NOT_FOUND if unknown.
  StatusOr<TrialResult> WaitEnded(const std::string& key,
                                  std::chrono::steady_clock::time_point deadline);

  /// The optimizer steps run so far (seconds since the first Submit), busy seconds per device and
  /// the makespan so far. Task `trial` fields are submission indices.
  Schedule schedule() const;

  /// Seconds each device has spent running steps, including the step running now.
  std::vector<double> BusySeconds() const;

  /// The device memory trials hold on `device`: on a device with memory of its own
  /// (device_memory_bytes, a GPU) the plans' peaks of the trials bound to it, running or
  /// between their steps; on a CPU device the accounted peaks of the trials running a step
  /// there now.
  int64_t DeviceBytesInUse(int device) const;

  int devices() const { return static_cast<int>(busy_.size()); }

  /// The devices that failed (a GPU whose CUDA context an error left unusable: the executor
  /// factory's DeviceFailure after a failed task) and why, by index. A failed device runs
  /// nothing more; the trials it held ended Interrupted (they resume from their last
  /// checkpoints elsewhere), the others go on on the other devices.
  std::map<int, std::string> FailedDevices() const;

 private:
  struct Slot;
  Slot* Find(const std::string& key) const;  // the current slot of a key; needs mu_ held
  // Needs mu_ held: the current slot of a key; NOT_FOUND, or FAILED_PRECONDITION once ended.
  StatusOr<Slot*> FindUnended(const std::string& key) const;
  Status Start(Slot& slot);
  /// Runs the trial's next shard-task; when it ends an optimizer step, does the step's
  /// bookkeeping (curves, evaluation, checkpoint) and sets *stepped.
  Status TaskOnce(Slot& slot, bool* stepped, bool* evaluated, size_t* task);
  Status AfterStep(Slot& slot, const executor::StepMetrics& m, bool* evaluated);
  Status Finish(Slot& slot);
  Status SaveCheckpoint(Slot& slot);
  void Worker(int device);
  /// One turn of a worker: a trial claimed on `device`, set up or moved there if it must be,
  /// one shard-task, and how it ended.
  struct Turn {
    int device = -1;
    int moved_from = -1;  ///< the device it was bound to, when it moved here (-1: none)
    int64_t task_step = 0;
    Status s;
    bool move_failed = false;  ///< the move from moved_from failed, and was not undone
    bool tasked = false, stepped = false, evaluated = false;
    size_t task = 0;
    std::chrono::steady_clock::time_point t0, t1;  ///< the task's start and end
    bool cancelled = false;                        ///< cancelled meanwhile
    bool stranded = false;                         ///< left bound to a device that failed
  };
  /// Needs mu_ held: admits waiting trials, in order, while their state fits the host memory
  /// (`host_limit`) and their spill files the spill directory; whether one still waits.
  bool AdmitWaiting(int64_t host_limit);
  /// Needs mu_ held: `slot` becomes `device`'s (running there, moving there if bound elsewhere).
  Turn ClaimTurn(Slot& slot, int device);
  /// mu_ not held: sets the claimed trial up or moves it where it must, and runs its next task
  /// (or evaluates or finishes it); the outcome in turn->s.
  void RunTurn(Slot& slot, Turn* turn);
  /// mu_ not held: what the outcome means for the trial: a lost GPU, a failure, a cancel
  /// that arrived meanwhile, a device that failed under it; the step reported to the observer.
  void SettleTurn(Slot& slot, Turn* turn);
  /// Needs mu_ held (unlocked while reporting): the turn's bookkeeping (done, the recorded
  /// schedule, busy time), and the trial published, released and reported.
  void EndTurn(Slot& slot, const Turn& turn, TrialResult* snapshot,
               std::unique_lock<std::mutex>& lock);
  void Publish(Slot& slot);  // copies the worker's record for readers; needs mu_ held
  int64_t PublishedLimit(const Slot& slot) const;  // the limit readers see (0: to the end)
  // Ends a trial this thread claimed (running == true): frees its executor, sets `state` and
  // the message "<why> at step N", publishes and reports it. Needs mu_ not held.
  void EndClaimed(Slot& slot, const char* state, const std::string& why);
  // Early stopping, on a claimed slot (mu_ not held): checkpoint and end as EarlyStopped; or
  // checkpoint, free the executor and leave admission until the limit rises (Park).
  void StopClaimed(Slot& slot);
  /// StopEarly and Suspend: marks the trial to end as `state` with message `why` (at step N).
  Status RequestStop(const std::string& key, const char* state, const std::string& why);
  Status Park(Slot& slot);
  // On a claimed slot: runs the rest of a step begun on some shards (a checkpoint needs a
  // step boundary); evaluates the trial at its step unless its curve has that step already.
  Status FinishStep(Slot& slot);
  Status EvaluateAtStep(Slot& slot);
  // An ending trial's record: final losses (the last evaluation, the mean of the last 10
  // steps) and no time left.
  static void CloseRecord(TrialResult* r);
  // Needs mu_ held: the device an idle trial's executor is bound to (-1: none or running);
  // what the trial holds on a device it is bound to (its plan's peak); the memory left on
  // `device` for another trial (-1: the device has no limit).
  int BoundDevice(const Slot& slot, bool claimed = false) const;
  // Needs mu_ held: whether an idle trial bound to device `bound` may move to device `to`
  // (while `bound` runs another trial, where its executor MayMoveNow, unless a move to `to`
  // found no room in the trial's current step).
  bool MayMoveFrom(const Slot& slot, int bound, int to) const;
  // Needs mu_ held: what a free `device` may run now (runnable[i] is slots[i]): unbound trials
  // and those bound to it, or if there are none, trials bound to a busy device (moved here);
  // device_full when one of its own waits for its memory.
  struct Candidates {
    std::vector<RunnableTrial> runnable;
    std::vector<Slot*> slots;
    bool device_full = false;
  };
  Candidates CandidatesFor(int device) const;
  int64_t DeviceNeed(const Slot& slot) const;
  int64_t DeviceMemoryFree(int device) const;
  /// After a failure on `device`: the factory's DeviceFailure, recorded in failed_devices_
  /// (under mu_, which must not be held) so that no device takes over a trial bound there.
  std::optional<std::string> CheckDevice(int device);
  /// On a claimed slot (mu_ not held) whose checkpoint (or the step before it) failed with
  /// `what`: `what`, or where the GPU its executor is bound to is lost (CheckDevice), that
  /// failure with `what` in brackets; DropExecutor then leaves the executor on that GPU.
  std::string CheckedFailure(Slot& slot, const std::string& what);
  /// Ends as Interrupted every idle trial bound to failed `device`, or every idle trial once
  /// every device failed (mu_ not held).
  void EndTrialsOn(int device, const std::string& why);
  /// On a claimed slot (mu_ not held): if its executor is bound to a failed device, marks it
  /// Interrupted (its executor left on the lost GPU) and returns true.
  bool EndIfOnFailedDevice(Slot& slot);
  /// Needs mu_ held: whether every device failed (no device will run a trial again).
  bool EveryDeviceFailed() const;
  /// Needs mu_ held: whether the slot's executor is bound to a failed device (`claimed`: as
  /// BoundDevice).
  bool OnFailedDevice(const Slot& slot, bool claimed = false) const;
  /// On a claimed slot (mu_ not held): frees its executor, or where it is bound to a failed
  /// device leaves it to the process's end (freeing tensors on a lost GPU could throw).
  void DropExecutor(Slot& slot);
  // Needs mu_ held: the step limit in effect, and whether the trial waits at it.
  int64_t LimitOf(const Slot& slot) const;
  bool AtLimit(const Slot& slot) const;
  // Needs mu_ held: a claimable slot for StopClaimed, or a waiting admitted one to Park (bound
  // to `device`, or any with -1).
  Slot* ClaimStopRequested();
  Slot* ClaimParkable(int device);
  // Parks a slot claimed by ClaimParkable: checkpointed, its executor freed, out of admission
  // until its limit rises (or Interrupted if the checkpoint fails). Unlocks `lock` meanwhile.
  void ParkClaimed(Slot& slot, std::unique_lock<std::mutex>& lock);

  executor::ExecutorFactoryInterface* factory_;
  TrialObserverInterface* observer_;
  TrialSchedulerOptions options_;
  const int64_t host_limit_;  // options_.host_memory_bytes, or the default when <= 0
  std::unique_ptr<SchedulingPolicyInterface> policy_;

  mutable std::mutex mu_;  // guards everything below but the slots' worker-owned fields
  std::condition_variable cv_;
  std::vector<std::unique_ptr<Slot>> slots_;
  size_t next_index_ = 0;  // the next Submit's index (its place in the schedule)
  std::map<std::pair<std::string, int64_t>, std::shared_ptr<const executor::TokenDataset>> data_;
  Schedule schedule_;
  std::vector<double> busy_;
  std::vector<double> running_since_;  // per device: start of the current step, -1 if idle
  std::vector<std::vector<Slot*>> on_device_;
  std::map<int, std::string> failed_devices_;  // FailedDevices(); guarded by mu_
  bool draining_ = false, paused_ = false, shutdown_ = false;
  int reporting_ = 0;                            // worker reports being delivered outside the lock
  std::chrono::steady_clock::time_point start_;  // the first Submit: time 0 of the schedule
  bool clock_started_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace hydra::agent
