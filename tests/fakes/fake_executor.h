#pragma once

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "agent/executor/executor.h"

namespace hydra::fakes {

/// What executors bound to devices did (FakeExecutorFactory::bind_to_devices).
struct DeviceLog {
  std::mutex mu;
  std::map<std::string, std::vector<int>> stepped_on;  ///< trial -> its bound device per step
  std::map<std::string, std::vector<int>> moves;       ///< trial -> devices it moved to
  std::map<std::string, int> moves_within_step;        ///< trial -> moves in a step's midst
  /// trial -> (device, step) of each move that found no room and was undone
  std::map<std::string, std::vector<std::pair<int, int64_t>>> no_room;
  std::set<int> lost;  ///< devices an injected failure left lost (FakeTasks::failures_lose_devices)
  std::vector<int> step_order;  ///< the bound device of every step of every trial, in order
  size_t lost_after = 0;        ///< step_order's size when a device was lost
  /// Executors destroyed while bound to a lost device (the scheduler must keep those).
  int freed_on_lost = 0;
};

/// How a FakeExecutor runs its steps (FakeExecutorFactory's fields of the same names).
struct FakeTasks {
  int per_step = 1;  ///< RunTask's tasks a step; the last one trains the step
  /// MayMoveNow only within a step (as a spilled trial on GPUs may), not between steps: the
  /// scheduler must ask the executor, not look at InStep.
  bool move_only_within_steps = false;
  /// Every move finds no room on its new device and is undone (UNAVAILABLE, as MoveTo says).
  bool moves_find_no_room = false;
  /// An injected failure (fail_at) leaves the device it happened on lost, as an illegal
  /// address leaves a GPU's context: the factory's DeviceFailure names it from then on.
  bool failures_lose_devices = false;
  /// With moves_find_no_room: the device a move leaves is lost just then (its next step there
  /// fails, with failures_lose_devices), and after_no_room runs before the move returns.
  bool no_room_loses_source = false;
  std::function<void()> after_no_room;
};

/// A torch-free executor whose "model" is one double that decays towards a floor set by the
/// learning rate; the loss of a step is a pure function of the state, so interrupted and
/// resumed runs can be compared exactly.
class FakeExecutor : public executor::TrialExecutorInterface {
 public:
  FakeExecutor(const Trial& trial, std::function<void(const std::string&, int64_t)> on_step,
               int64_t fail_at_step, std::chrono::milliseconds step_delay = {},
               int bound_device = -1, DeviceLog* log = nullptr, FakeTasks tasks = {})
      : trial_(trial),
        on_step_(std::move(on_step)),
        fail_at_step_(fail_at_step),
        step_delay_(step_delay),
        bound_device_(bound_device),
        log_(log),
        tasks_(tasks) {}
  ~FakeExecutor() override {
    if (log_ == nullptr) return;
    std::lock_guard<std::mutex> lock(log_->mu);
    log_->freed_on_lost += log_->lost.count(bound_device_) > 0;
  }

  StatusOr<executor::TaskResult> RunTask() override {
    if (tasks_.per_step <= 1) return TrialExecutorInterface::RunTask();
    executor::TaskResult r;
    r.task = static_cast<size_t>(task_);
    r.tasks = static_cast<size_t>(tasks_.per_step);
    if (++task_ < tasks_.per_step) return r;
    task_ = 0;
    auto m = TrainStep();
    if (!m.ok()) return m.status();
    r.step = *m;
    return r;
  }
  bool InStep() const override { return task_ > 0; }
  bool MayMoveNow() const override { return tasks_.move_only_within_steps ? InStep() : !InStep(); }

