#include "agent/executor/spilling_executor.h"

#include <malloc.h>
#include <sys/statvfs.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <optional>

#include "agent/executor/batches.h"
#include "agent/executor/cpu_threads.h"
#include "agent/executor/disk_tier.h"
#include "agent/executor/gpt2.h"
#include "agent/executor/host_allocator.h"
#include "agent/executor/inmemory_executor.h"
#include "agent/executor/optimizer.h"
#include "agent/executor/precision.h"
#include "agent/executor/residency.h"
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

/// A part of a shard's state that moves between the tiers as one: its weights, or its
/// optimizer state.
struct Part {
  const char* key = "";  // its spill file's suffix
  NamedTensors tensors;
  std::vector<std::vector<int64_t>> shapes;  // kept while the tensors are empty (on disk)
  std::optional<PartResidency> at;           // where it is; the ledger follows
  // Disk tier: the page-aligned memory the tensors live in once read back (O_DIRECT I/O), and
  // the read in flight while kReading.
  std::shared_ptr<AlignedSlab> slab;
  std::future<Status> read;
};

/// One shard's parameters and optimizer state.
struct Shard {
  ShardPlan plan;
  Part weights;         // movable parameters of the shard's layers (tied ones excluded)
  Part state;           // the optimizer's state: moves with the shard
  NamedTensors pinned;  // tied parameters the shard's layers lend: resident, stepped here
  std::unique_ptr<Optimizer> optimizer;  // over the weights and pinned
  int64_t grad_bytes = 0;
  std::future<Status> write;  // disk tier: the write-back of both parts while kWritingBack
};

class SpillingExecutor : public TrialExecutorInterface, private ReturnsHostMemoryWhenDone {
 public:
  SpillingExecutor(const Trial& trial, std::shared_ptr<const TokenDataset> data, PartitionPlan plan,
                   const ExecutorOptions& options)
      : trial_(trial),
        data_(std::move(data)),
        plan_(std::move(plan)),
        ledger_(trial.resources.device_memory_budget.value_or(0)),
        disk_(plan_.state_tier == StateTier::kDisk
                  ? std::make_unique<DiskTier>(
                        (std::filesystem::path(options.spill_dir) / trial.name).string())
                  : nullptr) {}

  ~SpillingExecutor() override {
    for (auto& s : shards_) {
      if (s.write.valid()) s.write.wait();
      for (Part* p : {&s.weights, &s.state}) {
        if (p->read.valid()) p->read.wait();
      }
    }
  }

