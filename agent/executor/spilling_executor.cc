#include "agent/executor/spilling_executor.h"

#include <malloc.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "agent/executor/batches.h"
#include "agent/executor/compute_device.h"
#include "agent/executor/cpu_threads.h"
#include "agent/executor/disk_tier.h"
#include "agent/executor/gpt2.h"
#include "agent/executor/gpus.h"
#include "agent/executor/host_allocator.h"
#include "agent/executor/inmemory_executor.h"
#include "agent/executor/lookahead.h"
#include "agent/executor/offloaded_graph.h"
#include "agent/executor/optimizer.h"
#include "agent/executor/precision.h"
#include "agent/executor/residency.h"
#include "agent/executor/storage_in_place.h"
#include "agent/executor/tensor_buffers.h"
#include "agent/executor/tier_ledger.h"
#include "agent/executor/torchscript.h"
#include "common/partitioner.h"
#include "common/units.h"

namespace hydra::executor {
namespace {

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

int64_t Bytes(const NamedTensors& ts) {
  int64_t b = 0;
  for (const auto& [n, t] : ts) b += t.numel() * t.element_size();
  return b;
}

int64_t Bytes(const std::vector<torch::Tensor>& ts) {
  int64_t b = 0;
  for (const auto& t : ts) b += t.defined() ? t.numel() * t.element_size() : 0;
  return b;
}

/// A part of a shard's state that moves between the tiers as one: its weights, or its
/// optimizer state.
struct Part {
  const char* key = "";  // its spill file's suffix
  /// What compute uses: the model's parameters, or the optimizer's state. On a device that
  /// shares the host's memory (a CPU) they hold the part's bytes wherever it is; on a discrete
  /// device (a GPU) they hold device memory while the part is on the device and nothing
  /// otherwise, and `host` holds the host copies.
  NamedTensors tensors;
  std::vector<torch::Tensor> host;  // discrete devices: the host copies, when in host memory
  /// bf16 weight transit: per tensor, the pinned bf16 copy it travels as (undefined: as is),
  /// cast from `host` once per change of the host copies (the host optimizer's step, an
  /// import), not at every upload.
  std::vector<torch::Tensor> transit;
  enum class TransitCopies { kStale, kCurrent } transit_copies = TransitCopies::kStale;
  std::vector<std::vector<int64_t>> shapes;  // kept while the tensors are empty (on disk)
  std::optional<PartResidency> at;           // where it is; the ledger follows
  // Disk tier: the page-aligned memory the host side lives in once read back (O_DIRECT I/O),
  // and the read in flight while kReading.
  std::shared_ptr<AlignedSlab> slab;
  std::future<Status> read;
  // Discrete devices: the copy into the device (compute waits for it before using the part),
  // and the last copy out into `host` (the next copy in, and host readers, wait for it).
  StreamMark in_done, out_done;
  // Discrete devices, while kReading: the device memory reserved for the part when its read
  // was issued, and the compute stream's mark then (the copy in waits for that, not for the
  // compute queued while the disk read ran).
  std::vector<torch::Tensor> reserved;
  StreamMark reserved_free;
};

/// One shard's parameters and optimizer state.
struct Shard {
  ShardPlan plan;
  Part weights;              // movable parameters of the shard's layers (tied ones excluded)
  Part state;                // the optimizer's state: moves with the shard
  NamedTensors pinned;       // tied parameters the shard's layers lend: resident, stepped here
  NamedTensors pinned_host;  // discrete devices: their host copies (the host optimizer's)
  /// Over the weights and pinned: their compute tensors; on a discrete device with the
  /// optimizer on the host, their host copies (the state then lives only in host memory).
  std::unique_ptr<Optimizer> optimizer;
  int64_t grad_bytes = 0;
  std::future<Status> write;  // disk tier: the write-back of both parts while kWritingBack
  /// Discrete devices: the weights' gradients in host memory, while clipping waits for every
  /// shard's norm.
  std::vector<torch::Tensor> host_grads;
  /// bf16 weight transit: the fp32 sums of the bf16 weights' gradients over the micro-batches.
  std::vector<torch::Tensor> grad_sums;
};

class SpillingExecutor : public TrialExecutorInterface, private ReturnsHostMemoryWhenDone {
 public:
  SpillingExecutor(const Trial& trial, std::shared_ptr<const TokenDataset> data, PartitionPlan plan,
                   const ExecutorOptions& options, Placement on)
      : trial_(trial),
        data_(std::move(data)),
        plan_(std::move(plan)),
        on_(on),
        devices_(options.devices),
        options_bf16_transit_(options.bf16_weight_transit),
        lookahead_wanted_(options.lookahead),
        streams_(on.device),
        ledger_(trial.resources.device_memory_budget.value_or(0)),
        disk_(plan_.state_tier == StateTier::kDisk
                  ? std::make_unique<DiskTier>(
                        (std::filesystem::path(options.spill_dir) / trial.name).string())
                  : nullptr) {}

  ~SpillingExecutor() override {
    // Kernels of a step abandoned halfway may still use the memory about to be freed.
    streams_.MarkCompute().Synchronize();
    for (auto& s : shards_) {
      if (s.write.valid()) s.write.wait();
      for (Part* p : {&s.weights, &s.state}) {
        if (p->read.valid()) p->read.wait();
      }
    }
    WaitForCopies();  // a copy may still read or write the host memory about to be freed
  }

  /// Builds the model layer by layer; each shard is set up (and, with the disk tier, written
  /// out and freed) as soon as its last layer exists, so a model larger than memory never has
  /// to be whole in memory.
  Status Init() {
    if (disk_) RETURN_IF_ERROR(disk_->Init());
    if (on_.discrete) MakeHostPool();
    Status status;
    size_t next = 0;
    auto built = BuildModel(trial_, [&](const LayerSequence& seq, size_t layer) {
      if (!status.ok() || next >= plan_.shards.size() ||
          static_cast<int>(layer) != plan_.shards[next].last_layer) {
        return;
      }
      status = AddShard(seq, next++);
    });
    if (!built.ok()) return built.status();
    model_ = std::move(built).value();
    RETURN_IF_ERROR(status);
    model_.SetAttention(plan_.attention);
    model_.SetSelectiveRecompute(plan_.selective_recompute);
    for (const auto& [name, p] : model_.NamedParameters()) {
      global_order_[name] = global_order_.size();
    }
    if (on_.discrete) {
      MoveResidentsToDevice();
      // Set-up ran on the default stream, which the compute stream does not wait for.
      SynchronizeDevice(on_.device);
      if (disk_) MakeSlabPool();
      // The shards were built in the heap, which keeps freed memory (KeepFreedHostMemory):
      // give it back, as training on the device needs little of it.
      if (!disk_) malloc_trim(0);
    }
    MakeLookahead();
    RETURN_IF_ERROR(
        ledger_.Acquire(Tier::kDevice, 2 * Bytes(pinned_), "tied parameters and their gradients"));
    return ledger_.Acquire(Tier::kDevice, Bytes(Buffers()), "the layers' buffers");
  }

  Status AddShard(const LayerSequence& seq, size_t k) {
    Shard s;
    s.plan = plan_.shards[k];
    for (int i = s.plan.first_layer; i <= s.plan.last_layer; ++i) {
      std::map<const void*, bool> lent;
      for (const auto& t : seq.layers[i]->lent_parameters()) lent[t.unsafeGetTensorImpl()] = true;
      for (const auto& p : seq.layers[i]->named_parameters(true)) {
        auto entry = std::make_pair(seq.names[i] + "." + p.key(), p.value());
        (lent.count(p.value().unsafeGetTensorImpl()) ? s.pinned : s.weights.tensors)
            .push_back(entry);
      }
    }
    // Tied gradients are complete only after the last backward, that of shard 0.
    if (!s.pinned.empty() && k != 0) {
      return UnimplementedError("tied parameters are supported only in the first shard");
    }
    pinned_.insert(pinned_.end(), s.pinned.begin(), s.pinned.end());
    if (on_.discrete) {
      s.weights.host = HostCopies(s.weights.tensors);
      if (!disk_) UseHostCopies(s.weights);
      for (const auto& [n, t] : s.pinned) s.pinned_host.emplace_back(n, HostCopy(t));
    }
    // On a discrete device a host-stepped optimizer updates the host copies, and its state is
    // made (and stays) in host memory.
    NamedTensors all = HostSteps(s) ? Named(s.weights.tensors, s.weights.host) : s.weights.tensors;
    const NamedTensors& tied = HostSteps(s) ? s.pinned_host : s.pinned;
    all.insert(all.end(), tied.begin(), tied.end());
    s.optimizer = std::make_unique<Optimizer>(all, trial_.training, StateAllocatorFor(s));
    s.state.tensors = s.optimizer->NamedState();
    if (on_.discrete) {
      // Device-stepped, the state was made in its host memory (StateAllocatorFor; with the
      // disk tier, in the memory set-up writes out and frees).
      s.state.host = HostSteps(s) ? Values(s.state.tensors) : Aliases(s.state.tensors);
    }
    const std::string shard = " of shard " + std::to_string(k);
    const Tier rests_in = disk_ ? Tier::kDisk : Tier::kHost;
    s.weights.key = "w";
    s.state.key = "o";
    for (Part* p : {&s.weights, &s.state}) {
      for (const auto& [n, t] : p->tensors) p->shapes.push_back(t.sizes().vec());
      p->at.emplace(&ledger_, (p == &s.weights ? "weights" : "optimizer state") + shard,
                    Bytes(p->tensors), rests_in);
    }
    if (HostSteps(s) && options_bf16_transit_ && trial_.training.precision == Precision::kBf16) {
      s.weights.transit = TransitCopies(seq, s);
    }
    if (on_.discrete) {  // the host copies hold the part now: nothing is on the device yet
      LeaveDevice(s.weights);
      if (!HostSteps(s)) LeaveDevice(s.state);
    }
    s.grad_bytes = s.weights.at->bytes();
    shards_.push_back(std::move(s));
    if (disk_) {
      // Set-up frees each shard's freshly built tensors once written; glibc would keep that
      // memory in its heap (set-up's peak stayed resident: 2.5x the device budget in
      // DiskTierKeepsResidentMemoryNearTheBudget), so give it back now. Training steps do not
      // trim: their freed activations and gradients are reused by the next shard, and shard
      // state lives in AlignedSlabs that are unmapped when dropped (a trim after every shard
      // drop cost a fifth of GPT-2 small's throughput from disk; Drop still trims when
      // hostMemoryBudget says RAM is scarce).
      Status written = Spill(k);
      malloc_trim(0);
      return written;
    }
    return OkStatus();
  }

  StatusOr<StepMetrics> TrainStep() override {
    while (true) {
      auto r = RunTask();
      if (!r.ok()) return r.status();
      if (r->step) return *r->step;
    }
  }

  StatusOr<TaskResult> RunTask() override {
    return failed_.Guard(trial_.name + " step " + std::to_string(step_), step_,
                         [&] { return RunNextTask(); });
  }

  bool InStep() const override { return cur_.has_value(); }

  StatusOr<double> Evaluate() override {
    return failed_.Guard("evaluating " + trial_.name, step_, [&] { return EvaluateShards(); });
  }

  int64_t step() const override { return step_; }

  StatusOr<std::vector<NamedBuffer>> ExportState() override {
    return failed_.Guard("exporting " + trial_.name, step_, [&] { return ExportShards(); });
  }

  Status ImportState(int64_t step, const std::vector<NamedBuffer>& state) override {
    // A state that does not fit is refused before anything changes.
    RETURN_IF_ERROR(failed_.Check("importing the state of " + trial_.name));
    RETURN_IF_ERROR(CheckImport(state));
    return failed_.Guard("importing the state of " + trial_.name, step_, [&]() -> Status {
      try {
        DeviceStreams::ComputeScope on_device(streams_);
        return Import(step, state);
      } catch (const c10::Error& e) {
        return TorchErrorStatus(e, "importing the state of " + trial_.name, on_.device);
      }
    });
  }