  StatusOr<executor::StepMetrics> TrainStep() override {
    if (Lost()) return InternalError("its device is lost");
    if (step_ == fail_at_step_) {
      if (tasks_.failures_lose_devices && log_) {
        std::lock_guard<std::mutex> lock(log_->mu);
        log_->lost.insert(bound_device_);
        log_->lost_after = log_->step_order.size();
      }
      return InternalError("injected failure at step " + std::to_string(step_));
    }
    if (step_delay_.count() > 0) std::this_thread::sleep_for(step_delay_);
    weight_ = weight_ * (1.0 - trial_.training.learning_rate * 100) + 0.01 * (step_ % 3);
    ++step_;
    if (log_) {
      std::lock_guard<std::mutex> lock(log_->mu);
      log_->stepped_on[trial_.name].push_back(bound_device_);
      log_->step_order.push_back(bound_device_);
    }
    if (on_step_) on_step_(trial_.name, step_);
    executor::StepMetrics m;
    m.loss = 1.0 + weight_;
    m.tokens = trial_.training.batch_size * trial_.model.context_length;
    m.seconds = 1e-3;
    return m;
  }
  StatusOr<double> Evaluate() override { return 1.1 + weight_; }
  int64_t step() const override { return step_; }
  StatusOr<std::vector<executor::NamedBuffer>> ExportState() override {
    if (Lost()) return InternalError("its device is lost: the state cannot be read");
    executor::NamedBuffer b{"w", "float64", {1}, std::vector<char>(sizeof(double))};
    std::memcpy(b.data.data(), &weight_, sizeof(double));
    return std::vector<executor::NamedBuffer>{b};
  }
  Status ImportState(int64_t step, const std::vector<executor::NamedBuffer>& state) override {
    if (state.size() != 1 || state[0].name != "w") return InvalidArgumentError("bad state");
    std::memcpy(&weight_, state[0].data.data(), sizeof(double));
    step_ = step;
    return OkStatus();
  }
  executor::ExecutorStats stats() const override { return {1, 3, 1000}; }
  int BoundDevice() const override { return bound_device_; }
  Status MoveTo(int device) override {
    if (bound_device_ < 0 || device == bound_device_) return OkStatus();
    if (!MayMoveNow()) return FailedPreconditionError("not movable now");
    if (tasks_.moves_find_no_room) {
      if (log_) {
        std::lock_guard<std::mutex> lock(log_->mu);
        log_->no_room[trial_.name].push_back({device, step_});
        if (tasks_.no_room_loses_source) log_->lost.insert(bound_device_);
      }
      if (tasks_.after_no_room) tasks_.after_no_room();
      return UnavailableError("no room on device " + std::to_string(device) + "; moved back");
    }
    bound_device_ = device;
    if (log_) {
      std::lock_guard<std::mutex> lock(log_->mu);
      log_->moves[trial_.name].push_back(device);
      if (InStep()) ++log_->moves_within_step[trial_.name];
    }
    return OkStatus();
  }

 private:
  /// With failures_lose_devices: whether the device it is bound to was lost.
  bool Lost() const {
    if (!tasks_.failures_lose_devices || log_ == nullptr) return false;
    std::lock_guard<std::mutex> lock(log_->mu);
    return log_->lost.count(bound_device_) > 0;
  }

  Trial trial_;
  std::function<void(const std::string&, int64_t)> on_step_;
  int64_t fail_at_step_;
  std::chrono::milliseconds step_delay_;
  int bound_device_;
  DeviceLog* log_;
  FakeTasks tasks_;
  int task_ = 0;  // the next task of the step under way (0: between steps)
  double weight_ = 4.0;
  int64_t step_ = 0;
};

class FakeExecutorFactory : public executor::ExecutorFactoryInterface {
 public:
  StatusOr<Admission> Admit(const Trial& trial, const executor::TokenDataset&) override {
    if (refuse.count(trial.name)) return ResourceExhaustedError("refused " + trial.name);
    return PlanAdmission(trial, PartitionOptionsFor(trial));
  }
  StatusOr<std::unique_ptr<executor::TrialExecutorInterface>> Build(
      const Trial& trial, std::shared_ptr<const executor::TokenDataset>, const Admission&,
      int device) override {
    ++created;
    {
      std::lock_guard<std::mutex> lock(mu);
      built_on[trial.name].push_back(device);
    }
    auto it = fail_at.find(trial.name);
    return std::unique_ptr<executor::TrialExecutorInterface>(
        std::make_unique<FakeExecutor>(trial, on_step, it == fail_at.end() ? -1 : it->second,
                                       step_delay, bind_to_devices ? device : -1, &devices, tasks));
  }

  std::atomic<int> created{0};
  std::chrono::milliseconds step_delay{0};  ///< every TrainStep sleeps this long
  std::map<std::string, int64_t> fail_at;   ///< trial name -> step whose TrainStep fails
  std::map<std::string, bool> refuse;       ///< trial names Admit refuses
  std::function<void(const std::string&, int64_t)> on_step;  ///< after every step
  /// Executors keep their state on the device they were built for (as on a GPU) and say so.
  bool bind_to_devices = false;
  FakeTasks tasks;  ///< how the executors' steps are cut into tasks and when they may move
  std::optional<DeviceAllocatorBytes> AllocatorBytes(int device) const override {
    std::lock_guard<std::mutex> lock(mu);
    auto it = allocator.find(device);
    if (it == allocator.end()) return std::nullopt;
    return it->second;
  }

  std::optional<std::string> DeviceFailure(int device) const override {
    std::lock_guard<std::mutex> lock(devices.mu);
    if (!devices.lost.count(device)) return std::nullopt;
    return "cudaErrorIllegalAddress: an illegal memory access was encountered (simulated)";
  }

  mutable DeviceLog devices;  ///< what bound executors did
  mutable std::mutex mu;
  std::map<int, DeviceAllocatorBytes> allocator;     ///< device -> AllocatorBytes; guarded by mu
  std::map<std::string, std::vector<int>> built_on;  ///< trial -> devices built on; guarded by mu
};

}  // namespace hydra::fakes
