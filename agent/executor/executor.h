#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "agent/executor/dataset.h"
#include "common/admission.h"
#include "common/devices.h"
#include "common/job.h"
#include "common/status.h"

namespace hydra::executor {

/// A tensor as bytes: what checkpoints and tiers move. `data` is the tensor's contiguous
/// little-endian storage.
struct NamedBuffer {
  std::string name;   ///< "block0.attn.qkv.weight", "block0.attn.qkv.weight.exp_avg", ...
  std::string dtype;  ///< "float32", "int64"
  std::vector<int64_t> shape;
  std::vector<char> data;
};

struct StepMetrics {
  double loss = 0;       ///< mean training loss over the step's micro-batches
  int64_t tokens = 0;    ///< tokens trained on in this step
  double seconds = 0;    ///< wall time of the step
  double grad_norm = 0;  ///< global gradient L2 norm before clipping
  double learning_rate = 0;
};

/// What one shard-task did (TrialExecutorInterface::RunTask).
struct TaskResult {
  size_t task = 0;   ///< its index within the step: forwards, the last shard, backwards, applies
  size_t tasks = 1;  ///< tasks in a step of this trial
  std::optional<StepMetrics> step;  ///< set when this task ended the step
};

struct ExecutorStats {
  int64_t shards = 1;  ///< shards the trial's model is cut into
  int64_t parameters = 0;
  int64_t peak_device_bytes = 0;  ///< accounted device-tier peak (state + activations)
  int64_t disk_bytes_read = 0;    ///< spill traffic so far
  int64_t disk_bytes_written = 0;
  /// Bytes copied from host memory to a discrete device's memory so far (a GPU's, or a
  /// simulated one's): the spilled shards' uploads, as they travel (bf16 weight transit
  /// halves its weights' share).
  int64_t bytes_uploaded = 0;
  /// bf16 weight transit: weight tensors cast to bf16 on the host so far (once per change of
  /// the host copies, not per upload).
  int64_t weight_casts = 0;
  /// Activation offload: saved-activation bytes copied out to host memory so far (each comes
  /// back once for its backward).
  int64_t activation_bytes_offloaded = 0;
  /// Spilled shards held on a discrete device before their plan fetches them so far
  /// (ExecutorOptions::lookahead): kept after their forward or their step, or fetched early.
  int64_t lookahead_holds = 0;
  /// Host-stepped shards' optimizer steps (all but shard 0's) run after the next shard's
  /// backward was queued, so far: on a GPU the host steps while the device computes
  /// (ZeRO-Offload's overlap); on a CPU the backward is done by then, the order the same.
  int64_t host_steps_deferred = 0;
};

/// Trains one trial. Not thread-safe: one thread drives an executor at a time.
class TrialExecutorInterface {
 public:
  virtual ~TrialExecutorInterface() = default;
  /// Runs optimizer step `step()` (all micro-batches) on that step's batch; step() advances.
  virtual StatusOr<StepMetrics> TrainStep() = 0;
  /// Runs the next shard-task of the step under way, starting step `step()` if none is: a
  /// shard's forward over all micro-batches, the last shard's forward and backward, a shard's
  /// backward with its optimizer step, or (with clipping) a shard's clipped optimizer step.
  /// Consecutive tasks may run on different threads (one at a time); Evaluate, ExportState and
  /// ImportState need a step boundary (!InStep()). A task that fails abandons the step. The
  /// default runs the whole step as one task.
  virtual StatusOr<TaskResult> RunTask() {
    auto m = TrainStep();
    if (!m.ok()) return m.status();
    TaskResult r;
    r.step = *m;
    return r;
  }
  /// Whether a step has tasks left to run.
  virtual bool InStep() const { return false; }
  /// Mean loss over the fixed validation windows. Changes no state.
  virtual StatusOr<double> Evaluate() = 0;
  /// Optimizer steps taken so far.
  virtual int64_t step() const = 0;
  /// Everything needed to continue bit-exactly: weights and optimizer state.
  virtual StatusOr<std::vector<NamedBuffer>> ExportState() = 0;
  /// Restores ExportState's buffers (every one, with matching shape and dtype) and the step.
  virtual Status ImportState(int64_t step, const std::vector<NamedBuffer>& state) = 0;
  virtual ExecutorStats stats() const = 0;
  /// The device (an index into the factory's devices) that holds this trial's state and must
  /// run its tasks, or -1 when any device may: CPU devices share the host's memory, so a trial
  /// moves between them for free, while a GPU keeps a trial's resident state (the in-memory
  /// executor's whole model, the spilling executor's tied weights and the step under way).
  virtual int BoundDevice() const { return -1; }
  /// Moves what the executor keeps on its device to `device` (another GPU of the factory; a
  /// device-to-device copy) where MayMoveNow(): FAILED_PRECONDITION otherwise. Nothing to do
  /// for an executor that is bound to no device. UNAVAILABLE: `device` had no room (memory
  /// that other processes hold, which no plan counted) and the move was undone: the trial is
  /// whole on the device it was bound to and goes on there. Any other failure fails the trial.
  virtual Status MoveTo(int device) {
    (void)device;
    return OkStatus();
  }
  /// Whether MoveTo may move it now: between steps; within a step where the executor's step
  /// can go on on another device from its next task (the spilling executor's, where its shards
  /// come from host memory and no autograd graph is on its device).
  virtual bool MayMoveNow() const { return !InStep(); }
};

/// An executor's memory of a step that failed midway. Its state is then no step's: some shards
/// may have stepped their optimizer and others not, gradients may be half accumulated, a part
/// whose read failed holds bytes no checksum vouched for. From then on the executor refuses to
/// train, evaluate, export, import or move (FAILED_PRECONDITION naming the first failure;
/// UNAVAILABLE where that was UNAVAILABLE, a full spill directory: the trial resumes), so
/// that nothing trains on or checkpoints such state; the way on is a new executor with the last
/// checkpoint imported (what the agent's scheduler does with a failed trial).
class FailedStep {
 public:
  /// Keeps the first failure, `error` of step `step`, and returns `error`.
  Status Record(Status error, int64_t step);
  /// OK while no step has failed; else FAILED_PRECONDITION: `what` refused, and why.
  Status Check(const std::string& what) const;
  bool failed() const { return first_.has_value(); }
  /// `body()` (a Status or StatusOr), refused as Check says; a failure of it is recorded as
  /// step `step`'s.
  template <typename Body>
  auto Guard(const std::string& what, int64_t step, Body&& body) -> decltype(body()) {
    if (Status refused = Check(what); !refused.ok()) return refused;
    auto result = body();
    if (!result.ok()) Record(StatusOf(result), step);
    return result;
  }
  /// A move, refused as Check says: `move()` (MoveTo's work), and where that ran out of memory
  /// (RESOURCE_EXHAUSTED) `back()`, the same move to the device it came from, which undoes it:
  /// UNAVAILABLE then, nothing recorded. Any other failure of `move`, or one of `back`, is
  /// recorded as step `step`'s.
  template <typename Move, typename Back>
  Status GuardMove(const std::string& what, int64_t step, Move&& move, Back&& back) {
    if (Status refused = Check(what); !refused.ok()) return refused;
    Status moved = move();
    if (moved.code() != StatusCode::kResourceExhausted) return Record(std::move(moved), step);
    return Undone(moved, back(), step);
  }

