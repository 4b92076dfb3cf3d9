#include "agent/executor/executor.h"

#include <algorithm>
#include <utility>

namespace hydra::executor {

Status FailedStep::Record(Status error, int64_t step) {
  if (!first_ && !error.ok()) {
    first_ = error;
    step_ = step;
  }
  return error;
}

Status FailedStep::Check(const std::string& what) const {
  if (!first_) return OkStatus();
  // A first failure that was UNAVAILABLE (a full spill directory) keeps its code: the trial is
  // interrupted and resumes, as it would have been had that failure reached the scheduler.
  const StatusCode code = first_->code() == StatusCode::kUnavailable
                              ? StatusCode::kUnavailable
                              : StatusCode::kFailedPrecondition;
  return Status(code, what + " refused: step " + std::to_string(step_) + " failed midway (" +
                          first_->ToString() +
                          ") and left the trial's state inconsistent; resume it from its "
                          "last checkpoint in a new executor");
}

Status FailedStep::Undone(const Status& moved, Status back, int64_t step) {
  if (!back.ok()) {
    return Record(InternalError(moved.message() + "; moving back failed too: " + back.message()),
                  step);
  }
  return UnavailableError(moved.message() + "; moved back, it goes on where it was");
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}

Status CheckModelAndData(const Trial& trial, const TokenDataset& data) {
  const bool images = IsImageTask(trial);
  const int64_t limit = images ? trial.model.num_classes : trial.model.vocab_size;
  if (data.max_token() >= limit) {
    return InvalidArgumentError(
        "spec.dataset.path: " + data.path() + (images ? " holds label " : " holds token id ") +
        std::to_string(data.max_token()) +
        (images ? ", outside the model's classes (spec.model.numClasses = "
                : ", outside the model's vocabulary (spec.model.vocabSize = ") +
        std::to_string(limit) + ")");
  }
  return OkStatus();
}

StatusOr<DeviceSpec> ExecutorDevices::At(int index) const {
  if (devices.empty() && index >= 0) return CpuDevice(index, 0);
  if (index < 0 || static_cast<size_t>(index) >= devices.size()) {
    return InvalidArgumentError("no device " + std::to_string(index) + " among the " +
                                std::to_string(std::max<size_t>(devices.size(), 1)) +
                                " this executor factory was given");
  }
  return devices[static_cast<size_t>(index)];
}

int64_t ExecutorDevices::DiscreteMemoryBytes() const {
  int64_t least = 0;
  for (const auto& d : devices) {
    if (!Discrete(d) || d.memory_bytes <= 0) continue;
    least = least == 0 ? d.memory_bytes : std::min(least, d.memory_bytes);
  }
  return least;
}

bool ExecutorDevices::HasGpus() const {
  for (const auto& d : devices) {
    if (d.kind == DeviceKind::kCuda) return true;
  }
  return false;
}

void HostBytesOnGpus(const ExecutorDevices& devices, Admission* admission) {
  if (!devices.HasGpus()) return;
  const PartitionPlan& p = admission->plan;
  if (p.state_tier == StateTier::kHost) {
    admission->host_bytes = p.total_state_bytes + p.offloaded_bytes;
    return;
  }
  int64_t largest = 0;
  for (const auto& s : p.shards) largest = std::max(largest, s.state_bytes);
  admission->host_bytes = std::min(p.total_state_bytes, kDiskShardsInHostMemory * largest);
}

Trial WithDeviceBudget(const Trial& trial, const ExecutorDevices& devices) {
  Trial t = trial;
  const int64_t memory = devices.DiscreteMemoryBytes();
  if (!t.resources.device_memory_budget && memory > 0) t.resources.device_memory_budget = memory;
  return t;
}

Status ExecutorFactoryInterface::Check(const Trial& trial, const TokenDataset& data) {
  return Admit(trial, data).status();
}

StatusOr<std::unique_ptr<TrialExecutorInterface>> ExecutorFactoryInterface::Create(
    const Trial& trial, std::shared_ptr<const TokenDataset> data, int device) {
  ASSIGN_OR_RETURN(Admission admission, Admit(trial, *data));
  return Build(trial, std::move(data), admission, device);
}

}  // namespace hydra::executor
