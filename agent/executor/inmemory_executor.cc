#include "agent/executor/inmemory_executor.h"

#include <chrono>
#include <cstring>

#include "agent/executor/batches.h"
#include "agent/executor/compute_device.h"
#include "agent/executor/cpu_threads.h"
#include "agent/executor/gpt2.h"
#include "agent/executor/gpus.h"
#include "agent/executor/host_allocator.h"
#include "agent/executor/optimizer.h"
#include "agent/executor/precision.h"
#include "agent/executor/tensor_buffers.h"
#include "agent/executor/torchscript.h"
#include "common/cost_model.h"
#include "common/units.h"

namespace hydra::executor {
namespace {

class InMemoryExecutor : public TrialExecutorInterface, private ReturnsHostMemoryWhenDone {
 public:
  /// `model` is built in host memory; it moves to `device` (the factory's device `index`)
  /// before the optimizer allocates its state there.
  /// `peak_device_bytes`: the plan's (the footprint, less what recomputed attention scores
  /// save).
  InMemoryExecutor(const Trial& trial, std::shared_ptr<const TokenDataset> data,
                   LayerSequence model, torch::Device device, int bound_device,
                   ExecutorDevices devices, int64_t peak_device_bytes)
      : trial_(trial),
        data_(std::move(data)),
        model_(MovedTo(std::move(model), device)),
        params_(model_.NamedParameters()),
        optimizer_(params_, trial.training),
        streams_(device),
        bound_device_(bound_device),
        devices_(std::move(devices)) {
    // The moves and the optimizer's state ran on the default stream, which the compute stream
    // does not wait for.
    SynchronizeDevice(device);
    for (const auto& [name, p] : params_) stats_.parameters += p.numel();
    stats_.shards = 1;
    stats_.peak_device_bytes = peak_device_bytes;
  }

  StatusOr<StepMetrics> TrainStep() override {
    return failed_.Guard(trial_.name + " step " + std::to_string(step_), step_,
                         [&] { return Step(); });
  }

  StatusOr<double> Evaluate() override {
    RETURN_IF_ERROR(failed_.Check("evaluating " + trial_.name));
    UseCpuThreadsFor(trial_.training.precision);
    try {
      torch::NoGradGuard no_grad;
      DeviceStreams::ComputeScope on_device(streams_);
      double total = 0;
      int64_t sequences = 0;
      for (const auto& batch : ValidationSamples(*data_, trial_)) {
        total += Loss(OnDevice(batch)).item<double>() * static_cast<double>(batch.size());
        sequences += batch.size();
      }
      return total / static_cast<double>(sequences);
    } catch (const c10::Error& e) {
      return TorchErrorStatus(e, "evaluating " + trial_.name, Device());
    }
  }

  int64_t step() const override { return step_; }

  StatusOr<std::vector<NamedBuffer>> ExportState() override {
    RETURN_IF_ERROR(failed_.Check("exporting " + trial_.name));
    std::vector<NamedBuffer> out;
    for (const auto& [name, p] : params_) out.push_back(TensorToBuffer(name, p));
    for (const auto& [name, s] : optimizer_.NamedState()) out.push_back(TensorToBuffer(name, s));
    return out;
  }

  Status ImportState(int64_t step, const std::vector<NamedBuffer>& state) override {
    RETURN_IF_ERROR(failed_.Check("importing the state of " + trial_.name));
    std::vector<std::pair<std::string, torch::Tensor>> targets = params_;
    for (const auto& entry : optimizer_.NamedState()) targets.push_back(entry);
    RETURN_IF_ERROR(CopyBuffersInto(state, targets));  // checks everything before copying
    step_ = step;
    return OkStatus();
  }

  ExecutorStats stats() const override { return stats_; }
  int BoundDevice() const override { return bound_device_; }

  /// The whole model, its gradients and optimizer state go to the other GPU (a
  /// device-to-device copy).
  Status MoveTo(int device) override {
    RETURN_IF_ERROR(failed_.Check("moving " + trial_.name));
    if (bound_device_ < 0 || device == bound_device_) return OkStatus();
    ASSIGN_OR_RETURN(Placement to, PlaceOn(devices_, device));
    ASSIGN_OR_RETURN(Placement from, PlaceOn(devices_, bound_device_));
    return failed_.GuardMove(
        "moving " + trial_.name, step_, [&] { return MoveModel(to); },
        [&] { return MoveModel(from); });
  }

  ~InMemoryExecutor() override {
    // Kernels of a failed step may still use the memory about to be freed.
    streams_.MarkCompute().Synchronize();
  }