  /// Builds the model layer by layer; each shard is set up (and, with the disk tier, written
  /// out and freed) as soon as its last layer exists, so a model larger than memory never has
  /// to be whole in memory.
  Status Init() {
    if (disk_) RETURN_IF_ERROR(disk_->Init());
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
    for (const auto& [name, p] : model_.NamedParameters()) {
      global_order_[name] = global_order_.size();
    }
    int64_t pinned_bytes = 0;
    for (const auto& [n, t] : pinned_) pinned_bytes += 2 * t.numel() * t.element_size();
    return ledger_.Acquire(Tier::kDevice, pinned_bytes, "tied parameters and their gradients");
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
    NamedTensors all = s.weights.tensors;
    all.insert(all.end(), s.pinned.begin(), s.pinned.end());
    pinned_.insert(pinned_.end(), s.pinned.begin(), s.pinned.end());
    s.optimizer = std::make_unique<Optimizer>(all, trial_.training);
    s.state.tensors = s.optimizer->NamedState();
    const std::string shard = " of shard " + std::to_string(k);
    const Tier rests_in = disk_ ? Tier::kDisk : Tier::kHost;
    s.weights.key = "w";
    s.state.key = "o";
    for (Part* p : {&s.weights, &s.state}) {
      for (const auto& [n, t] : p->tensors) p->shapes.push_back(t.sizes().vec());
      p->at.emplace(&ledger_, (p == &s.weights ? "weights" : "optimizer state") + shard,
                    Bytes(p->tensors), rests_in);
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
    const auto start = std::chrono::steady_clock::now();
    TaskResult r;
    r.tasks = TasksPerStep();
    r.task = cur_ ? cur_->next : 0;
    bool finished = false;
    UseCpuThreadsFor(trial_.training.precision);
    try {
      auto s = Task(&finished);
      if (!s.ok()) {
        cur_.reset();
        return s.WithContext(trial_.name + " step " + std::to_string(step_));
      }
    } catch (const c10::Error& e) {
      cur_.reset();
      return InternalError("training step " + std::to_string(step_) + " of " + trial_.name + ": " +
                           e.what_without_backtrace());
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

  bool InStep() const override { return cur_.has_value(); }

  StatusOr<double> Evaluate() override {
    UseCpuThreadsFor(trial_.training.precision);
    try {
      torch::NoGradGuard no_grad;
      std::vector<torch::Tensor> acts, targets;
      for (const auto& b : ValidationSamples(*data_, trial_)) {
        acts.push_back(b.input);
        targets.push_back(b.target);
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
      return InternalError("evaluating " + trial_.name + ": " + e.what_without_backtrace());
    }
  }

  int64_t step() const override { return step_; }

  StatusOr<std::vector<NamedBuffer>> ExportState() override {
    std::vector<NamedBuffer> out;
    try {
      for (const auto& [n, t] : pinned_) out.push_back(TensorToBuffer(n, t));
      for (size_t k = 0; k < shards_.size(); ++k) {
        RETURN_IF_ERROR(Fetch(k, true));
        RETURN_IF_ERROR(Wait(k));
        for (const Part* p : {&shards_[k].weights, &shards_[k].state}) {
          for (const auto& [n, t] : p->tensors) out.push_back(TensorToBuffer(n, t));
        }
        RETURN_IF_ERROR(Evict(k, false));
      }
    } catch (const c10::Error& e) {
      return InternalError("exporting " + trial_.name + ": " + e.what_without_backtrace());
    }
    return out;
  }

  Status ImportState(int64_t step, const std::vector<NamedBuffer>& state) override {
    try {
      return Import(step, state);
    } catch (const c10::Error& e) {
      return InternalError("importing the state of " + trial_.name + ": " +
                           e.what_without_backtrace());
    }
  }

  Status Import(int64_t step, const std::vector<NamedBuffer>& state) {
    size_t expected = pinned_.size();
    for (const auto& s : shards_) expected += s.weights.tensors.size() + s.state.tensors.size();
    if (expected != state.size()) {
      return InvalidArgumentError("state has " + std::to_string(state.size()) +
                                  " tensors, expected " + std::to_string(expected));
    }
    // Validate everything before changing anything: shapes are known without loading.
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
    RETURN_IF_ERROR(CopyBuffersInto(state, pinned_, /*allow_extra=*/true));
    for (size_t k = 0; k < shards_.size(); ++k) {
      RETURN_IF_ERROR(Fetch(k, true));
      RETURN_IF_ERROR(Wait(k));
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
    return st;
  }

 private:
  // ---- residency ----------------------------------------------------------------------------

  /// Starts moving shard k's weights (and optimizer state, where it steps on the device) to
  /// the device: their device memory is reserved at once and disk reads start on I/O threads;
  /// Wait(k) completes them. Optimizer state stepped on the host stays in the host tier: the
  /// step reads the gradients the backward left and updates the host copy of the weights.
  Status Fetch(size_t k, bool with_state) {
    RETURN_IF_ERROR(FetchPart(k, shards_[k].weights));
    const bool on_device = shards_[k].plan.optimizer == OptimizerPlacement::kDevice;
    return with_state && on_device ? FetchPart(k, shards_[k].state) : OkStatus();
  }

  Status FetchPart(size_t k, Part& p) {
    switch (p.at->where()) {
      case Residency::kReading:
      case Residency::kOnDevice: return OkStatus();
      case Residency::kInHost: return p.at->To(Residency::kOnDevice);
      case Residency::kWritingBack:
        // Not reached by the step's order of tasks: the write finishes and the part is read
        // back, so the dropped copy is never the one used.
        RETURN_IF_ERROR(FinishWrite(k));
        break;
      case Residency::kOnDisk: break;
    }
    RETURN_IF_ERROR(p.at->To(Residency::kReading));
    // Materialize first: it makes the slab that Read is then handed.
    auto parts = Materialize(p.tensors, p.shapes, &p.slab);
    p.read = disk_->Read(Key(k, p.key), std::move(parts), p.slab);
    return OkStatus();
  }

  /// Completes shard k's reads: their parts are on the device.
  Status Wait(size_t k) {
    Status first;
    for (Part* p : {&shards_[k].weights, &shards_[k].state}) {
      if (p->at->where() != Residency::kReading) continue;
      Status read = p->read.get();
      RETURN_IF_ERROR(p->at->To(Residency::kOnDevice));
      if (first.ok()) first = read;
    }
    return first;
  }

  /// Shard k leaves the device. Dirty state (after an optimizer step) is written back on an I/O
  /// thread and dropped by FinishWrite; clean state is dropped at once (its file is current).
  /// With the state in the host tier, it goes back there.
  Status Evict(size_t k, bool dirty) {
    Shard& s = shards_[k];
    RETURN_IF_ERROR(Wait(k));
    if (!disk_) {
      RETURN_IF_ERROR(s.weights.at->To(Residency::kInHost));
      return s.state.at->To(Residency::kInHost);
    }
    if (dirty) return WriteBack(k);
    return s.write.valid() ? OkStatus() : Drop(k);
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
  /// (from their slabs with O_DIRECT once read back); one future for both.
  std::future<Status> WriteParts(size_t k) {
    Shard& s = shards_[k];
    auto w = disk_->Write(Key(k, s.weights.key), Spans(s.weights.tensors), s.weights.slab);
    auto o = disk_->Write(Key(k, s.state.key), Spans(s.state.tensors), s.state.slab);
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

  Status FinishWrites() {
    Status first;
    for (size_t k = 0; k < shards_.size(); ++k) {
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
      p->slab.reset();  // unmapped once no tensor (or stashed graph) uses it
      RETURN_IF_ERROR(p->at->To(Residency::kOnDisk));
    }
    // RAM is scarce (hostMemoryBudget set): give freed activation and gradient memory back
    // now, not at glibc's leisure, so resident memory follows the budget. It costs page faults
    // when the memory is used again, so with RAM to spare the heap keeps it.
    if (trial_.resources.host_memory_budget.has_value()) malloc_trim(0);
    return OkStatus();
  }

  /// Gives the tensors `ts` fresh memory of `shapes` for a disk read: one page-aligned slab
  /// laid out as the spill file (so the disk reads straight into it), which each tensor keeps
  /// alive; plain allocations if the system refuses the slab.
  std::vector<MutableBytes> Materialize(NamedTensors& ts,
                                        const std::vector<std::vector<int64_t>>& shapes,
                                        std::shared_ptr<AlignedSlab>* slab) {
    std::vector<size_t> sizes;
    for (size_t i = 0; i < ts.size(); ++i) {
      int64_t n = 1;
      for (int64_t d : shapes[i]) n *= d;
      sizes.push_back(static_cast<size_t>(n * ts[i].second.element_size()));
    }
    size_t total = 0;
    const auto offsets = SpillLayout(sizes, &total);
    *slab = AlignedSlab::Allocate(total);
    std::vector<MutableBytes> parts;
    torch::NoGradGuard g;
    for (size_t i = 0; i < ts.size(); ++i) {
      auto& t = ts[i].second;
      if (*slab) {
        t.set_data(torch::from_blob((*slab)->data() + offsets[i], shapes[i],
                                    [keep = *slab](void*) {}, t.options()));
      } else {
        t.set_data(torch::empty(shapes[i], t.options()));
      }
      parts.push_back({t.data_ptr(), sizes[i]});
    }
    return parts;
  }

  static std::vector<ConstBytes> Spans(const NamedTensors& ts) {
    std::vector<ConstBytes> parts;
    for (const auto& [n, t] : ts) {
      parts.push_back({t.data_ptr(), static_cast<size_t>(t.numel() * t.element_size())});
    }
    return parts;
  }

  static std::string Key(size_t k, const char* part) {
    return "shard" + std::to_string(k) + "." + part;
  }

  // ---- compute -----------------------------------------------------------------------------

  torch::Tensor ForwardShard(size_t k, torch::Tensor x) {
    PrecisionScope precision(trial_.training.precision);
    for (int i = shards_[k].plan.first_layer; i <= shards_[k].plan.last_layer; ++i) {
      x = model_.layers[i]->forward(x);
    }
    return x;
  }

  /// The loss of the last shard `k` on `x`: its forward and the trial's loss in one.
  torch::Tensor ShardLoss(size_t k, const torch::Tensor& x, const torch::Tensor& target) {
    PrecisionScope precision(trial_.training.precision);
    return LayersLoss(trial_, model_, shards_[k].plan.first_layer, shards_[k].plan.last_layer, x,
                      target);
  }

  /// Runs shard k's optimizer step right after its backward (unless clipping must first see
  /// every shard's gradient norm), then frees its gradients.
  Status AfterBackward(size_t k, bool clipping) {
    Shard& s = shards_[k];
    if (clipping) {
      // The step waits for every shard's gradient norm: the gradients leave the device for the
      // host tier, or for the disk with the rest of the shard's state.
      NamedTensors grads;
      for (auto& [n, t] : s.weights.tensors) {
        norms_[global_order_.at(n)] = t.grad().norm();
        grads.emplace_back(n, t.grad());
      }
      for (auto& [n, t] : s.pinned) norms_[global_order_.at(n)] = t.grad().norm();
      ledger_.Release(Tier::kDevice, s.grad_bytes);
      if (disk_) {
        RETURN_IF_ERROR(disk_->WriteSync(Key(k, "g"), Spans(grads)));
        for (auto& [n, t] : s.weights.tensors) t.mutable_grad() = torch::Tensor();  // not pinned
      } else {
        RETURN_IF_ERROR(ledger_.Acquire(Tier::kHost, s.grad_bytes, "gradients"));
      }
      return OkStatus();
    }
    s.optimizer->Step(LearningRateAt(trial_.training, step_), step_ + 1);
    s.optimizer->ReleaseGrads();
    ledger_.Release(Tier::kDevice, s.grad_bytes);
    return OkStatus();
  }

  /// The step under way, between its tasks.
  struct StepInProgress {
    size_t next = 0;  ///< the next task
    int64_t A = 1;    ///< micro-batches
    // inputs[k][a]: the boundary activation entering shard k for micro-batch a.
    std::vector<std::vector<torch::Tensor>> inputs, outputs;  // outputs: stashed graphs
    std::vector<torch::Tensor> grad_out, targets;
    double loss_sum = 0, seconds = 0, clip_scale = 1.0;
    StepMetrics m;
  };

  /// Forwards of shards 0..S-2, the last shard (forward and backward), backwards of S-2..0,
  /// and with clipping an apply of each shard.
  size_t TasksPerStep() const {
    const size_t S = shards_.size();
    return 2 * S - 1 + (trial_.training.grad_clip_norm > 0 ? S : 0);
  }

  static torch::Tensor Leaf(const torch::Tensor& t, size_t k) {
    return k == 0 ? t : t.detach().requires_grad_(true);
  }

  /// Runs the next task of the step, beginning one if none is under way.
  Status Task(bool* finished) {
    const auto& tr = trial_.training;
    const size_t S = shards_.size();
    if (!cur_) RETURN_IF_ERROR(BeginStep());
    const size_t t = cur_->next++;
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
      RETURN_IF_ERROR(FinishWrites());
      cur_->m.loss = cur_->loss_sum / static_cast<double>(cur_->A);
      cur_->m.learning_rate = LearningRateAt(tr, step_);
      *finished = true;
    }
    return OkStatus();
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
    c.grad_out.assign(c.A, torch::Tensor());
    c.targets.assign(c.A, torch::Tensor());
    for (int64_t a = 0; a < c.A; ++a) {
      const Batch mb = batch.Slice(a * micro, micro);
      c.inputs[0][a] = mb.input;
      c.targets[a] = mb.target;
    }
    return Fetch(0, S == 1);
  }

  /// Forward of shard k (not the last) over all micro-batches: weights move once per step.
  Status ForwardTask(size_t k) {
    StepInProgress& c = *cur_;
    const size_t S = shards_.size();
    RETURN_IF_ERROR(Wait(k));
    RETURN_IF_ERROR(Fetch(k + 1, k + 2 == S));
    RETURN_IF_ERROR(ledger_.Acquire(Tier::kDevice, shards_[k].plan.workspace_bytes,
                                    "activations of shard " + std::to_string(k)));
    const bool stash = shards_[k].plan.policy == ActivationPolicy::kStash;
    for (int64_t a = 0; a < c.A; ++a) {
      if (stash) {
        c.inputs[k][a] = Leaf(c.inputs[k][a], k);
        c.outputs[k][a] = ForwardShard(k, c.inputs[k][a]);
        c.inputs[k + 1][a] = c.outputs[k][a].detach();
      } else {
        torch::NoGradGuard g;
        c.inputs[k + 1][a] = ForwardShard(k, c.inputs[k][a]);
      }
    }
    ledger_.Release(Tier::kDevice, shards_[k].plan.workspace_bytes);
    if (stash) {
      RETURN_IF_ERROR(
          ledger_.Acquire(Tier::kHost, shards_[k].plan.activation_bytes * c.A, "stash"));
    }
    if (stash && disk_) {
      // The stashed graph holds the weights (GEMMs save them for backward): keep them in the
      // host tier rather than dropping them and reading them again for the backward.
      RETURN_IF_ERROR(Wait(k));
      return shards_[k].weights.at->To(Residency::kInHost);
    }
    return Evict(k, /*dirty=*/false);
  }

  /// The last shard runs forward and backward back to back, micro-batch by micro-batch.
  Status LastShardTask() {
    StepInProgress& c = *cur_;
    const size_t L = shards_.size() - 1;
    const bool clipping = trial_.training.grad_clip_norm > 0;
    RETURN_IF_ERROR(Wait(L));
    if (L > 0) RETURN_IF_ERROR(Fetch(L - 1, true));
    RETURN_IF_ERROR(ledger_.Acquire(Tier::kDevice,
                                    shards_[L].plan.workspace_bytes + shards_[L].grad_bytes,
                                    "activations and gradients of shard " + std::to_string(L)));
    for (int64_t a = 0; a < c.A; ++a) {
      auto in = Leaf(c.inputs[L][a], L);
      auto loss = ShardLoss(L, in, c.targets[a]);
      (c.A == 1 ? loss : loss / c.A).backward();
      c.loss_sum += loss.item<double>();
      if (L > 0) c.grad_out[a] = in.grad();
    }
    ledger_.Release(Tier::kDevice, shards_[L].plan.workspace_bytes);
    RETURN_IF_ERROR(AfterBackward(L, clipping));
    return Evict(L, !clipping);
  }

  /// Backward of shard k (not the last), stepping its optimizer as soon as its gradients are
  /// done (unless clipping waits for every shard's norm).
  Status BackwardTask(size_t k) {
    StepInProgress& c = *cur_;
    const size_t S = shards_.size();
    const bool clipping = trial_.training.grad_clip_norm > 0;
    RETURN_IF_ERROR(Wait(k));
    if (k > 0) RETURN_IF_ERROR(Fetch(k - 1, true));
    RETURN_IF_ERROR(ledger_.Acquire(Tier::kDevice,
                                    shards_[k].plan.workspace_bytes + shards_[k].grad_bytes,
                                    "activations and gradients of shard " + std::to_string(k)));
    const bool stash = shards_[k].plan.policy == ActivationPolicy::kStash;
    for (int64_t a = 0; a < c.A; ++a) {
      torch::Tensor in, out;
      if (stash) {
        in = c.inputs[k][a];
        out = c.outputs[k][a];
      } else {
        in = Leaf(c.inputs[k][a], k);
        out = ForwardShard(k, in);  // recompute from the saved input
      }
      torch::autograd::backward({out}, {c.grad_out[a]});
      c.outputs[k][a] = torch::Tensor();
      c.grad_out[a] = k > 0 ? in.grad() : torch::Tensor();
    }
    ledger_.Release(Tier::kDevice, shards_[k].plan.workspace_bytes);
    if (stash) ledger_.Release(Tier::kHost, shards_[k].plan.activation_bytes * c.A);
    RETURN_IF_ERROR(AfterBackward(k, clipping));
    if (k + 1 < S) RETURN_IF_ERROR(FinishWrite(k + 1));
    return Evict(k, !clipping);
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
    RETURN_IF_ERROR(Fetch(k, true));
    RETURN_IF_ERROR(Wait(k));
    RETURN_IF_ERROR(ledger_.Acquire(Tier::kDevice, shards_[k].grad_bytes,
                                    "gradients of shard " + std::to_string(k)));
    if (disk_) {
      std::vector<MutableBytes> parts;
      for (size_t i = 0; i < shards_[k].weights.tensors.size(); ++i) {
        auto& p = shards_[k].weights.tensors[i].second;
        p.mutable_grad() = torch::empty(shards_[k].weights.shapes[i], p.options());
        parts.push_back(
            {p.mutable_grad().data_ptr(), static_cast<size_t>(p.numel() * p.element_size())});
      }
      RETURN_IF_ERROR(disk_->ReadSync(Key(k, "g"), parts));
      disk_->Remove(Key(k, "g"));
    } else {
      ledger_.Release(Tier::kHost, shards_[k].grad_bytes);
    }
    if (c.clip_scale != 1.0) shards_[k].optimizer->ScaleGrads(c.clip_scale);
    shards_[k].optimizer->Step(LearningRateAt(tr, step_), step_ + 1);
    shards_[k].optimizer->ReleaseGrads();
    ledger_.Release(Tier::kDevice, shards_[k].grad_bytes);
    RETURN_IF_ERROR(Evict(k, true));
    return FinishWrite(k);
  }

  Trial trial_;
  std::shared_ptr<const TokenDataset> data_;
  PartitionPlan plan_;
  TierLedger ledger_;
  std::unique_ptr<DiskTier> disk_;
  LayerSequence model_;
  std::vector<Shard> shards_;
  NamedTensors pinned_;  // every shard's pinned parameters
  std::map<std::string, size_t> global_order_;
  std::map<size_t, torch::Tensor> norms_;  // global parameter index -> gradient norm
  std::optional<StepInProgress> cur_;      // the step under way, if any
  int64_t step_ = 0;
};

class ExecutorFactory : public ExecutorFactoryInterface {
 public:
  explicit ExecutorFactory(ExecutorOptions options)
      : options_(std::move(options)),
        in_memory_(MakeInMemoryExecutorFactory({0, options_.flops_per_second})) {
    if (options_.threads > 0) ConfigureCpuThreads(options_.threads);
    KeepFreedHostMemory();
  }

  StatusOr<Admission> Admit(const Trial& given, const TokenDataset& data) override {
    RETURN_IF_ERROR(CheckModelAndData(given, data));
    Trial trial = given;
    RETURN_IF_ERROR(ResolveModel(&trial));
    PartitionOptions po = PartitionOptionsFor(trial);
    po.flops_per_second = options_.flops_per_second;
    po.host_link_bytes_per_second = options_.host_link_bytes_per_second;
    po.host_optimizer_bytes_per_second = options_.host_optimizer_bytes_per_second;
    if (options_.optimizer_placement && po.state_tier == StateTier::kHost) {
      po.optimizer_placement = options_.optimizer_placement;
    }
    auto admission = PlanAdmission(trial, po);
    if (!admission.ok()) return admission.status().WithContext("trial " + trial.name);
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
  Status WriteModelFiles(const Trial& trial, const std::vector<NamedBuffer>& state,
                         const std::string& dir) override {
    return executor::WriteModelFiles(trial, state, dir);
  }

  StatusOr<std::unique_ptr<TrialExecutorInterface>> Build(const Trial& given,
                                                          std::shared_ptr<const TokenDataset> data,
                                                          const Admission& admission) override {
    Trial trial = given;
    RETURN_IF_ERROR(ResolveModel(&trial));
    const PartitionPlan& plan = admission.plan;
    if (plan.shards.size() == 1 && plan.state_tier == StateTier::kHost &&
        plan.shards[0].optimizer == OptimizerPlacement::kDevice) {
      return in_memory_->Build(trial, std::move(data), admission);  // the plan checked the budget
    }
    try {
      auto exec = std::make_unique<SpillingExecutor>(trial, std::move(data), plan, options_);
      RETURN_IF_ERROR(exec->Init().WithContext("setting up " + trial.name));
      return std::unique_ptr<TrialExecutorInterface>(std::move(exec));
    } catch (const c10::Error& e) {
      return InternalError("building " + trial.name + ": " + e.what_without_backtrace());
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