  ExecutorStats stats() const override {
    ExecutorStats st;
    st.shards = static_cast<int64_t>(shards_.size());
    // From the shapes: a spilled shard's tensors are empty while its state is on disk.
    for (const auto& shard : shards_) {
      for (const auto& shape : shard.weights.shapes) {
        int64_t n = 1;
        for (int64_t d : shape) n *= d;
        st.parameters += n;
      }
    }
    for (const auto& [n, p] : pinned_) st.parameters += p.numel();
    st.peak_device_bytes = ledger_.peak(Tier::kDevice);
    if (disk_) {
      st.disk_bytes_read = disk_->bytes_read();
      st.disk_bytes_written = disk_->bytes_written();
    }
    st.bytes_uploaded = bytes_uploaded_;
    st.weight_casts = weight_casts_;
    st.activation_bytes_offloaded = bytes_offloaded_;
    st.lookahead_holds = lookahead_holds_;
    st.host_steps_deferred = host_steps_deferred_;
    return st;
  }

  int BoundDevice() const override { return on_.bound; }

  bool MayMoveNow() const override { return !InStep() || MovableWithinStep(); }

  /// Between steps every shard is off the device but the first, kept there with its host
  /// copies current (AfterLastUse), and the resident shards, whose host copies are brought up
  /// to date first: the tied weights and the buffers move, the streams follow, and the
  /// resident shards go up to the new device at their next use. Within a step
  /// (MovableWithinStep) the step's boundary activations and gradients go along too, and the
  /// shard the next task runs is fetched to the new device.
  Status MoveTo(int device) override {
    RETURN_IF_ERROR(failed_.Check("moving " + trial_.name));
    if (!on_.discrete || device == on_.bound) return OkStatus();
    if (!MayMoveNow()) {
      return FailedPreconditionError(
          trial_.name + " is within a step that keeps autograd graphs or resident shards on " +
          on_.device.str() + " (it may move between steps)");
    }
    ASSIGN_OR_RETURN(Placement to, PlaceOn(devices_, device));
    const Placement from = on_;
    return failed_.GuardMove(
        "moving " + trial_.name, step_, [&] { return MoveShards(to); },
        [&] { return MoveShards(from); });
  }

 private:
  // ---- the interface's work, refused and recorded by failed_ ---------------------------------

  Status MoveShards(const Placement& to) {
    // Every spilled shard leaves the device. Within a step what each task needs stays what the
    // lookahead measured (it is the same on any device); its holds go.
    if (cur_) {
      ForgetHolds();
    } else {
      ResetLookahead();
    }
    const torch::Device from = on_.device;
    // What is copied device to device: the copies read it on the old device's current stream,
    // which nothing else orders, so it lives until the new device has them.
    std::vector<torch::Tensor> sources;
    try {
      for (size_t k = 0; k < shards_.size(); ++k) {  // newer than their host copies
        for (Part* p : {&shards_[k].weights, &shards_[k].state}) {
          if (Resident(k) && p->at->where() == Residency::kOnDevice) CopyOut(*p);
        }
      }
      WaitForCopies();  // the next copy in, on the new device, reads the host copies
      RETURN_IF_ERROR(FinishWrites());  // a shard kept while its write went on leaves
      streams_.MoveTo(to.device);       // the old device's streams are done first
      on_ = to;
      // What is made on the new device is made on its compute stream, as in a task: the
      // caching allocator hands a block out again only after the stream it was made on has
      // passed its last use (ReserveOnDevice's reservations, the step's tensors).
      DeviceStreams::ComputeScope on_device(streams_);
      MoveResidentsToDevice(&sources);
      if (cur_) MoveStep(&sources);
      for (auto& s : shards_) {
        LeaveDevice(s.weights);  // empty tensors, now of the new device
        if (!HostSteps(s)) LeaveDevice(s.state);
        for (Part* p : {&s.weights, &s.state}) {  // the shard kept on the device (AfterLastUse)
          if (p->at->where() == Residency::kOnDevice)
            RETURN_IF_ERROR(p->at->To(Residency::kInHost));
        }
      }
      if (cur_) RETURN_IF_ERROR(FetchForNextTask());
      SynchronizeDevice(on_.device);
      return OkStatus();
    } catch (const c10::Error& e) {
      // Out of memory midway, say (MoveTo moves back next): the copies begun read `sources`.
      SynchronizeAfterFailure(from);
      SynchronizeAfterFailure(to.device);
      return TorchErrorStatus(e, "moving " + trial_.name + " to " + to.device.str(), to.device);
    }
  }

  /// Within a step, whether it may go on on another device from its next task (item 5 of the
  /// GPU issue: a spilled trial's next shard may run on any free GPU, its weights coming from
  /// host memory anyway). What the step keeps on the device is then its boundary activations,
  /// the gradient flowing back, its targets and loss, and the tied weights' gradients, which go
  /// along (MoveStep). Not where an autograd graph is on the device (a stash's, or an offloaded
  /// one's: its storages are that device's), with resident shards (a move would carry their
  /// state, which their plan keeps from moving at all), nor with the disk tier (its reads and
  /// writes go to and from the device's memory while they run).
  bool MovableWithinStep() const {
    if (!cur_ || !on_.discrete || disk_) return false;
    for (size_t k = 0; k < shards_.size(); ++k) {
      if (Resident(k) || cur_->offloaded[k]) return false;
      for (const auto& out : cur_->outputs[k]) {
        if (out.defined()) return false;
      }
    }
    return true;
  }

  /// Within a step, on the new device (on_): what the step keeps between its tasks (the old
  /// tensors added to `sources`).
  void MoveStep(std::vector<torch::Tensor>* sources) {
    torch::NoGradGuard g;
    StepInProgress& c = *cur_;
    const auto move = [&](torch::Tensor& t) {
      if (!t.defined()) return;
      sources->push_back(t);
      t = t.to(on_.device);
    };
    for (auto& per_shard : c.inputs) {
      for (auto& t : per_shard) move(t);
    }
    for (auto& t : c.grad_out) move(t);
    for (auto& t : c.targets) move(t);
    move(c.loss_sum);
    for (auto& [i, norm] : norms_) move(norm);
  }

  /// After a move within a step: what the task before the next one fetched for it (Task's
  /// order: forwards, the last shard, backwards; an apply task fetches its own shard).
  Status FetchForNextTask() {
    const size_t S = shards_.size(), t = cur_->next, L = S - 1;
    if (t < L) return Fetch(t, false);
    if (t == L) return Fetch(L, true);
    if (t < 2 * S - 1) return Fetch(2 * S - 2 - t, true);
    return OkStatus();
  }

  StatusOr<TaskResult> RunNextTask() {
    const auto start = std::chrono::steady_clock::now();
    TaskResult r;
    r.tasks = TasksPerStep();
    r.task = cur_ ? cur_->next : 0;
    bool finished = false;
    UseCpuThreadsFor(trial_.training.precision);
    try {
      DeviceStreams::ComputeScope on_device(streams_);
      auto s = Task(&finished);
      if (!s.ok()) {
        AbandonStep();
        return s.WithContext(trial_.name + " step " + std::to_string(step_));
      }
    } catch (const c10::Error& e) {
      AbandonStep();
      return TorchErrorStatus(e, "training step " + std::to_string(step_) + " of " + trial_.name,
                              on_.device);
    } catch (const std::exception& e) {  // TorchScript's interpreter throws these
      AbandonStep();
      return InternalError("training step " + std::to_string(step_) + " of " + trial_.name + ": " +
                           e.what());
    }
    cur_->seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (finished) {
      StepMetrics m = cur_->m;
      m.seconds = cur_->seconds;  // compute time of the step's tasks, wherever they ran
      m.tokens = trial_.training.batch_size * TokensPerSample(trial_);
      cur_.reset();
      ++step_;
      r.step = m;
    }
    return r;
  }

  StatusOr<double> EvaluateShards() {
    UseCpuThreadsFor(trial_.training.precision);
    ResetLookahead();  // every shard leaves the device
    try {
      torch::NoGradGuard no_grad;
      DeviceStreams::ComputeScope on_device(streams_);
      std::vector<torch::Tensor> acts, targets;
      for (const auto& b : ValidationSamples(*data_, trial_)) {
        acts.push_back(ToDevice(b.input));
        targets.push_back(ToDevice(b.target));
      }
      RETURN_IF_ERROR(Fetch(0, false));
      const size_t last = shards_.size() - 1;
      double total = 0;
      int64_t sequences = 0;
      for (size_t k = 0; k <= last; ++k) {
        RETURN_IF_ERROR(Wait(k));
        if (k < last) RETURN_IF_ERROR(Fetch(k + 1, false));
        for (size_t i = 0; i < acts.size(); ++i) {
          if (k < last) {
            acts[i] = ForwardShard(k, acts[i]);
            continue;
          }
          // The last shard yields each batch's loss (the fused LM head: no [B, T, V] logits
          // kept per validation batch).
          const auto n = acts[i].size(0);
          total += ShardLoss(k, acts[i], targets[i]).item<double>() * static_cast<double>(n);
          sequences += n;
          acts[i] = torch::Tensor();
        }
        RETURN_IF_ERROR(Evict(k, false));
      }
      return total / static_cast<double>(sequences);
    } catch (const c10::Error& e) {
      return TorchErrorStatus(e, "evaluating " + trial_.name, on_.device);
    }
  }

  StatusOr<std::vector<NamedBuffer>> ExportShards() {
    std::vector<NamedBuffer> out;
    ResetLookahead();  // every shard leaves the device
    try {
      DeviceStreams::ComputeScope on_device(streams_);
      for (const auto& [n, t] : pinned_) out.push_back(TensorToBuffer(n, t));
      for (size_t k = 0; k < shards_.size(); ++k) {
        if (HostSteps(shards_[k])) {  // the host copies are the masters
          for (const auto& [n, t] : HostMasters(k)) out.push_back(TensorToBuffer(n, t));
          continue;
        }
        RETURN_IF_ERROR(Fetch(k, true));
        RETURN_IF_ERROR(Wait(k));
        for (const Part* p : {&shards_[k].weights, &shards_[k].state}) {
          for (const auto& [n, t] : p->tensors) out.push_back(TensorToBuffer(n, t));
        }
        RETURN_IF_ERROR(Evict(k, false));
      }
    } catch (const c10::Error& e) {
      return TorchErrorStatus(e, "exporting " + trial_.name, on_.device);
    }
    return out;
  }

  /// Whether `state` has every tensor of the model, of its shape and dtype: checked before
  /// Import changes anything (shapes are known without loading).
  Status CheckImport(const std::vector<NamedBuffer>& state) const {
    size_t expected = pinned_.size();
    for (const auto& s : shards_) expected += s.weights.tensors.size() + s.state.tensors.size();
    if (expected != state.size()) {
      return InvalidArgumentError("state has " + std::to_string(state.size()) +
                                  " tensors, expected " + std::to_string(expected));
    }
    std::map<std::string, const NamedBuffer*> by_name;
    for (const auto& b : state) by_name[b.name] = &b;
    for (const auto& s : shards_) {
      for (const Part* part : {&s.weights, &s.state}) {
        const NamedTensors& ts = part->tensors;
        const auto& shapes = part->shapes;
        for (size_t i = 0; i < ts.size(); ++i) {
          auto it = by_name.find(ts[i].first);
          if (it == by_name.end())
            return InvalidArgumentError("state lacks tensor '" + ts[i].first + "'");
          int64_t numel = 1;
          for (int64_t d : shapes[i]) numel *= d;
          if (it->second->dtype != "float32" || it->second->shape != shapes[i] ||
              it->second->data.size() != static_cast<size_t>(numel) * 4) {
            return InvalidArgumentError("state tensor '" + ts[i].first +
                                        "' does not match the model's shape or dtype");
          }
        }
      }
    }
    return OkStatus();
  }