 private:
  StatusOr<StepMetrics> Step() {
    const auto start = std::chrono::steady_clock::now();
    const auto& tr = trial_.training;
    const int64_t micro = tr.batch_size / tr.gradient_accumulation_steps;
    StepMetrics m;
    UseCpuThreadsFor(tr.precision);
    try {
      DeviceStreams::ComputeScope on_device(streams_);
      const Batch batch = OnDevice(TrainBatch(*data_, trial_, step_));
      // Summed on the device, read once: no wait for the device per micro-batch.
      torch::Tensor loss_sum =
          torch::zeros({}, torch::TensorOptions(Device()).dtype(torch::kDouble));
      for (int64_t a = 0; a < tr.gradient_accumulation_steps; ++a) {
        auto loss = Loss(batch.Slice(a * micro, micro));
        (tr.gradient_accumulation_steps == 1 ? loss : loss / tr.gradient_accumulation_steps)
            .backward();
        loss_sum.add_(loss.detach().to(torch::kDouble));
      }
      // The global norm costs a pass over every gradient: only when clipping.
      if (tr.grad_clip_norm > 0) m.grad_norm = optimizer_.ClipGradNorm(tr.grad_clip_norm);
      m.learning_rate = LearningRateAt(tr, step_);
      optimizer_.Step(m.learning_rate, step_ + 1);
      // Freed, not zeroed: the next backward's first gradient becomes .grad as it is (no zeroing
      // pass and no add per parameter: on a GPU two kernel launches a parameter a step), and the
      // sums are the same to the bit (0 + g is g).
      optimizer_.ReleaseGrads();
      m.loss = loss_sum.item<double>() / static_cast<double>(tr.gradient_accumulation_steps);
    } catch (const c10::Error& e) {
      return TorchErrorStatus(e, "training step " + std::to_string(step_) + " of " + trial_.name,
                              Device());
    } catch (const std::exception& e) {  // TorchScript's interpreter throws these
      return InternalError("training step " + std::to_string(step_) + " of " + trial_.name + ": " +
                           e.what());
    }
    ++step_;
    m.tokens = tr.batch_size * TokensPerSample(trial_);
    m.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return m;
  }

  Status MoveModel(const Placement& to) {
    const torch::Device from = Device();
    // What is copied device to device: the copies read it on the old device's current stream,
    // which nothing else orders, so it lives until the new device has them.
    const std::vector<torch::Tensor> sources = HeldOnDevice();
    try {
      torch::NoGradGuard g;
      streams_.MoveTo(to.device);
      MoveLayers(model_, to.device);  // in place: a failure midway leaves the model whole
      for (auto& [name, p] : params_) p.mutable_grad() = torch::Tensor();  // fresh next step
      for (auto& [name, t] : optimizer_.NamedState()) t.set_data(t.to(to.device));
      SynchronizeDevice(to.device);
      bound_device_ = to.bound;
      return OkStatus();
    } catch (const c10::Error& e) {
      // Out of memory midway, say (MoveTo moves back next): the copies begun read `sources`.
      SynchronizeAfterFailure(from);
      SynchronizeAfterFailure(to.device);
      return TorchErrorStatus(e, "moving " + trial_.name + " to " + to.device.str(), to.device);
    }
  }

  /// The tensors a move copies: the layers' parameters and buffers, the optimizer's state.
  std::vector<torch::Tensor> HeldOnDevice() {
    std::vector<torch::Tensor> held;
    for (const auto& layer : model_.layers) {
      for (const auto& t : layer->parameters()) held.push_back(t.detach());
      for (const auto& t : layer->buffers()) held.push_back(t.detach());
    }
    for (auto& [name, t] : optimizer_.NamedState()) held.push_back(t.detach());
    return held;
  }

  static LayerSequence MovedTo(LayerSequence model, torch::Device device) {
    MoveLayers(model, device);
    return model;
  }
  static void MoveLayers(LayerSequence& model, torch::Device device) {
    // Parameters and buffers keep their tensors (set_data), so tied weights stay tied.
    if (!device.is_cpu()) {
      for (auto& layer : model.layers) layer->to(device);
    }
  }
  torch::Device Device() const { return streams_.device(); }
  Batch OnDevice(const Batch& b) const {
    if (Device().is_cpu()) return b;
    return {b.input.to(Device()), b.target.to(Device())};
  }

  torch::Tensor Loss(const Batch& batch) {
    PrecisionScope precision(trial_.training.precision, Device().type());
    return LayersLoss(trial_, model_, 0, model_.layers.size() - 1, batch.input, batch.target);
  }

