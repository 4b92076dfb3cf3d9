// The spilling executor's set-up, its interface (steps, evaluation, state, moves between
// devices) and its factory, MakeExecutorFactory. The class: spilling_executor_impl.h.
#include <malloc.h>
#include <sys/statvfs.h>

#include "agent/executor/spilling_executor_impl.h"

namespace hydra::executor {
namespace spilling {

Status SpillingExecutor::Init() {
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

Status SpillingExecutor::AddShard(const LayerSequence& seq, size_t k) {
  Shard s;
  s.plan = plan_.shards[k];
  for (int i = s.plan.first_layer; i <= s.plan.last_layer; ++i) {
    std::map<const void*, bool> lent;
    for (const auto& t : seq.layers[i]->lent_parameters()) lent[t.unsafeGetTensorImpl()] = true;
    for (const auto& p : seq.layers[i]->named_parameters(true)) {
      auto entry = std::make_pair(seq.names[i] + "." + p.key(), p.value());
      (lent.count(p.value().unsafeGetTensorImpl()) ? s.pinned : s.weights.tensors).push_back(entry);
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

StatusOr<StepMetrics> SpillingExecutor::TrainStep() {
  while (true) {
    auto r = RunTask();
    if (!r.ok()) return r.status();
    if (r->step) return *r->step;
  }
}

StatusOr<TaskResult> SpillingExecutor::RunTask() {
  return failed_.Guard(trial_.name + " step " + std::to_string(step_), step_,
                       [&] { return RunNextTask(); });
}

StatusOr<double> SpillingExecutor::Evaluate() {
  return failed_.Guard("evaluating " + trial_.name, step_, [&] { return EvaluateShards(); });
}

StatusOr<std::vector<NamedBuffer>> SpillingExecutor::ExportState() {
  return failed_.Guard("exporting " + trial_.name, step_, [&] { return ExportShards(); });
}

Status SpillingExecutor::ImportState(int64_t step, const std::vector<NamedBuffer>& state) {
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

ExecutorStats SpillingExecutor::stats() const {
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

Status SpillingExecutor::MoveTo(int device) {
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

Status SpillingExecutor::MoveShards(const Placement& to) {
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
    WaitForCopies();                  // the next copy in, on the new device, reads the host copies
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
        if (p->at->where() == Residency::kOnDevice) RETURN_IF_ERROR(p->at->To(Residency::kInHost));
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

bool SpillingExecutor::MovableWithinStep() const {
  if (!cur_ || !on_.discrete || disk_) return false;
  for (size_t k = 0; k < shards_.size(); ++k) {
    if (Resident(k) || cur_->offloaded[k]) return false;
    for (const auto& out : cur_->outputs[k]) {
      if (out.defined()) return false;
    }
  }
  return true;
}

void SpillingExecutor::MoveStep(std::vector<torch::Tensor>* sources) {
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

Status SpillingExecutor::FetchForNextTask() {
  const size_t S = shards_.size(), t = cur_->next, L = S - 1;
  if (t < L) return Fetch(t, false);
  if (t == L) return Fetch(L, true);
  if (t < 2 * S - 1) return Fetch(2 * S - 2 - t, true);
  return OkStatus();
}

StatusOr<TaskResult> SpillingExecutor::RunNextTask() {
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
  cur_->seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
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

StatusOr<double> SpillingExecutor::EvaluateShards() {
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

StatusOr<std::vector<NamedBuffer>> SpillingExecutor::ExportShards() {
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

Status SpillingExecutor::CheckImport(const std::vector<NamedBuffer>& state) const {
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

Status SpillingExecutor::Import(int64_t step, const std::vector<NamedBuffer>& state) {
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

}  // namespace spilling

std::string SpillFolderStem(const std::string& spill_dir, const Trial& trial) {
  // Namespaces and trial names are DNS labels: '_' joins them without ambiguity.
  const std::string name =
      trial.namespace_.empty() ? trial.name : trial.namespace_ + "_" + trial.name;
  return (std::filesystem::path(spill_dir) / name).string();
}

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
      auto exec =
          std::make_unique<spilling::SpillingExecutor>(trial, std::move(data), plan, options_, on);
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