  Status Import(int64_t step, const std::vector<NamedBuffer>& state) {
    ResetLookahead();  // every shard leaves the device
    RETURN_IF_ERROR(CopyBuffersInto(state, pinned_, /*allow_extra=*/true));
    for (auto& s : shards_) {  // the host optimizer's copies of the tied weights too
      for (size_t i = 0; i < s.pinned_host.size(); ++i) {
        s.pinned_host[i].second.copy_(s.pinned[i].second);
      }
    }
    for (size_t k = 0; k < shards_.size(); ++k) {
      if (HostSteps(shards_[k])) {  // the host copies are the masters
        HostCopiesChanged(k);
        RETURN_IF_ERROR(CopyBuffersInto(state, HostMasters(k), /*allow_extra=*/true));
        continue;
      }
      RETURN_IF_ERROR(Fetch(k, true));
      RETURN_IF_ERROR(Wait(k));
      if (on_.discrete) ComputeWaitsCopiesOut(k);
      NamedTensors all = shards_[k].weights.tensors;
      for (const auto& e : shards_[k].state.tensors) all.push_back(e);
      RETURN_IF_ERROR(CopyBuffersInto(state, all, /*allow_extra=*/true));
      RETURN_IF_ERROR(Evict(k, /*dirty=*/true));
      // One shard on the device at a time, as the plan's budget allows between steps.
      RETURN_IF_ERROR(FinishWrite(k));
    }
    step_ = step;
    return OkStatus();
  }

  // ---- residency ----------------------------------------------------------------------------

  /// Starts moving shard k's weights (and optimizer state, where it steps on the device) to
  /// the device: their device memory is reserved at once and disk reads start on I/O threads;
  /// Wait(k) completes them. Optimizer state stepped on the host stays in the host tier: the
  /// step reads the gradients the backward left and updates the host copy of the weights.
  /// `with_state`: the task steps the shard's optimizer (it changes the shard).
  Status Fetch(size_t k, bool with_state) {
    RETURN_IF_ERROR(FetchPart(k, shards_[k].weights, with_state));
    const bool on_device = shards_[k].plan.optimizer == OptimizerPlacement::kDevice;
    return with_state && on_device ? FetchPart(k, shards_[k].state, true) : OkStatus();
  }

  Status FetchPart(size_t k, Part& p, bool to_change) {
    switch (p.at->where()) {
      case Residency::kReading:
      case Residency::kOnDevice: return OkStatus();
      case Residency::kInHost:
        // Device memory first: if that throws, the part is still in host memory.
        if (on_.discrete) ReserveOnDevice(p);
        if (Status moved = p.at->To(Residency::kOnDevice); !moved.ok()) {
          p.reserved.clear();
          return moved;
        }
        if (on_.discrete) Upload(p);
        return OkStatus();
      case Residency::kWritingBack:
        // Still on the device, its file being rewritten (the shard a step ended with, which
        // the next begins with). On a discrete device a forward reads that copy as it is while
        // the write goes on (its eviction waits for the write); a task that changes the shard
        // waits for the write and reads the file back, so no write reads what it changes.
        if (on_.discrete && !to_change) return OkStatus();
        RETURN_IF_ERROR(FinishWrite(k));
        break;
      case Residency::kOnDisk: break;
    }
    if (on_.discrete) ReserveOnDevice(p);  // first: if it throws, nothing has changed
    if (Status reading = p.at->To(Residency::kReading); !reading.ok()) {
      p.reserved.clear();
      return reading;
    }
    // Materialize first: it makes the slab that Read is then handed.
    auto parts = Materialize(p);
    p.read = disk_->Read(Key(k, p.key), std::move(parts), p.slab);
    return OkStatus();
  }

  /// Completes shard k's reads: their parts are on the device (on a discrete device, copied
  /// there from the host memory the disk read into), and compute waits for their copies.
  Status Wait(size_t k) {
    Status first;
    for (Part* p : {&shards_[k].weights, &shards_[k].state}) {
      if (p->at->where() != Residency::kReading) continue;
      Status read = p->read.get();
      RETURN_IF_ERROR(p->at->To(Residency::kOnDevice));
      if (on_.discrete && read.ok()) Upload(*p);
      p->reserved.clear();  // a failed read's reserved memory
      if (first.ok()) first = read;
    }
    for (Part* p : {&shards_[k].weights, &shards_[k].state}) {
      if (p->at->where() == Residency::kOnDevice) streams_.ComputeWaits(p->in_done);
    }
    return first;
  }

  /// Shard k leaves the device. Dirty state (after an optimizer step) is written back on an I/O
  /// thread and dropped by FinishWrite; clean state is dropped at once (its file is current).
  /// With the state in the host tier, it goes back there.
  Status Evict(size_t k, bool dirty) {
    Shard& s = shards_[k];
    RETURN_IF_ERROR(Wait(k));
    if (Resident(k)) return OkStatus();  // it stays, stepped or not
    if (!disk_) {
      for (Part* p : {&s.weights, &s.state}) {
        if (!on_.discrete || p->at->where() != Residency::kOnDevice) continue;
        if (dirty) {
          Download(*p);
        } else {
          LeaveDevice(*p);
        }
      }
      RETURN_IF_ERROR(s.weights.at->To(Residency::kInHost));
      return s.state.at->To(Residency::kInHost);
    }
    if (dirty) return WriteBack(k);
    // A shard read while its write went on (FetchPart) leaves once the write is done.
    return s.write.valid() ? FinishWrite(k) : Drop(k);
  }

  /// Discrete, after a forward whose graph stays on the device (Stashes): shard k leaves the
  /// device, its weights' memory freed in place. The graph holds their storages (GEMMs save
  /// the weights, or views of them, for backward), so each tensor keeps its storage, emptied,
  /// and ReserveOnDevice fills the same storage again for the backward, whose graph then reads
  /// the weights it saved. The optimizer state is not in the graph: it leaves as usual.
  Status EvictKeepingGraph(size_t k) {
    Shard& s = shards_[k];
    RETURN_IF_ERROR(Wait(k));
    if (Resident(k)) return OkStatus();  // the graph reads the weights where they stay
    for (auto& [n, t] : s.weights.tensors) FreeStorageInPlace(t);
    if (s.state.at->where() == Residency::kOnDevice) LeaveDevice(s.state);
    RETURN_IF_ERROR(s.weights.at->To(Residency::kInHost));
    return s.state.at->To(Residency::kInHost);
  }

  /// Starts writing both parts of shard k to their spill files; they stay on the device until
  /// FinishWrite.
  Status WriteBack(size_t k) {
    Shard& s = shards_[k];
    if (s.weights.at->where() != Residency::kOnDevice ||
        s.state.at->where() != Residency::kOnDevice) {
      return InternalError("shard " + std::to_string(k) + " is written back with its weights " +
                           ResidencyName(s.weights.at->where()) + " and its optimizer state " +
                           ResidencyName(s.state.at->where()) + ", not both on the device");
    }
    s.write = WriteParts(k);
    RETURN_IF_ERROR(s.weights.at->To(Residency::kWritingBack));
    return s.state.at->To(Residency::kWritingBack);
  }

  /// Set-up with the disk tier: writes freshly built shard k out and frees it.
  Status Spill(size_t k) {
    Status written = WriteParts(k).get();
    Status dropped = Drop(k);
    return written.ok() ? dropped : written;
  }

  /// Starts writing both parts of shard k to their spill files, on the I/O threads at once
  /// (from their slabs with O_DIRECT once read back); one future for both. On a discrete
  /// device the parts on the device are first copied out to their host memory on the
  /// write-back stream; the I/O thread, not this one, waits for that copy, so compute goes on
  /// being queued meanwhile.
  std::future<Status> WriteParts(size_t k) {
    Shard& s = shards_[k];
    if (on_.discrete) {
      for (Part* p : {&s.weights, &s.state}) {
        if (p->at->where() != Residency::kOnDevice) continue;
        p->out_done = streams_.CopyOut(p->host, Values(p->tensors), p->in_done);
      }
    }
    auto copied_out = [](const Part& p) -> std::function<void()> {
      return [mark = p.out_done] { mark.Synchronize(); };
    };
    auto w = disk_->Write(Key(k, s.weights.key), Spans(HostSide(s.weights)), s.weights.slab,
                          copied_out(s.weights));
    auto o = disk_->Write(Key(k, s.state.key), Spans(HostSide(s.state)), s.state.slab,
                          copied_out(s.state));
    return std::async(std::launch::deferred, [w = std::move(w), o = std::move(o)]() mutable {
      Status a = w.get(), b = o.get();
      return a.ok() ? b : a;
    });
  }

  Status FinishWrite(size_t k) {
    Shard& s = shards_[k];
    if (!s.write.valid()) return OkStatus();
    Status st = s.write.get();
    Status dropped = Drop(k);
    return st.ok() ? dropped : st;
  }

  /// Finishes the writes of shards `from`.. on.
  Status FinishWrites(size_t from = 0) {
    Status first;
    for (size_t k = from; k < shards_.size(); ++k) {
      Status s = FinishWrite(k);
      if (first.ok()) first = s;
    }
    return first;
  }

  /// Frees shard k's tensors (disk tier): the RAM really goes back to the system. Its reads
  /// must have been waited for.
  Status Drop(size_t k) {
    torch::NoGradGuard g;
    for (Part* p : {&shards_[k].weights, &shards_[k].state}) {
      if (p->at->where() == Residency::kOnDisk) continue;
      for (auto& [n, t] : p->tensors) t.set_data(torch::empty({0}, t.options()));
      if (on_.discrete) {
        p->in_done.Synchronize();  // a copy in may still read the host memory
        for (auto& h : p->host) h = torch::Tensor();
      }
      p->slab.reset();  // unmapped once no tensor (or stashed graph) uses it
      RETURN_IF_ERROR(p->at->To(Residency::kOnDisk));
    }
    // RAM is scarce (hostMemoryBudget set): give freed activation and gradient memory back
    // now, not at glibc's leisure, so resident memory follows the budget. It costs page faults
    // when the memory is used again, so with RAM to spare the heap keeps it.
    if (trial_.resources.host_memory_budget.has_value()) malloc_trim(0);
    return OkStatus();
  }

  /// Gives part p's host side (its tensors, or on a discrete device its host copies) fresh
  /// memory of its shapes for a disk read: one page-aligned slab laid out as the spill file (so
  /// the disk reads straight into it), which each tensor keeps alive; plain allocations if the
  /// system refuses the slab.
  std::vector<MutableBytes> Materialize(Part& p) {
    const NamedTensors& ts = p.tensors;
    const std::vector<size_t> sizes = PartSizes(p);
    size_t total = 0;
    const auto offsets = SpillLayout(sizes, &total);
    p.slab = slabs_ ? slabs_->Get(total) : AlignedSlab::Allocate(total);
    if (on_.discrete) p.host.assign(ts.size(), torch::Tensor());
    std::vector<MutableBytes> parts;
    torch::NoGradGuard g;
    for (size_t i = 0; i < ts.size(); ++i) {
      const auto opts = torch::TensorOptions().dtype(ts[i].second.scalar_type());
      torch::Tensor mem =
          p.slab ? torch::from_blob(
                       p.slab->data() + offsets[i], p.shapes[i], [keep = p.slab](void*) {}, opts)
                 : torch::empty(p.shapes[i], opts);
      if (on_.discrete) {
        p.host[i] = mem;
      } else {
        ts[i].second.set_data(mem);
      }
      parts.push_back({mem.data_ptr(), sizes[i]});
    }
    return parts;
  }

  /// Bytes of each of part p's tensors, from its shapes (its tensors may be empty).
  static std::vector<size_t> PartSizes(const Part& p) {
    std::vector<size_t> sizes;
    for (size_t i = 0; i < p.tensors.size(); ++i) {
      int64_t n = 1;
      for (int64_t d : p.shapes[i]) n *= d;
      sizes.push_back(static_cast<size_t>(n * p.tensors[i].second.element_size()));
    }
    return sizes;
  }