 private:
  /// GuardMove's end once `move` ran out of memory and `back` ran.
  Status Undone(const Status& moved, Status back, int64_t step);
  static const Status& StatusOf(const Status& s) { return s; }
  template <typename T>
  static const Status& StatusOf(const StatusOr<T>& s) {
    return s.status();
  }

  std::optional<Status> first_;
  int64_t step_ = 0;
};

/// The devices an executor factory builds executors for.
struct ExecutorDevices {
  /// By index (Build's `device`); empty: CPU devices, as many as the caller runs.
  std::vector<DeviceSpec> devices;
  /// Makes CPU devices behave as discrete ones: a spilled shard is copied to separate device
  /// tensors and back, and executors stay on the device they were built for, as on a GPU. For
  /// tests, so that the GPU's code paths run on machines without one.
  bool simulate_discrete = false;

  /// Device `index`; INVALID_ARGUMENT when there is no such device.
  StatusOr<DeviceSpec> At(int index) const;
  /// Whether device `spec`'s memory is apart from the host's (a GPU, or simulated).
  bool Discrete(const DeviceSpec& spec) const {
    return spec.kind == DeviceKind::kCuda || simulate_discrete;
  }
  /// The smallest memory of the discrete devices (the default budget of a trial that names
  /// none); 0 when the devices are not discrete.
  int64_t DiscreteMemoryBytes() const;
  /// Whether any device is a GPU (its memory is not the host's).
  bool HasGpus() const;
};

/// `trial` with spec.resources.deviceMemoryBudget set to the devices' memory when it names
/// none and the devices are discrete (a GPU's memory is a hard limit; a CPU device's is not).
Trial WithDeviceBudget(const Trial& trial, const ExecutorDevices& devices);

/// Shards a spilling step on a GPU holds in host memory at once with the disk tier: the one
/// computing, the next one read ahead and the previous one written back (its SlabPool's bound).
inline constexpr int kDiskShardsInHostMemory = 3;

/// On a GPU the device tier is not host memory: the host memory an admitted trial holds is its
/// state in the host tier and its offloaded activations, or with the disk tier the pinned slabs of
/// kDiskShardsInHostMemory shards at most. Changes `admission` only when `devices` has GPUs.
void HostBytesOnGpus(const ExecutorDevices& devices, Admission* admission);

/// Whether this LibTorch runs attention as one fused kernel (scaled_dot_product_attention with
/// a scale, 2.1 and later: the CUDA build, not Debian's 1.13); executors then plan and run
/// attention fused by default (AttentionMemory::kFused). Defined in attention.cc.
bool FusedAttentionAvailable();

/// What attention keeps for backward in an executor whose fused_attention option is
/// `fused_attention`: kFused where that is on and FusedAttentionAvailable(), else kKept (plans
/// may still choose to recompute the scores). Defined in attention.cc.
AttentionMemory ExecutorAttention(bool fused_attention);

/// Whether SavedTensorCapture (offloaded_graph.h) sees what autograd saves, so that shards may
/// be planned to offload their graphs (PartitionOptions::activation_offload): the process's
/// autograd engine is the one offloaded_graph.cc installs before main. Another (a Python
/// interpreter's, set when torch is imported into it) leaves captures empty. Defined in
/// offloaded_graph.cc.
bool SavedTensorCaptureAvailable();

/// A shape as messages show it: "[2,3]".
std::string ShapeText(const std::vector<int64_t>& shape);

/// The checks every executor factory makes first: a supported model family, and a dataset whose
/// tokens all fall inside the model's vocabulary. INVALID_ARGUMENT naming the field otherwise.
Status CheckModelAndData(const Trial& trial, const TokenDataset& data);

/// Makes executors; the local runner and the agent receive one through their constructors.
class ExecutorFactoryInterface {
 public:
  virtual ~ExecutorFactoryInterface() = default;
  /// Admission, run once per trial before any training starts: the model and data checked, the
  /// trial planned as this factory will build it, and what it will hold (common/admission.h).
  /// RESOURCE_EXHAUSTED when the trial cannot fit the device budget (or the spill directory),
  /// INVALID_ARGUMENT when the model family is unsupported or the dataset holds tokens outside
  /// the model's vocabulary.
  virtual StatusOr<Admission> Admit(const Trial& trial, const TokenDataset& data) = 0;
  /// Builds the trial's model and optimizer, initialised from training.seed, as `admission`
  /// (this factory's Admit of the same trial) planned them, to train on `device` (an index
  /// into the factory's devices; 0 when it was given none). INVALID_ARGUMENT for a device the
  /// factory does not have.
  virtual StatusOr<std::unique_ptr<TrialExecutorInterface>> Build(
      const Trial& trial, std::shared_ptr<const TokenDataset> data, const Admission& admission,
      int device) = 0;
  /// Admit's verdict alone.
  Status Check(const Trial& trial, const TokenDataset& data);
  /// Admit, then Build on `device`: for callers that keep no admission (benchmarks, tests).
  StatusOr<std::unique_ptr<TrialExecutorInterface>> Create(const Trial& trial,
                                                           std::shared_ptr<const TokenDataset> data,
                                                           int device = 0);
  /// Completes what a model file defines (family torchscript: loads and checks the module and
  /// fills trial->model.layers for the planner); INVALID_ARGUMENT / NOT_FOUND naming the file.
  /// Nothing to do for the built-in families.
  virtual Status Resolve(Trial* trial) {
    (void)trial;
    return OkStatus();
  }
  /// On a GPU among this factory's devices (`device`, an index into them), its caching
  /// allocator's bytes now; nullopt for a CPU device, a build without CUDA, or a factory that
  /// does not train on GPUs.
  virtual std::optional<DeviceAllocatorBytes> AllocatorBytes(int device) const {
    (void)device;
    return std::nullopt;
  }
  /// After a failure on `device` (an index into this factory's devices): why that device can
  /// no longer train (a GPU whose CUDA context an error left unusable), or nullopt where it
  /// can (compute_device.h's DeviceFailure); nullopt by default.
  virtual std::optional<std::string> DeviceFailure(int device) const {
    (void)device;
    return std::nullopt;
  }
  /// Whether WriteModelFiles writes anything for `trial` (so the caller exports its state).
  virtual bool WritesModelFiles(const Trial& trial) const {
    (void)trial;
    return false;
  }
  /// Writes a finished trial's weights (an executor's ExportState) where its users read them,
  /// into `dir`, the trial's checkpoint directory: family torchscript a state dict for Python's
  /// torch.load (model.pt); gpt2 model.safetensors and config.json for Hugging Face
  /// transformers. Nothing by default.
  virtual Status WriteModelFiles(const Trial& trial, const std::vector<NamedBuffer>& state,
                                 const std::string& dir) {
    (void)trial, (void)state, (void)dir;
    return OkStatus();
  }
};

}  // namespace hydra::executor