  Trial trial_;
  std::shared_ptr<const TokenDataset> data_;
  LayerSequence model_;
  std::vector<std::pair<std::string, torch::Tensor>> params_;
  Optimizer optimizer_;
  DeviceStreams streams_;
  int bound_device_;         // -1: any device may run it
  ExecutorDevices devices_;  // the factory's, for MoveTo
  ExecutorStats stats_;
  int64_t step_ = 0;
  FailedStep failed_;  // a step that failed midway: everything after is refused
};

class InMemoryExecutorFactory : public ExecutorFactoryInterface {
 public:
  explicit InMemoryExecutorFactory(InMemoryExecutorOptions options) : options_(options) {
    if (options_.threads > 0) threading_ = ConfigureCpuThreads(options_.threads);
    ConfigureCudaAllocator();
    KeepFreedHostMemory();
  }

  StatusOr<Admission> Admit(const Trial& given, const TokenDataset& data) override {
    RETURN_IF_ERROR(CheckModelAndData(given, data));
    Trial trial = WithDeviceBudget(given, options_.devices);
    RETURN_IF_ERROR(ResolveModel(&trial));
    const AttentionMemory attention = ExecutorAttention(options_.fused_attention);
    // The plan of what this executor runs: one shard, its state in the host tier.
    PartitionOptions po = PartitionOptionsFor(trial);
    po.device_budget = 0;
    po.explicit_boundaries.clear();
    po.state_tier = StateTier::kHost;
    po.flops_per_second = options_.flops_per_second;
    po.fused_attention = attention == AttentionMemory::kFused;
    ASSIGN_OR_RETURN(Admission admission, PlanAdmission(trial, po));
    // Its peak: the footprint less the activations its backward frees before the last
    // gradients appear (ShardPlan::backward_freed_bytes).
    const int64_t peak = admission.plan.peak_device_bytes;
    if (trial.resources.device_memory_budget && peak > *trial.resources.device_memory_budget) {
      const TrialFootprint fp = EstimateTrialFootprint(trial, attention);
      return ResourceExhaustedError(
          "trial " + trial.name + " needs " + FormatBytes(peak) + " of device memory (" +
          FormatBytes(fp.parameter_bytes) + " parameters, " + FormatBytes(fp.gradient_bytes) +
          " gradients, " + FormatBytes(fp.optimizer_bytes) + " optimizer state, " +
          FormatBytes(fp.activation_bytes) + " activations, " + FormatBytes(fp.buffer_bytes) +
          " buffers, less " + FormatBytes(admission.plan.shards[0].backward_freed_bytes) +
          " freed in backward before the last gradients appear) but "
          "spec.resources.deviceMemoryBudget is " +
          FormatBytes(*trial.resources.device_memory_budget) +
          "; the in-memory executor does not spill");
    }
    HostBytesOnGpus(options_.devices, &admission);
    return admission;
  }
  Status Resolve(Trial* trial) override { return ResolveModel(trial); }
  bool WritesModelFiles(const Trial& trial) const override { return HasModelFiles(trial); }
  Status WriteModelFiles(const Trial& trial, const std::vector<NamedBuffer>& state,
                         const std::string& dir) override {
    return executor::WriteModelFiles(trial, state, dir);
  }

  StatusOr<std::unique_ptr<TrialExecutorInterface>> Build(const Trial& given,
                                                          std::shared_ptr<const TokenDataset> data,
                                                          const Admission& admission,
                                                          int device) override {
    Trial trial = WithDeviceBudget(given, options_.devices);
    RETURN_IF_ERROR(ResolveModel(&trial));
    ASSIGN_OR_RETURN(Placement on, PlaceOn(options_.devices, device));
    try {
      ASSIGN_OR_RETURN(LayerSequence model, BuildModel(trial));
      model.SetAttention(admission.plan.attention);
      model.SetSelectiveRecompute(admission.plan.selective_recompute);
      return std::unique_ptr<TrialExecutorInterface>(std::make_unique<InMemoryExecutor>(
          trial, std::move(data), std::move(model), on.device, on.bound, options_.devices,
          admission.plan.peak_device_bytes));
    } catch (const c10::Error& e) {
      return TorchErrorStatus(e, "building " + trial.name, on.device);
    }
  }

 private:
  InMemoryExecutorOptions options_;
  std::string threading_;
};

}  // namespace

std::unique_ptr<ExecutorFactoryInterface> MakeInMemoryExecutorFactory(
    InMemoryExecutorOptions options) {
  return std::make_unique<InMemoryExecutorFactory>(options);
}

}  // namespace hydra::executor