  /// Waits for every part's copies in and out (host memory about to be freed or reused).
  void WaitForCopies() {
    for (auto& s : shards_) {
      for (Part* p : {&s.weights, &s.state}) {
        p->in_done.Synchronize();
        p->out_done.Synchronize();
      }
    }
  }

  static std::vector<ConstBytes> Spans(const std::vector<torch::Tensor>& ts) {
    std::vector<ConstBytes> parts;
    for (const auto& t : ts) {
      parts.push_back({t.data_ptr(), static_cast<size_t>(t.numel() * t.element_size())});
    }
    return parts;
  }

  static std::string Key(size_t k, const char* part) {
    return "shard" + std::to_string(k) + "." + part;
  }

  // ---- discrete devices: the device copies ------------------------------------------------

  /// Discrete with the disk tier: the pool of pinned slabs the disk reads into, holding the
  /// parts a step has in host memory at once (the shard computing, the next one read ahead and
  /// the previous one written back), each as its spill file lays it out (4 KiB per tensor).
  void MakeSlabPool() {
    size_t largest = 0;
    for (const auto& s : shards_) {
      size_t shard = 0;
      for (const Part* p : {&s.weights, &s.state}) {
        size_t total = 0;
        SpillLayout(PartSizes(*p), &total);
        shard += total;
      }
      largest = std::max(largest, shard);
    }
    slabs_ = std::make_unique<SlabPool>(kDiskShardsInHostMemory * largest, PinningFor(on_.device));
  }

  /// Whether shard s's optimizer steps on the host copies (a discrete device, placement host).
  bool HostSteps(const Shard& s) const {
    return on_.discrete && s.plan.optimizer == OptimizerPlacement::kHost;
  }
  /// Whether a shard's step changes its device copies (so they are written back).
  bool StepsOnDevice(size_t k) const { return !HostSteps(shards_[k]); }
  /// Whether shard k's weights and optimizer state stay on the device once there
  /// (ShardPlan::resident: a discrete device, the state in the host tier, stepped on the
  /// device): Evict leaves it, its device tensors are its masters (export reads them), and its
  /// host copies are brought up to date only when it leaves the device (MoveShards).
  bool Resident(size_t k) const {
    return on_.discrete && !disk_ && shards_[k].plan.resident && StepsOnDevice(k);
  }

  static std::vector<torch::Tensor> Values(const NamedTensors& ts) {
    std::vector<torch::Tensor> out;
    for (const auto& [n, t] : ts) out.push_back(t);
    return out;
  }
  static NamedTensors Named(const NamedTensors& names, const std::vector<torch::Tensor>& ts) {
    NamedTensors out;
    for (size_t i = 0; i < ts.size(); ++i) out.emplace_back(names[i].first, ts[i]);
    return out;
  }
  /// A host-stepped shard's fp32 masters: its weights' host copies and its optimizer state
  /// (which never leaves the host).
  NamedTensors HostMasters(size_t k) const {
    const Shard& s = shards_[k];
    NamedTensors all = Named(s.weights.tensors, s.weights.host);
    all.insert(all.end(), s.state.tensors.begin(), s.state.tensors.end());
    return all;
  }

  /// The tensors holding part p's bytes in host memory.
  std::vector<torch::Tensor> HostSide(const Part& p) const {
    return on_.discrete ? p.host : Values(p.tensors);
  }

  /// A host copy of `t` (built in host memory) for a discrete device: pinned for a GPU.
  torch::Tensor HostCopy(const torch::Tensor& t) const {
    torch::NoGradGuard g;
    return host_pool_->GetOne(t.sizes(), t.scalar_type()).copy_(t);
  }
  /// Discrete host tier, in set-up: part p's tensors use their host copies' memory until they
  /// first leave for the device, so the memory they were built in goes back now. Set-up then
  /// holds at most one shard's freshly built weights beside the tier, never a shard twice.
  static void UseHostCopies(Part& p) {
    torch::NoGradGuard g;
    for (size_t i = 0; i < p.tensors.size(); ++i) p.tensors[i].second.set_data(p.host[i]);
  }

  /// Discrete host tier: a device-stepped shard's optimizer state is made zero-filled in its
  /// host memory, not beside the parameters and copied there. Null (beside the parameters)
  /// otherwise.
  Optimizer::StateAllocator StateAllocatorFor(const Shard& s) const {
    if (!on_.discrete || disk_ || HostSteps(s)) return nullptr;
    return [this](const torch::Tensor& param) {
      torch::NoGradGuard g;
      return host_pool_->GetOne(param.sizes(), param.scalar_type()).zero_();
    };
  }

  /// Tensors sharing `ts`' memory (their host side, when that is where they were made).
  static std::vector<torch::Tensor> Aliases(const NamedTensors& ts) {
    std::vector<torch::Tensor> out;
    for (const auto& [n, t] : ts) out.push_back(t.detach());
    return out;
  }

  /// Host copies of a part's tensors, carved from one slab. With the disk tier they are the
  /// built tensors themselves: set-up writes them out and frees them.
  std::vector<torch::Tensor> HostCopies(const NamedTensors& ts) const {
    if (disk_) return Aliases(ts);
    torch::NoGradGuard g;
    std::vector<torch::Tensor> out = HostLike(Values(ts));
    for (size_t i = 0; i < ts.size(); ++i) out[i].copy_(ts[i].second);
    return out;
  }

  /// Discrete: the pool the host copies, the bf16 transit copies and the gradients bound for
  /// the host come from, bounded by what the trial can hold there at once: every shard's state
  /// and twice its gradients (the gradients and the bf16 weights), the tied parameters and
  /// their gradients. Past that the memory is plain (copies from it are synchronous) and freed
  /// when dropped.
  void MakeHostPool() {
    size_t limit = 0;
    for (const auto& sp : plan_.shards) {
      limit += static_cast<size_t>(sp.state_bytes + 2 * sp.gradient_bytes);
    }
    limit += static_cast<size_t>(2 * plan_.pinned_bytes);  // the tied ones and their gradients
    // Offloaded activations, with room for what the cost model leaves out of them (softmax
    // and LayerNorm statistics: a few percent).
    limit += static_cast<size_t>(plan_.offloaded_bytes + plan_.offloaded_bytes / 8);
    host_pool_ = std::make_unique<HostTensorPool>(on_.device, limit);
  }

  /// Discrete: part p's tensors get device memory (reserved when its disk read was issued, or
  /// now), and the host copies are copied into it on the prefetch stream (after the last copy
  /// out of them); Wait makes compute wait for it.
  void Upload(Part& p) {
    torch::NoGradGuard g;
    if (!p.transit.empty()) CastTransitCopies(p);
    if (p.reserved.empty()) ReserveOnDevice(p);
    std::vector<torch::Tensor> dev = std::move(p.reserved), src = UploadSources(p);
    p.reserved.clear();
    p.in_done = streams_.CopyIn(dev, src, p.out_done, p.reserved_free);
    bytes_uploaded_ += Bytes(src);
    for (size_t i = 0; i < dev.size(); ++i) p.tensors[i].second.set_data(dev[i]);
  }

  /// What part p's upload reads: its host copies, or their bf16 transit copies.
  static std::vector<torch::Tensor> UploadSources(const Part& p) {
    std::vector<torch::Tensor> src = p.host;
    for (size_t i = 0; i < p.transit.size(); ++i) {
      if (p.transit[i].defined()) src[i] = p.transit[i];
    }
    return src;
  }

  /// Discrete: device memory for part p's next upload, in the types it travels as, and the
  /// compute stream's mark: no compute queued after it uses that memory.
  void ReserveOnDevice(Part& p) {
    torch::NoGradGuard g;
    p.reserved.clear();
    for (size_t i = 0; i < p.tensors.size(); ++i) {
      const torch::Tensor& t = p.tensors[i].second;
      if (StorageFreedInPlace(t)) {  // a stashed graph holds it (EvictKeepingGraph)
        RefillStorage(t);
        p.reserved.push_back(t.variable_data());  // its own version counter: no autograd bump
        continue;
      }
      const bool bf16 = i < p.transit.size() && p.transit[i].defined();
      const auto type = bf16 ? torch::kBFloat16 : p.tensors[i].second.scalar_type();
      p.reserved.push_back(
          torch::empty(p.shapes[i], torch::TensorOptions().dtype(type).device(on_.device)));
    }
    p.reserved_free = streams_.MarkCompute();
  }

  /// bf16 weight transit: part p's bf16 copies made from its host copies, if they changed
  /// since the last cast (rounded to bf16 as autocast rounds).
  void CastTransitCopies(Part& p) {
    if (p.transit_copies == Part::TransitCopies::kCurrent) return;
    p.in_done.Synchronize();  // the last upload read the old copies
    for (size_t i = 0; i < p.transit.size(); ++i) {
      if (!p.transit[i].defined()) continue;
      p.transit[i].copy_(p.host[i]);
      ++weight_casts_;
    }
    p.transit_copies = Part::TransitCopies::kCurrent;
  }

  /// Shard k's host copies changed (stepped on the host, or imported): its bf16 weights are
  /// cast anew at their next upload.
  void HostCopiesChanged(size_t k) {
    shards_[k].weights.transit_copies = Part::TransitCopies::kStale;
  }

  /// bf16 weight transit: pinned bf16 copies for the weights of shard s's matrix products
  /// (Linear and Conv2d weights: autocast computes with their bf16 casts only). Not their
  /// biases: LibTorch's autocast adds those unrounded (measured: a bf16 bias changes the sums).
  std::vector<torch::Tensor> TransitCopies(const LayerSequence& seq, const Shard& s) const {
    std::map<std::string, bool> cast;
    for (int i = s.plan.first_layer; i <= s.plan.last_layer; ++i) {
      for (const auto& m : seq.layers[i]->named_modules("", /*include_self=*/false)) {
        if (!m.value()->as<torch::nn::Linear>() && !m.value()->as<torch::nn::Conv2d>()) continue;
        cast[seq.names[i] + "." + m.key() + ".weight"] = true;
      }
    }
    std::vector<std::vector<int64_t>> shapes;
    for (size_t i = 0; i < s.weights.tensors.size(); ++i) {
      if (cast.count(s.weights.tensors[i].first)) shapes.push_back(s.weights.shapes[i]);
    }
    const std::vector<torch::ScalarType> types(shapes.size(), torch::kBFloat16);
    std::vector<torch::Tensor> copies = host_pool_->Get(shapes, types), out;
    for (size_t i = 0, next = 0; i < s.weights.tensors.size(); ++i) {
      out.push_back(cast.count(s.weights.tensors[i].first) ? copies[next++] : torch::Tensor());
    }
    return out;
  }

  /// bf16 weight transit, after each micro-batch's backward of shard k: the bf16 weights'
  /// gradients join their fp32 sums (as autocast's fp32 masters accumulate them).
  void SumTransitGrads(size_t k) {
    Shard& s = shards_[k];
    if (s.weights.transit.empty()) return;
    torch::NoGradGuard g;
    s.grad_sums.resize(s.weights.tensors.size());
    for (size_t i = 0; i < s.weights.tensors.size(); ++i) {
      auto& t = s.weights.tensors[i].second;
      if (!s.weights.transit[i].defined() || !t.grad().defined()) continue;
      auto& sum = s.grad_sums[i];
      sum = sum.defined() ? sum.add_(t.grad()) : t.grad().to(torch::kFloat);
      t.mutable_grad() = torch::Tensor();
    }
  }

  /// bf16 weight transit, once shard k's backward is done: the fp32 sums become the
  /// gradients that go to the host optimizer.
  void TakeTransitGrads(size_t k) {
    Shard& s = shards_[k];
    for (size_t i = 0; i < s.grad_sums.size(); ++i) {
      if (s.grad_sums[i].defined()) s.weights.tensors[i].second.mutable_grad() = s.grad_sums[i];
    }
    s.grad_sums.clear();
  }

  /// Discrete: part p's device tensors (newer than the host copies) are copied out on the
  /// write-back stream and leave the device.
  void Download(Part& p) {
    CopyOut(p);
    LeaveDevice(p);
  }

  /// Discrete: part p's device tensors are copied out to its host copies on the write-back
  /// stream; they stay on the device (compute must not change them before out_done:
  /// ComputeWaitsCopiesOut).
  void CopyOut(Part& p) { p.out_done = streams_.CopyOut(p.host, Values(p.tensors), p.in_done); }

  /// Before compute changes shard k's device tensors (its optimizer step, an import): it waits
  /// for their last copy out, which a shard kept on the device may still have under way.
  void ComputeWaitsCopiesOut(size_t k) {
    for (const Part* p : {&shards_[k].weights, &shards_[k].state}) {
      if (p->at->where() == Residency::kOnDevice) streams_.ComputeWaits(p->out_done);
    }
  }

  /// Discrete: part p's tensors give their device memory back (the caching allocator keeps it
  /// from reuse until the streams that use it are done).
  void LeaveDevice(Part& p) {
    torch::NoGradGuard g;
    for (auto& [n, t] : p.tensors) {
      t.set_data(
          torch::empty({0}, torch::TensorOptions().dtype(t.scalar_type()).device(on_.device)));
    }
  }

  /// The layers' buffers, each once (GPT-2's blocks share their causal mask).
  std::vector<torch::Tensor> Buffers() const {
    std::vector<torch::Tensor> all;
    std::set<const void*> seen;
    for (const auto& layer : model_.layers) {
      for (const auto& b : layer->buffers(/*recurse=*/true)) {
        if (seen.insert(b.unsafeGetTensorImpl()).second) all.push_back(b);
      }
    }
    return all;
  }

  /// Discrete, after the model is built: the tied parameters and the layers' buffers (GPT-2's
  /// causal mask) live on the device for the trial's life. On a move the tensors they leave are
  /// added to `sources`, if given.
  void MoveResidentsToDevice(std::vector<torch::Tensor>* sources = nullptr) {
    torch::NoGradGuard g;
    if (on_.device.is_cpu()) return;  // a simulated discrete device: they are there
    const auto move = [&](torch::Tensor t) {
      if (sources) sources->push_back(t.detach());
      t.set_data(t.to(on_.device));
    };
    for (auto& [n, t] : pinned_) {
      move(t);
      // Within a step: what the backwards so far accumulated (the tied head's, say).
      if (t.grad().defined()) {
        if (sources) sources->push_back(t.grad());
        t.mutable_grad() = t.grad().to(on_.device);
      }
    }
    for (const auto& b : Buffers()) move(b);
  }

  /// Discrete: shard k's weight gradients leave the device for host memory (`*host`, fresh
  /// pinned buffers; with `host` null, they stay), and with `tied` so do the tied parameters'
  /// (into their host copies' gradients). Waits for the copies: the host reads them next.
  void GradsToHost(size_t k, std::vector<torch::Tensor>* host, bool tied) {
    torch::NoGradGuard g;
    Shard& s = shards_[k];
    std::vector<torch::Tensor> dst, src;
    if (host) {
      src = DefinedGrads(s.weights.tensors);
      dst = HostLike(src);
      host->clear();
      for (size_t i = 0, next = 0; i < s.weights.tensors.size(); ++i) {
        // An undefined one: a parameter this step did not use.
        const bool used = s.weights.tensors[i].second.grad().defined();
        host->push_back(used ? dst[next++] : torch::Tensor());
      }
    }
    if (tied) {
      const std::vector<torch::Tensor> grads = DefinedGrads(s.pinned);
      const std::vector<torch::Tensor> copies = HostLike(grads);
      for (size_t i = 0, next = 0; i < s.pinned.size(); ++i) {
        if (s.pinned[i].second.grad().defined()) {
          s.pinned_host[i].second.mutable_grad() = copies[next++];
        }
      }
      dst.insert(dst.end(), copies.begin(), copies.end());
      src.insert(src.end(), grads.begin(), grads.end());
    }
    streams_.CopyOut(dst, src, {}).Synchronize();
    if (host) {
      for (auto& [n, t] : s.weights.tensors) t.mutable_grad() = torch::Tensor();
    }
    if (tied) {
      for (auto& [n, t] : s.pinned) t.mutable_grad() = torch::Tensor();
    }
  }

  /// Discrete: host memory for all of shard s's weight gradients, in one slab of the host pool.
  std::vector<torch::Tensor> HostGradsFor(const Shard& s) const {
    std::vector<torch::ScalarType> types;
    for (const auto& [n, t] : s.weights.tensors) types.push_back(t.scalar_type());
    return host_pool_->Get(s.weights.shapes, types);
  }

  /// The gradients of `ts` that this step made.
  static std::vector<torch::Tensor> DefinedGrads(const NamedTensors& ts) {
    std::vector<torch::Tensor> out;
    for (const auto& [n, t] : ts) {
      if (t.grad().defined()) out.push_back(t.grad());
    }
    return out;
  }

  /// Host memory of ts' shapes and types, in one slab of the host pool.
  std::vector<torch::Tensor> HostLike(const std::vector<torch::Tensor>& ts) const {
    std::vector<std::vector<int64_t>> shapes;
    std::vector<torch::ScalarType> types;
    for (const auto& t : ts) {
      shapes.push_back(t.sizes().vec());
      types.push_back(t.scalar_type());
    }
    return host_pool_->Get(shapes, types);
  }

  /// Discrete, with clipping: puts shard k's parked host gradients where its optimizer steps:
  /// up to the device, or (stepping on the host) on the host copies, with the tied parameters'
  /// device gradients brought down beside them.
  void GradsForStep(size_t k) {
    Shard& s = shards_[k];
    std::vector<torch::Tensor> grads = std::move(s.host_grads);
    s.host_grads.clear();
    if (HostSteps(s)) {
      for (size_t i = 0; i < grads.size(); ++i) s.weights.host[i].mutable_grad() = grads[i];
      if (!s.pinned.empty()) GradsToHost(k, nullptr, /*tied=*/true);
      return;
    }
    std::vector<torch::Tensor> dev;
    for (size_t i = 0; i < grads.size(); ++i) {
      auto& p = s.weights.tensors[i].second;
      p.mutable_grad() = torch::empty(
          s.weights.shapes[i], torch::TensorOptions().dtype(p.scalar_type()).device(on_.device));
      dev.push_back(p.grad());
    }
    const StreamMark up = streams_.CopyIn(dev, grads, {}, streams_.MarkCompute());
    streams_.ComputeWaits(up);
    up.Synchronize();  // `grads` are freed when this returns
  }

  /// Discrete: the host copies of the tied parameters, stepped on the host, go up to their
  /// resident device tensors.
  void TiedToDevice(const Shard& s) {
    if (s.pinned.empty()) return;
    // The resident tensors compute reads: after the compute queued so far.
    streams_.ComputeWaits(
        streams_.CopyIn(Values(s.pinned), Values(s.pinned_host), {}, streams_.MarkCompute()));
  }

  /// A batch tensor on the compute device.
  torch::Tensor ToDevice(const torch::Tensor& t) const {
    return on_.device.is_cpu() ? t : t.to(on_.device);
  }

  // ---- compute -----------------------------------------------------------------------------

  torch::Tensor ForwardShard(size_t k, torch::Tensor x) {
    PrecisionScope precision(trial_.training.precision, on_.device.type());
    for (int i = shards_[k].plan.first_layer; i <= shards_[k].plan.last_layer; ++i) {
      x = model_.layers[i]->forward(x);
    }
    return x;
  }

  /// The loss of the last shard `k` on `x`: its forward and the trial's loss in one.
  torch::Tensor ShardLoss(size_t k, const torch::Tensor& x, const torch::Tensor& target) {
    PrecisionScope precision(trial_.training.precision, on_.device.type());
    return LayersLoss(trial_, model_, shards_[k].plan.first_layer, shards_[k].plan.last_layer, x,
                      target);
  }

  /// Runs shard k's optimizer step right after its backward (unless clipping must first see
  /// every shard's gradient norm), then frees its gradients.
  Status AfterBackward(size_t k, bool clipping) {
    Shard& s = shards_[k];
    TakeTransitGrads(k);
    if (clipping) {
      // The step waits for every shard's gradient norm: the gradients leave the device for the
      // host tier, or for the disk with the rest of the shard's state.
      std::vector<torch::Tensor> grads;
      for (auto& [n, t] : s.weights.tensors) {
        norms_[global_order_.at(n)] = t.grad().norm();
        grads.push_back(t.grad());
      }
      for (auto& [n, t] : s.pinned) norms_[global_order_.at(n)] = t.grad().norm();
      ledger_.Release(Tier::kDevice, s.grad_bytes);
      if (on_.discrete) {
        GradsToHost(k, &s.host_grads, /*tied=*/false);
        grads = s.host_grads;
      }
      if (disk_) {
        RETURN_IF_ERROR(disk_->WriteSync(Key(k, "g"), Spans(grads)));
        for (auto& [n, t] : s.weights.tensors) t.mutable_grad() = torch::Tensor();  // not pinned
        s.host_grads.clear();
      } else {
        RETURN_IF_ERROR(ledger_.Acquire(Tier::kHost, s.grad_bytes, "gradients"));
      }
      return OkStatus();
    }
    RunPendingHostStep();
    if (HostSteps(s)) {
      // ZeRO-Offload: gradients down, the host's fused optimizer on the host copies, the tied
      // weights up (the others go up at the next fetch).
      std::vector<torch::Tensor> grads;
      GradsToHost(k, &grads, /*tied=*/!s.pinned.empty());
      for (size_t i = 0; i < grads.size(); ++i) s.weights.host[i].mutable_grad() = grads[i];
      if (k > 0) {
        // Its step waits until shard k - 1's backward is queued on the device and runs beside
        // it (BackwardTask); its gradients have left the device memory.
        ledger_.Release(Tier::kDevice, s.grad_bytes);
        cur_->pending_host_step = k;
        return OkStatus();
      }
    }
    StepOptimizer(k);
    return OkStatus();
  }

  /// A host-stepped shard's optimizer step that AfterBackward left for later (it has no tied
  /// parameters: those are shard 0's), now: the host copies are changed before any fetch reads
  /// them, since the backward of the shard before it comes first in every step.
  void RunPendingHostStep() {
    if (!cur_ || !cur_->pending_host_step) return;
    StepShard(*std::exchange(cur_->pending_host_step, std::nullopt));
    ++host_steps_deferred_;
  }

  /// Shard k's optimizer step, then its gradients go from the device's ledger.
  void StepOptimizer(size_t k) {
    StepShard(k);
    ledger_.Release(Tier::kDevice, shards_[k].grad_bytes);
  }

  /// Shard k's optimizer step on the gradients where it steps, then its gradients go; the
  /// tied weights a host step changed go up.
  void StepShard(size_t k) {
    Shard& s = shards_[k];
    if (HostSteps(s)) HostCopiesChanged(k);  // first: a step that throws may have begun
    if (on_.discrete) ComputeWaitsCopiesOut(k);
    s.optimizer->Step(LearningRateAt(trial_.training, step_), step_ + 1);
    s.optimizer->ReleaseGrads();
    if (HostSteps(s)) TiedToDevice(s);
  }

  /// The step under way, between its tasks.
  struct StepInProgress {
    size_t next = 0;  ///< the next task
    int64_t A = 1;    ///< micro-batches
    // inputs[k][a]: the boundary activation entering shard k for micro-batch a.
    std::vector<std::vector<torch::Tensor>> inputs, outputs;  // outputs: stashed graphs
    /// Per shard, its graph's saved activations while offloaded (Offloads), and those whose
    /// backward is done but whose copy in may still read their host memory.
    std::vector<std::unique_ptr<OffloadedGraph>> offloaded, retiring;
    int64_t copying_out = 0;  ///< device bytes of the last offloaded graph, its copy out running
    /// Per shard, device bytes of its input that the ledger counts as kept for its backward
    /// (KeepInput).
    std::vector<int64_t> kept_input;
    /// A host-stepped shard (not shard 0) whose gradients are on the host and whose optimizer
    /// step runs during the next shard's backward (RunPendingHostStep).
    std::optional<size_t> pending_host_step;
    std::vector<torch::Tensor> grad_out, targets;
    torch::Tensor loss_sum;  // on the device, in double: read once the step ends
    /// On a GPU, loss_sum on its way to pinned host memory since the last shard's task
    /// (LossToHost), and the compute stream's mark after that copy.
    torch::Tensor loss_host;
    StreamMark loss_copied;
    double seconds = 0, clip_scale = 1.0;
    StepMetrics m;
  };

  /// Forwards of shards 0..S-2, the last shard (forward and backward), backwards of S-2..0,
  /// and with clipping an apply of each shard.
  size_t TasksPerStep() const {
    const size_t S = shards_.size();
    return 2 * S - 1 + (trial_.training.grad_clip_norm > 0 ? S : 0);
  }

  /// Whether shard k keeps its forward's autograd graph for its backward (Harmony's stash): in
  /// the host tier on a CPU; on a discrete device in its memory, where the plan counted it
  /// (PartitionPlan::stash_on_device; the state in host memory, the weights travelling as
  /// they are).
  bool Stashes(size_t k) const {
    if (shards_[k].plan.policy != ActivationPolicy::kStash) return false;
    return !on_.discrete || GraphMayStayOnDevice(k);
  }

  /// Whether shard k keeps its forward's graph but moves what it saved to host memory until its
  /// backward (ActivationPolicy::kOffload; planned only where Stashes could keep it).
  bool Offloads(size_t k) const {
    return shards_[k].plan.policy == ActivationPolicy::kOffload && on_.discrete &&
           GraphMayStayOnDevice(k);
  }

  /// Whether shard k, which recomputes, keeps its input in host memory until its backward
  /// (ShardPlan::input_offloaded; planned only where the previous shard recomputes too, so no
  /// graph holds that input).
  bool OffloadsInput(size_t k) const {
    return shards_[k].plan.input_offloaded && on_.discrete && GraphMayStayOnDevice(k) &&
           shards_[k].plan.policy == ActivationPolicy::kRecompute;
  }

  /// Discrete: whether shard k's forward graph may outlive its forward on the device (the plan
  /// counted it there: state in host memory, the weights travelling as they are).
  bool GraphMayStayOnDevice(size_t k) const {
    return plan_.stash_on_device && !disk_ && shards_[k].weights.transit.empty();
  }

  /// Where shard k's stashed graph is counted.
  Tier StashTier() const { return on_.discrete ? Tier::kDevice : Tier::kHost; }

  static torch::Tensor Leaf(const torch::Tensor& t, size_t k) {
    return k == 0 ? t : t.detach().requires_grad_(true);
  }

  /// Runs the next task of the step, beginning one if none is under way.
  Status Task(bool* finished) {
    const auto& tr = trial_.training;
    const size_t S = shards_.size();
    if (!cur_) RETURN_IF_ERROR(BeginStep());
    const size_t t = cur_->next++;
    BeginTaskWindow(t);
    const size_t L = S - 1;
    if (t < L) {
      RETURN_IF_ERROR(ForwardTask(t));
    } else if (t == L) {
      RETURN_IF_ERROR(LastShardTask());
    } else if (t < 2 * S - 1) {
      RETURN_IF_ERROR(BackwardTask(2 * S - 2 - t));
    } else {
      RETURN_IF_ERROR(ApplyTask(t - (2 * S - 1)));
    }
    if (cur_->next == TasksPerStep()) {
      // On a discrete device the shard the step ended with (shard 0, being written back) stays
      // for the next step's first forward, which reads it while the write goes on.
      RETURN_IF_ERROR(FinishWrites(on_.discrete ? 1 : 0));
      cur_->m.loss = StepLoss(*cur_) / static_cast<double>(cur_->A);
      cur_->m.learning_rate = LearningRateAt(tr, step_);
      EndLookaheadStep();
      *finished = true;
      return OkStatus();
    }
    return FetchEarly(t);
  }

  Status BeginStep() {
    const auto& tr = trial_.training;
    const size_t S = shards_.size();
    cur_.emplace();
    StepInProgress& c = *cur_;
    c.A = tr.gradient_accumulation_steps;
    const int64_t micro = tr.batch_size / c.A;
    norms_.clear();
    const Batch batch = TrainBatch(*data_, trial_, step_);
    c.inputs.assign(S, std::vector<torch::Tensor>(c.A));
    c.outputs.assign(S, std::vector<torch::Tensor>(c.A));
    c.offloaded.resize(S);
    c.kept_input.assign(S, 0);
    c.grad_out.assign(c.A, torch::Tensor());
    c.targets.assign(c.A, torch::Tensor());
    for (int64_t a = 0; a < c.A; ++a) {
      const Batch mb = batch.Slice(a * micro, micro);
      c.inputs[0][a] = ToDevice(mb.input);
      c.targets[a] = ToDevice(mb.target);
    }
    c.loss_sum = torch::zeros({}, torch::TensorOptions(on_.device).dtype(torch::kDouble));
    return Fetch(0, S == 1);
  }

  /// Forward of shard k (not the last) over all micro-batches: weights move once per step.
  Status ForwardTask(size_t k) {
    StepInProgress& c = *cur_;
    const size_t S = shards_.size();
    RETURN_IF_ERROR(Wait(k));
    RETURN_IF_ERROR(Fetch(k + 1, k + 2 == S));
    UnkeepInput(k);  // the workspace counts it while the forward runs
    RETURN_IF_ERROR(ledger_.Acquire(Tier::kDevice, shards_[k].plan.workspace_bytes,
                                    "activations of shard " + std::to_string(k)));
    const bool stash = Stashes(k), offload = Offloads(k);
    std::vector<torch::Tensor> saved;  // what the graph saved, when offloaded
    for (int64_t a = 0; a < c.A; ++a) {
      if (stash || offload) {
        std::optional<SavedTensorCapture> capture;
        if (offload) capture.emplace(&saved);
        c.inputs[k][a] = Leaf(c.inputs[k][a], k);
        c.outputs[k][a] = ForwardShard(k, c.inputs[k][a]);
        c.inputs[k + 1][a] = c.outputs[k][a].detach();
      } else {
        torch::NoGradGuard g;
        c.inputs[k + 1][a] = ForwardShard(k, c.inputs[k][a]);
      }
    }
    ledger_.Release(Tier::kDevice, shards_[k].plan.workspace_bytes);
    // The graph offloaded before this forward has been copying out beside it.
    ledger_.Release(Tier::kDevice, std::exchange(c.copying_out, 0));
    if (offload) RETURN_IF_ERROR(Offload(k, saved));
    if (!stash && OffloadsInput(k)) {
      RETURN_IF_ERROR(OffloadInput(k));
    } else {
      RETURN_IF_ERROR(KeepInput(k));
    }
    RETURN_IF_ERROR(KeepInput(k + 1));  // its output
    if (stash) {
      RETURN_IF_ERROR(ledger_.Acquire(StashTier(), shards_[k].plan.activation_bytes * c.A,
                                      "stashed activations of shard " + std::to_string(k)));
    }
    // Room until its backward: the weights stay (FetchEarly brings the state up).
    if (HoldForBackward(k)) return OkStatus();
    if ((stash || offload) && on_.discrete) return EvictKeepingGraph(k);
    if (stash && disk_) {
      // The stashed graph holds the weights (GEMMs save them for backward): keep them in the
      // host tier rather than dropping them and reading them again for the backward.
      RETURN_IF_ERROR(Wait(k));
      return shards_[k].weights.at->To(Residency::kInHost);
    }
    return Evict(k, /*dirty=*/false);
  }

  /// Shard k's input (every micro-batch's) stays on the device until its backward: the ledger
  /// counts it from the forward that makes it, as the plan's peak does (PackPeak), but for
  /// while shard k's own forward or backward runs, whose workspace counts it (UnkeepInput).
  /// Shard 0's input, the token ids, is the embedding's activation.
  Status KeepInput(size_t k) {
    StepInProgress& c = *cur_;
    if (k == 0) return OkStatus();
    const int64_t bytes = Bytes(c.inputs[k]);
    RETURN_IF_ERROR(ledger_.Acquire(
        Tier::kDevice, bytes, "input of shard " + std::to_string(k) + " kept for its backward"));
    c.kept_input[k] = bytes;
    return OkStatus();
  }

  void UnkeepInput(size_t k) {
    ledger_.Release(Tier::kDevice, std::exchange(cur_->kept_input[k], 0));
  }

  /// After shard k's forward (Offloads): the storages its graph saved, but for its weights and
  /// the boundary activations the step keeps, start copying to host memory on the write-back
  /// stream and leave the device; the weights then leave as a stash's do (EvictKeepingGraph).
  Status Offload(size_t k, const std::vector<torch::Tensor>& saved) {
    StepInProgress& c = *cur_;
    std::vector<torch::Tensor> keep = Values(shards_[k].weights.tensors);
    for (const auto& [n, t] : pinned_) keep.push_back(t);
    for (const auto* boundary : {&c.inputs[k], &c.inputs[k + 1], &c.outputs[k]}) {
      keep.insert(keep.end(), boundary->begin(), boundary->end());
    }
    return MoveOut(k, std::make_unique<OffloadedGraph>(saved, keep, on_.device),
                   "offloaded activations of shard " + std::to_string(k));
  }

  /// Shard k's offloaded storages (`what`: its graph's, or its input) start copying to host
  /// memory, counted there, and on the device until the next forward (StepInProgress::
  /// copying_out); BackwardTask takes them back.
  Status MoveOut(size_t k, std::unique_ptr<OffloadedGraph> moving, const std::string& what) {
    StepInProgress& c = *cur_;
    RETURN_IF_ERROR(ledger_.Acquire(Tier::kHost, moving->bytes(), what));
    RETURN_IF_ERROR(ledger_.Acquire(Tier::kDevice, moving->bytes(), what + " (copying out)"));
    c.copying_out = moving->bytes();
    moving->MoveOut(streams_, *host_pool_);
    bytes_offloaded_ += moving->bytes();
    c.offloaded[k] = std::move(moving);
    return OkStatus();
  }

  /// After shard k's forward (OffloadsInput): the input it keeps for its backward starts
  /// copying to host memory on the write-back stream and leaves the device, as an offloaded
  /// graph's storages do; it comes back beside the backward after it (BringBackGraph) into the
  /// same storage, which the backward's recompute then reads.
  Status OffloadInput(size_t k) {
    return MoveOut(
        k,
        std::make_unique<OffloadedGraph>(cur_->inputs[k], std::vector<torch::Tensor>{}, on_.device),
        "offloaded input of shard " + std::to_string(k));
  }

  /// Starts copying shard k's offloaded graph back to the device (beside the backward before
  /// its own); nothing if it has none.
  Status BringBackGraph(size_t k) {
    StepInProgress& c = *cur_;
    // Graphs whose copy in is done: their host memory may go back to the pool.
    c.retiring.erase(std::remove_if(c.retiring.begin(), c.retiring.end(),
                                    [](const auto& g) { return g->Settled(); }),
                     c.retiring.end());
    if (!c.offloaded[k]) return OkStatus();
    RETURN_IF_ERROR(
        ledger_.Acquire(Tier::kDevice, c.offloaded[k]->bytes(),
                        "offloaded activations of shard " + std::to_string(k) + " (copying in)"));
    c.offloaded[k]->MoveIn(streams_);
    return OkStatus();
  }

  /// The last shard runs forward and backward back to back, micro-batch by micro-batch.
  Status LastShardTask() {
    StepInProgress& c = *cur_;
    const size_t L = shards_.size() - 1;
    const bool clipping = trial_.training.grad_clip_norm > 0;
    RETURN_IF_ERROR(Wait(L));
    if (L > 0) RETURN_IF_ERROR(Fetch(L - 1, true));
    if (L > 0) RETURN_IF_ERROR(BringBackGraph(L - 1));
    UnkeepInput(L);  // the workspace counts it
    RETURN_IF_ERROR(AcquireBackward(L));
    for (int64_t a = 0; a < c.A; ++a) {
      auto in = Leaf(c.inputs[L][a], L);
      auto loss = ShardLoss(L, in, c.targets[a]);
      (c.A == 1 ? loss : loss / c.A).backward();
      SumTransitGrads(L);
      c.loss_sum.add_(loss.detach().to(torch::kDouble));
      if (L > 0) c.grad_out[a] = in.grad();
      c.inputs[L][a] = torch::Tensor();  // nothing reads it again this step
    }
    LossToHost(c);
    ReleaseBackward(L);
    ledger_.Release(Tier::kDevice, std::exchange(c.copying_out, 0));
    RETURN_IF_ERROR(AfterBackward(L, clipping));
    return AfterLastUse(L, clipping);
  }

  /// The device bytes shard k's backward takes beyond its state at its peak: its workspace and
  /// gradients, less what autograd frees of the activations before the last gradients appear
  /// (ShardPlan::backward_freed_bytes).
  Status AcquireBackward(size_t k) {
    const ShardPlan& p = shards_[k].plan;
    return ledger_.Acquire(Tier::kDevice,
                           p.workspace_bytes - p.backward_freed_bytes + shards_[k].grad_bytes,
                           "activations and gradients of shard " + std::to_string(k));
  }

  /// After shard k's backward: all but its gradients, which its optimizer step releases.
  void ReleaseBackward(size_t k) {
    const ShardPlan& p = shards_[k].plan;
    ledger_.Release(Tier::kDevice, p.workspace_bytes - p.backward_freed_bytes);
  }

  /// On a GPU the step's loss, complete once the last shard's micro-batches are done, starts
  /// for host memory at once. Read at the step's end, its copy out would queue behind the
  /// write-backs queued meanwhile (the copy engine takes device-to-host copies in order,
  /// whatever their streams): on an H200 the step ended 16 ms after its last kernel, waiting
  /// for shard 0's 0.86 GB to reach host memory, which the next step does not need.
  void LossToHost(StepInProgress& c) {
    if (!c.loss_sum.is_cuda()) return;
    c.loss_host =
        torch::empty({}, torch::TensorOptions().dtype(torch::kDouble).pinned_memory(true));
    c.loss_host.copy_(c.loss_sum, /*non_blocking=*/true);
    c.loss_copied = streams_.MarkCompute();
  }

  /// The step's summed loss on the host.
  static double StepLoss(const StepInProgress& c) {
    if (!c.loss_host.defined()) return c.loss_sum.item<double>();
    c.loss_copied.Synchronize();
    return c.loss_host.item<double>();
  }

  /// Backward of shard k (not the last), stepping its optimizer as soon as its gradients are
  /// done (unless clipping waits for every shard's norm).
  Status BackwardTask(size_t k) {
    StepInProgress& c = *cur_;
    const size_t S = shards_.size();
    const bool clipping = trial_.training.grad_clip_norm > 0;
    RETURN_IF_ERROR(Wait(k));
    if (k > 0) RETURN_IF_ERROR(Fetch(k - 1, true));
    if (k > 0) RETURN_IF_ERROR(BringBackGraph(k - 1));
    const bool stash = Stashes(k);
    std::unique_ptr<OffloadedGraph> offloaded = std::move(c.offloaded[k]);
    // The workspace counts the shard's activations: on the device, its stash (or its graph
    // back from the host) becomes that.
    const int64_t stashed = stash ? shards_[k].plan.activation_bytes * c.A : 0;
    if (stash && on_.discrete) ledger_.Release(Tier::kDevice, stashed);
    if (offloaded) {
      streams_.ComputeWaits(offloaded->in_done());
      offloaded->ReleaseDevice();  // the backward frees each storage once it has read it
      ledger_.Release(Tier::kDevice, offloaded->bytes());
    }
    UnkeepInput(k);  // the workspace counts it
    RETURN_IF_ERROR(AcquireBackward(k));
    for (int64_t a = 0; a < c.A; ++a) {
      torch::Tensor in, out;
      if (stash || (offloaded && Offloads(k))) {
        in = c.inputs[k][a];
        out = c.outputs[k][a];
      } else {  // its input kept, on the device or (OffloadsInput) back from the host
        in = Leaf(c.inputs[k][a], k);
        out = ForwardShard(k, in);  // recompute from the saved input
      }
      torch::autograd::backward({out}, {c.grad_out[a]});
      SumTransitGrads(k);
      c.outputs[k][a] = torch::Tensor();
      c.grad_out[a] = k > 0 ? in.grad() : torch::Tensor();
      c.inputs[k][a] = torch::Tensor();  // with a stashed graph's leaf, its gradient
    }
    // On a GPU the backward above is queued, not done: the host optimizer steps shard k + 1
    // while the device computes (ZeRO-Offload's overlap), before AfterBackward waits for it.
    RunPendingHostStep();
    ReleaseBackward(k);
    if (stash && !on_.discrete) ledger_.Release(Tier::kHost, stashed);
    if (offloaded) {
      ledger_.Release(Tier::kHost, offloaded->bytes());
      c.retiring.push_back(std::move(offloaded));  // its host copies wait for the copy in
    }
    RETURN_IF_ERROR(AfterBackward(k, clipping));
    if (k + 1 < S) RETURN_IF_ERROR(FinishWrite(k + 1));
    return AfterLastUse(k, clipping);
  }

  /// Shard k's backward (with its optimizer step, unless clipping) is its last use in the step.
  /// A resident shard stays on the device as it is (Evict). On a discrete device with the state
  /// in host memory, the shard the step ends with (shard 0, which the next one begins with)
  /// stays there: its stepped state is copied out, so the host copies are current for a
  /// checkpoint, a move or an evaluation, but not dropped, so the next step's first forward
  /// waits neither for that copy out nor for an upload. Any other shard is evicted, unless the
  /// lookahead keeps it there the same way until after its next forward (Hold). (With the disk
  /// tier shard 0 is written back as usual and stays through its write: FetchPart, and Task,
  /// which leaves that write running past the step's end.)
  Status AfterLastUse(size_t k, bool clipping) {
    const bool dirty = !clipping && StepsOnDevice(k);
    const bool stays =
        k == 0 ? dirty && on_.discrete && !disk_ && !Resident(k) : dirty && HoldIntoNextStep(k);
    if (!stays) return Evict(k, dirty);
    for (Part* p : {&shards_[k].weights, &shards_[k].state}) {
      if (p->at->where() == Residency::kOnDevice) CopyOut(*p);
    }
    return OkStatus();
  }

  /// With clipping: shard k's optimizer step, its gradients scaled by the global clip factor
  /// (computed before the first apply, once every shard's gradient norm is known).
  Status ApplyTask(size_t k) {
    StepInProgress& c = *cur_;
    const auto& tr = trial_.training;
    if (k == 0) {
      std::vector<torch::Tensor> ordered;
      for (const auto& [i, t] : norms_) ordered.push_back(t);
      c.m.grad_norm = GlobalNorm(ordered);
      c.clip_scale =
          c.m.grad_norm > tr.grad_clip_norm ? ClipScale(tr.grad_clip_norm, c.m.grad_norm) : 1.0;
      RETURN_IF_ERROR(FinishWrites());
    }
    Shard& s = shards_[k];
    if (!HostSteps(s)) {  // a host-stepped shard needs nothing on the device to step
      RETURN_IF_ERROR(Fetch(k, true));
      RETURN_IF_ERROR(Wait(k));
    }
    RETURN_IF_ERROR(
        ledger_.Acquire(Tier::kDevice, s.grad_bytes, "gradients of shard " + std::to_string(k)));
    if (disk_) {
      std::vector<MutableBytes> parts;
      if (on_.discrete) s.host_grads = HostGradsFor(s);
      for (size_t i = 0; i < s.weights.tensors.size(); ++i) {
        auto& p = s.weights.tensors[i].second;
        torch::Tensor g =
            on_.discrete ? s.host_grads[i] : torch::empty(s.weights.shapes[i], p.options());
        if (!on_.discrete) p.mutable_grad() = g;
        parts.push_back({g.data_ptr(), static_cast<size_t>(g.numel() * g.element_size())});
      }
      RETURN_IF_ERROR(disk_->ReadSync(Key(k, "g"), parts));
      disk_->Remove(Key(k, "g"));
    } else {
      ledger_.Release(Tier::kHost, s.grad_bytes);
    }
    if (on_.discrete) GradsForStep(k);
    if (c.clip_scale != 1.0) s.optimizer->ScaleGrads(c.clip_scale);
    StepOptimizer(k);
    RETURN_IF_ERROR(Evict(k, StepsOnDevice(k)));
    return FinishWrite(k);
  }

  // ---- lookahead (ExecutorOptions::lookahead) -----------------------------------------------

  /// A spilled shard held on the device before the plan's fetches of it: `bytes` (all it holds)
  /// until task `until`, where the plan's fetch takes over all but `rest` of them, then `rest`
  /// until task `rest_until` (those tasks of the next step while next_step).
  struct EarlyHold {
    enum class Kind { kNone, kForBackward, kIntoNextStep } kind = Kind::kNone;
    bool next_step = false;
    size_t until = 0, rest_until = 0;
    int64_t bytes = 0, rest = 0;
    /// What it holds beyond the plan at task t of its step.
    int64_t At(size_t t) const { return next_step || t < until ? bytes : rest; }
  };

  /// On a discrete device with the state in host memory, a spilled plan without global
  /// clipping (whose apply tasks fetch the shards again): room for holds up to the budget less
  /// 2%, and on a GPU less 32 MiB more (what the ledger does not see: the caching allocator's
  /// rounding and the segments it cannot split).
  void MakeLookahead() {
    if (!lookahead_wanted_ || !on_.discrete || disk_ || shards_.size() < 2 ||
        trial_.training.grad_clip_norm > 0) {
      return;
    }
    const int64_t budget = ledger_.device_budget();
    const int64_t margin = budget / 50 + (on_.device.is_cuda() ? int64_t{32} << 20 : 0);
    lookahead_.emplace(TasksPerStep(),
                       budget > 0 ? budget - margin : std::numeric_limits<int64_t>::max());
    early_.assign(shards_.size(), EarlyHold{});
  }

  /// Task t begins: the holds the plan's fetches take over at t end, the bytes the others have
  /// on the device are counted, and the ledger's window for t's high-water mark starts.
  void BeginTaskWindow(size_t t) {
    if (!lookahead_) return;
    early_at_start_ = 0;
    for (size_t k = 0; k < early_.size(); ++k) {
      EarlyHold& h = early_[k];
      if (!h.next_step && h.rest_until <= t) h = EarlyHold{};
      if (h.kind == EarlyHold::Kind::kNone) continue;
      // What it has on the device: a shard kept after its forward brings its state up later.
      early_at_start_ += std::min(h.At(t), DeviceBytes(k) - MissingBytes(k));
    }
    ledger_.TakeWindowPeak(Tier::kDevice);
    task_recorded_ = false;
  }

  /// The task under way's device high-water mark, before what the lookahead holds at its end.
  void RecordTask() {
    if (!lookahead_ || task_recorded_ || !cur_) return;
    lookahead_->Record(cur_->next - 1, ledger_.TakeWindowPeak(Tier::kDevice), early_at_start_);
    task_recorded_ = true;
  }

  void EndLookaheadStep() {
    if (!lookahead_) return;
    RecordTask();
    lookahead_->EndStep();
    for (auto& h : early_) {
      if (!h.next_step) h = EarlyHold{};
      h.next_step = false;
    }
  }

  /// The shards' places changed outside a step's tasks: what was measured no longer holds.
  void ResetLookahead() {
    if (!lookahead_) return;
    lookahead_->Reset();
    early_.assign(shards_.size(), EarlyHold{});
  }

  /// Every hold ends (the shards left the device: a move within a step); the measurements stay.
  void ForgetHolds() {
    if (!lookahead_) return;
    lookahead_->DropGrants();
    early_.assign(shards_.size(), EarlyHold{});
  }

  void AbandonStep() {
    cur_.reset();
    ResetLookahead();
  }

  /// The task whose fetch brings shard k (not the last) up for its backward: the backward of
  /// shard k + 1, or the last shard's task.
  size_t BackwardFetchTask(size_t k) const { return 2 * shards_.size() - 3 - k; }

  /// Shard k's parts that come to the device: its weights and, where it steps there, its
  /// optimizer state.
  std::vector<const Part*> DeviceParts(size_t k) const {
    const Shard& s = shards_[k];
    if (HostSteps(s)) return {&s.weights};
    return {&s.weights, &s.state};
  }

  /// Device bytes shard k holds with DeviceParts.
  int64_t DeviceBytes(size_t k) const {
    int64_t bytes = 0;
    for (const Part* p : DeviceParts(k)) bytes += p->at->bytes();
    return bytes;
  }

  /// Of DeviceBytes(k), those not on the device now.
  int64_t MissingBytes(size_t k) const {
    int64_t bytes = 0;
    for (const Part* p : DeviceParts(k)) {
      if (p->at->where() != Residency::kOnDevice) bytes += p->at->bytes();
    }
    return bytes;
  }

  /// Whether the ledger has room, under the lookahead's limit, for shard k's missing bytes now.
  bool RoomNow(size_t k) const {
    return ledger_.current(Tier::kDevice) + MissingBytes(k) <= lookahead_->limit();
  }

  /// Whether spilled shard k may stay on the device (or come up) from the next task on as `h`
  /// says: the ledger has room now for what it lacks, and the lookahead for all of it over the
  /// tasks h spans.
  bool Hold(size_t k, EarlyHold h) {
    if (!lookahead_ || !cur_ || Resident(k)) return false;
    RecordTask();
    if (!RoomNow(k)) return false;
    const size_t end = h.rest_until + (h.next_step ? TasksPerStep() : 0);
    if (!lookahead_->Grant(cur_->next, end, h.bytes)) return false;
    early_[k] = h;
    ++lookahead_holds_;
    return true;
  }

  /// Shard k (not the last) from the next task until the plan fetches it for its backward.
  bool HoldForBackward(size_t k) {
    const size_t until = BackwardFetchTask(k);
    return Hold(k, {EarlyHold::Kind::kForBackward, false, until, until, DeviceBytes(k), 0});
  }

  /// Shard k (not the first) after its last use in the step until the next step's forward of
  /// it is done: the plan's fetch for that forward takes over its weights (and the last
  /// shard's state); its optimizer state stays early until the forward ends, where
  /// HoldForBackward may keep it on.
  bool HoldIntoNextStep(size_t k) {
    const bool last = k + 1 == shards_.size();
    const int64_t state = DeviceBytes(k) - shards_[k].weights.at->bytes();
    return Hold(k, {EarlyHold::Kind::kIntoNextStep, true, k - 1, last ? k - 1 : k + 1,
                    DeviceBytes(k), last ? 0 : state});
  }

  /// After task t, where no forward still waits for an upload: the backward uploads of the
  /// shards whose forwards are done begin, soonest needed first, while the lookahead has room
  /// (a shard held since its forward brings its optimizer state). The first refused stops
  /// them: an upload queued before it would delay it.
  Status FetchEarly(size_t t) {
    RecordTask();
    if (!lookahead_ || !lookahead_->measured()) return OkStatus();
    const size_t S = shards_.size();
    for (size_t k = t + 2; k < S; ++k) {
      if (!Resident(k) && shards_[k].weights.at->where() != Residency::kOnDevice) {
        return OkStatus();
      }
    }
    for (size_t k = std::min(t, S - 2) + 1; k-- > 0;) {
      if (Resident(k) || BackwardFetchTask(k) <= t || MissingBytes(k) == 0) continue;
      bool room = false;
      switch (early_[k].kind) {
        case EarlyHold::Kind::kNone: room = HoldForBackward(k); break;
        case EarlyHold::Kind::kForBackward: room = RoomNow(k); break;  // granted already
        case EarlyHold::Kind::kIntoNextStep: break;                    // its forward just let it go
      }
      if (!room) break;
      RETURN_IF_ERROR(Fetch(k, true));
    }
    return OkStatus();
  }

  Trial trial_;
  std::shared_ptr<const TokenDataset> data_;
  PartitionPlan plan_;
  Placement on_;               // the device computed on; discrete: separate device copies
  ExecutorDevices devices_;    // the factory's, for MoveTo
  bool options_bf16_transit_;  // ExecutorOptions::bf16_weight_transit
  bool lookahead_wanted_;      // ExecutorOptions::lookahead
  DeviceStreams streams_;      // compute, prefetch and write-back streams on it
  TierLedger ledger_;
  std::unique_ptr<DiskTier> disk_;
  /// Discrete devices with the disk tier: pinned slabs, reused (disk -> pinned -> device).
  std::unique_ptr<SlabPool> slabs_;
  std::unique_ptr<HostTensorPool> host_pool_;  // discrete devices: MakeHostPool
  LayerSequence model_;
  std::vector<Shard> shards_;
  NamedTensors pinned_;  // every shard's pinned parameters
  std::map<std::string, size_t> global_order_;
  std::map<size_t, torch::Tensor> norms_;  // global parameter index -> gradient norm
  std::optional<StepInProgress> cur_;      // the step under way, if any
  int64_t step_ = 0;
  FailedStep failed_;                   // a step that failed midway: everything after is refused
  int64_t bytes_uploaded_ = 0;          // ExecutorStats::bytes_uploaded
  int64_t weight_casts_ = 0;            // ExecutorStats::weight_casts
  int64_t bytes_offloaded_ = 0;         // ExecutorStats::activation_bytes_offloaded
  std::optional<Lookahead> lookahead_;  // MakeLookahead
  std::vector<EarlyHold> early_;        // per shard
  int64_t early_at_start_ = 0;          // bytes early_ held when the task under way began
  bool task_recorded_ = false;          // the task under way's high-water mark taken
  int64_t lookahead_holds_ = 0;         // ExecutorStats::lookahead_holds
  int64_t host_steps_deferred_ = 0;     // ExecutorStats::host_steps_deferred
};

}  // namespace

PartitionOptions ExecutorPartitionOptions(const Trial& trial, const ExecutorOptions& options) {
  PartitionOptions po = PartitionOptionsFor(trial);
  po.flops_per_second =
      trial.training.precision == Precision::kBf16 && options.bf16_flops_per_second > 0
          ? options.bf16_flops_per_second
          : options.flops_per_second;
  po.host_link_bytes_per_second = options.host_link_bytes_per_second;
  po.host_optimizer_bytes_per_second = options.host_optimizer_bytes_per_second;
  po.attention_recompute = options.attention_recompute;
  po.fused_attention = ExecutorAttention(options.fused_attention) == AttentionMemory::kFused;
  ApplyOptimizerFlag(options.optimizer_placement, &po);
  // On a discrete device a stashed autograd graph stays in its memory (EvictKeepingGraph),
  // or with device_stash off no shard but the last stashes. Weights that travel as bf16
  // change the parameters' type on the device: their shards recompute (Stashes).
  if (options.devices.DiscreteMemoryBytes() > 0 || options.devices.simulate_discrete) {
    const bool transit =
        options.bf16_weight_transit && trial.training.precision == Precision::kBf16;
    po.stash_on_device = options.device_stash && !transit;
    po.activation_offload =
        po.stash_on_device && options.activation_offload && SavedTensorCaptureAvailable();
    po.selective_recompute = options.selective_recompute;
    po.resident_state = po.stash_on_device && options.resident_state;
    po.checkpoint_offload = po.stash_on_device && options.checkpoint_offload;
    if (!po.stash_on_device) po.host_activation_budget = 0;
  }
  return po;
}

namespace {

class ExecutorFactory : public ExecutorFactoryInterface {
 public:
  explicit ExecutorFactory(ExecutorOptions options)
      : options_(std::move(options)),
        in_memory_(MakeInMemoryExecutorFactory(
            {0, options_.flops_per_second, options_.devices, options_.fused_attention})) {
    if (options_.threads > 0) ConfigureCpuThreads(options_.threads);
    ConfigureCudaAllocator();
    KeepFreedHostMemory();
  }

  StatusOr<Admission> Admit(const Trial& given, const TokenDataset& data) override {
    RETURN_IF_ERROR(CheckModelAndData(given, data));
    Trial trial = WithDeviceBudget(given, options_.devices);
    RETURN_IF_ERROR(ResolveModel(&trial));
    auto admission = PlanAdmission(trial, ExecutorPartitionOptions(trial, options_));
    if (!admission.ok()) return admission.status().WithContext("trial " + trial.name);
    HostBytesOnGpus(options_.devices, &*admission);
    if (admission->plan.state_tier == StateTier::kDisk) {
      RETURN_IF_ERROR(CheckSpillDirectory(trial, admission->disk_bytes));
    }
    return admission;
  }

  /// A full disk is found before training, not in the middle of a step.
  Status CheckSpillDirectory(const Trial& trial, int64_t needed) const {
    if (options_.spill_dir.empty()) {
      return FailedPreconditionError("trial " + trial.name +
                                     " offloads to disk but no spill directory is configured");
    }
    std::error_code ec;
    std::filesystem::create_directories(options_.spill_dir, ec);
    struct statvfs vfs {};
    if (ec || ::statvfs(options_.spill_dir.c_str(), &vfs) != 0) {
      return FailedPreconditionError("spill directory " + options_.spill_dir + " is not usable" +
                                     (ec ? ": " + ec.message() : ""));
    }
    const int64_t free_bytes = static_cast<int64_t>(vfs.f_bavail) * vfs.f_frsize;
    if (free_bytes < needed) {
      return ResourceExhaustedError("trial " + trial.name + " spills up to " + FormatBytes(needed) +
                                    " to " + options_.spill_dir + ", which has only " +
                                    FormatBytes(free_bytes) + " free");
    }
    return OkStatus();
  }

  Status Resolve(Trial* trial) override { return ResolveModel(trial); }
  bool WritesModelFiles(const Trial& trial) const override { return HasModelFiles(trial); }
  std::optional<DeviceAllocatorBytes> AllocatorBytes(int device) const override {
    auto spec = options_.devices.At(device);
    return spec.ok() ? CachingAllocatorBytes(*spec) : std::nullopt;
  }
  std::optional<std::string> DeviceFailure(int device) const override {
    auto spec = options_.devices.At(device);
    return spec.ok() ? executor::DeviceFailure(*spec) : std::nullopt;
  }
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
    const PartitionPlan& plan = admission.plan;
    if (plan.shards.size() == 1 && plan.state_tier == StateTier::kHost &&
        plan.shards[0].optimizer == OptimizerPlacement::kDevice) {
      // The plan checked the budget.
      return in_memory_->Build(trial, std::move(data), admission, device);
    }
    try {
      auto exec = std::make_unique<SpillingExecutor>(trial, std::move(data), plan, options_, on);
      RETURN_IF_ERROR(exec->Init().WithContext("setting up " + trial.name));
      return std::unique_ptr<TrialExecutorInterface>(std::move(exec));
    } catch (const c10::Error& e) {
      return TorchErrorStatus(e, "building " + trial.name, on.device);
    }
  }

 private:
  ExecutorOptions options_;
  std::unique_ptr<ExecutorFactoryInterface> in_memory_;
};

}  // namespace

std::unique_ptr<ExecutorFactoryInterface> MakeExecutorFactory(ExecutorOptions options) {
  return std::make_unique<ExecutorFactory>(std::move(options));
}

}  // namespace hydra::executor
