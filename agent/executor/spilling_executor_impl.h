#pragma once
// The spilling executor (MakeExecutorFactory's trials that are cut into shards): the class and
// its parts' types, shared by its source files and by nothing else. spilling_executor.cc: set-up,
// the interface, moves between devices, evaluation and state; spilling_residency.cc: the
// shards' movement between the tiers; spilling_device_copies.cc: the host and device copies of
// a discrete device; spilling_tasks.cc: the step's tasks (forward, backward, optimizer);
// spilling_lookahead.cc: fetches ahead of the plan's.
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
#include "agent/executor/spilling_executor.h"
#include "agent/executor/storage_in_place.h"
#include "agent/executor/tensor_buffers.h"
#include "agent/executor/tier_ledger.h"
#include "agent/executor/torchscript.h"
#include "common/partitioner.h"
#include "common/units.h"

namespace hydra::executor::spilling {

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

inline int64_t Bytes(const NamedTensors& ts) {
  int64_t b = 0;
  for (const auto& [n, t] : ts) b += t.numel() * t.element_size();
  return b;
}

inline int64_t Bytes(const std::vector<torch::Tensor>& ts) {
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
                  ? std::make_unique<DiskTier>(SpillFolderStem(options.spill_dir, trial),
                                               DiskTier::kDiskIoThreads, DiskTier::Folder::kUnique)
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
  Status Init();

  Status AddShard(const LayerSequence& seq, size_t k);

  StatusOr<StepMetrics> TrainStep() override;

  StatusOr<TaskResult> RunTask() override;

  bool InStep() const override { return cur_.has_value(); }

  StatusOr<double> Evaluate() override;

  int64_t step() const override { return step_; }

  StatusOr<std::vector<NamedBuffer>> ExportState() override;

  Status ImportState(int64_t step, const std::vector<NamedBuffer>& state) override;

  ExecutorStats stats() const override;

  int BoundDevice() const override { return on_.bound; }

  bool MayMoveNow() const override { return !InStep() || MovableWithinStep(); }

  /// Between steps every shard is off the device but the first, kept there with its host
  /// copies current (AfterLastUse), and the resident shards, whose host copies are brought up
  /// to date first: the tied weights and the buffers move, the streams follow, and the
  /// resident shards go up to the new device at their next use. Within a step
  /// (MovableWithinStep) the step's boundary activations and gradients go along too, and the
  /// shard the next task runs is fetched to the new device.
  Status MoveTo(int device) override;

 private:
  // ---- the interface's work, refused and recorded by failed_ ---------------------------------

  Status MoveShards(const Placement& to);

  /// Within a step, whether it may go on on another device from its next task (item 5 of the
  /// GPU issue: a spilled trial's next shard may run on any free GPU, its weights coming from
  /// host memory anyway). What the step keeps on the device is then its boundary activations,
  /// the gradient flowing back, its targets and loss, and the tied weights' gradients, which go
  /// along (MoveStep). Not where an autograd graph is on the device (a stash's, or an offloaded
  /// one's: its storages are that device's), with resident shards (a move would carry their
  /// state, which their plan keeps from moving at all), nor with the disk tier (its reads and
  /// writes go to and from the device's memory while they run).
  bool MovableWithinStep() const;

  /// Within a step, on the new device (on_): what the step keeps between its tasks (the old
  /// tensors added to `sources`).
  void MoveStep(std::vector<torch::Tensor>* sources);

  /// After a move within a step: what the task before the next one fetched for it (Task's
  /// order: forwards, the last shard, backwards; an apply task fetches its own shard).
  Status FetchForNextTask();

  StatusOr<TaskResult> RunNextTask();

  StatusOr<double> EvaluateShards();

  StatusOr<std::vector<NamedBuffer>> ExportShards();

  /// Whether `state` has every tensor of the model, of its shape and dtype: checked before
  /// Import changes anything (shapes are known without loading).
  Status CheckImport(const std::vector<NamedBuffer>& state) const;

  Status Import(int64_t step, const std::vector<NamedBuffer>& state);

  // ---- residency ----------------------------------------------------------------------------

  /// Starts moving shard k's weights (and optimizer state, where it steps on the device) to
  /// the device: their device memory is reserved at once and disk reads start on I/O threads;
  /// Wait(k) completes them. Optimizer state stepped on the host stays in the host tier: the
  /// step reads the gradients the backward left and updates the host copy of the weights.
  /// `with_state`: the task steps the shard's optimizer (it changes the shard).
  Status Fetch(size_t k, bool with_state);

  Status FetchPart(size_t k, Part& p, bool to_change);

  /// Completes shard k's reads: their parts are on the device (on a discrete device, copied
  /// there from the host memory the disk read into), and compute waits for their copies.
  Status Wait(size_t k);

  /// Shard k leaves the device. Dirty state (after an optimizer step) is written back on an I/O
  /// thread and dropped by FinishWrite; clean state is dropped at once (its file is current).
  /// With the state in the host tier, it goes back there.
  Status Evict(size_t k, bool dirty);

  /// Discrete, after a forward whose graph stays on the device (Stashes): shard k leaves the
  /// device, its weights' memory freed in place. The graph holds their storages (GEMMs save
  /// the weights, or views of them, for backward), so each tensor keeps its storage, emptied,
  /// and ReserveOnDevice fills the same storage again for the backward, whose graph then reads
  /// the weights it saved. The optimizer state is not in the graph: it leaves as usual.
  Status EvictKeepingGraph(size_t k);

  /// Starts writing both parts of shard k to their spill files; they stay on the device until
  /// FinishWrite.
  Status WriteBack(size_t k);

  /// Set-up with the disk tier: writes freshly built shard k out and frees it.
  Status Spill(size_t k);

  /// Starts writing both parts of shard k to their spill files, on the I/O threads at once
  /// (from their slabs with O_DIRECT once read back); one future for both. On a discrete
  /// device the parts on the device are first copied out to their host memory on the
  /// write-back stream; the I/O thread, not this one, waits for that copy, so compute goes on
  /// being queued meanwhile.
  std::future<Status> WriteParts(size_t k);

  Status FinishWrite(size_t k);

  /// Finishes the writes of shards `from`.. on.
  Status FinishWrites(size_t from = 0);

  /// Frees shard k's tensors (disk tier): the RAM really goes back to the system. Its reads
  /// must have been waited for.
  Status Drop(size_t k);

  /// Gives part p's host side (its tensors, or on a discrete device its host copies) fresh
  /// memory of its shapes for a disk read: one page-aligned slab laid out as the spill file (so
  /// the disk reads straight into it), which each tensor keeps alive; plain allocations if the
  /// system refuses the slab.
  std::vector<MutableBytes> Materialize(Part& p);

  /// Bytes of each of part p's tensors, from its shapes (its tensors may be empty).
  static std::vector<size_t> PartSizes(const Part& p);

  /// Waits for every part's copies in and out (host memory about to be freed or reused).
  void WaitForCopies();

  static std::vector<ConstBytes> Spans(const std::vector<torch::Tensor>& ts);

  static std::string Key(size_t k, const char* part);

  // ---- discrete devices: the device copies ------------------------------------------------

  /// Discrete with the disk tier: the pool of pinned slabs the disk reads into, holding the
  /// parts a step has in host memory at once (the shard computing, the next one read ahead and
  /// the previous one written back), each as its spill file lays it out (4 KiB per tensor).
  void MakeSlabPool();

  /// Whether shard s's optimizer steps on the host copies (a discrete device, placement host).
  bool HostSteps(const Shard& s) const;
  /// Whether a shard's step changes its device copies (so they are written back).
  bool StepsOnDevice(size_t k) const { return !HostSteps(shards_[k]); }
  /// Whether shard k's weights and optimizer state stay on the device once there
  /// (ShardPlan::resident: a discrete device, the state in the host tier, stepped on the
  /// device): Evict leaves it, its device tensors are its masters (export reads them), and its
  /// host copies are brought up to date only when it leaves the device (MoveShards).
  bool Resident(size_t k) const;

  static std::vector<torch::Tensor> Values(const NamedTensors& ts);
  static NamedTensors Named(const NamedTensors& names, const std::vector<torch::Tensor>& ts);
  /// A host-stepped shard's fp32 masters: its weights' host copies and its optimizer state
  /// (which never leaves the host).
  NamedTensors HostMasters(size_t k) const;

  /// The tensors holding part p's bytes in host memory.
  std::vector<torch::Tensor> HostSide(const Part& p) const;

  /// A host copy of `t` (built in host memory) for a discrete device: pinned for a GPU.
  torch::Tensor HostCopy(const torch::Tensor& t) const;
  /// Discrete host tier, in set-up: part p's tensors use their host copies' memory until they
  /// first leave for the device, so the memory they were built in goes back now. Set-up then
  /// holds at most one shard's freshly built weights beside the tier, never a shard twice.
  static void UseHostCopies(Part& p);

  /// Discrete host tier: a device-stepped shard's optimizer state is made zero-filled in its
  /// host memory, not beside the parameters and copied there. Null (beside the parameters)
  /// otherwise.
  Optimizer::StateAllocator StateAllocatorFor(const Shard& s) const;

  /// Tensors sharing `ts`' memory (their host side, when that is where they were made).
  static std::vector<torch::Tensor> Aliases(const NamedTensors& ts);

  /// Host copies of a part's tensors, carved from one slab. With the disk tier they are the
  /// built tensors themselves: set-up writes them out and frees them.
  std::vector<torch::Tensor> HostCopies(const NamedTensors& ts) const;

  /// Discrete: the pool the host copies, the bf16 transit copies and the gradients bound for
  /// the host come from, bounded by what the trial can hold there at once: every shard's state
  /// and twice its gradients (the gradients and the bf16 weights), the tied parameters and
  /// their gradients. Past that the memory is plain (copies from it are synchronous) and freed
  /// when dropped.
  void MakeHostPool();

  /// Discrete: part p's tensors get device memory (reserved when its disk read was issued, or
  /// now), and the host copies are copied into it on the prefetch stream (after the last copy
  /// out of them); Wait makes compute wait for it.
  void Upload(Part& p);

  /// What part p's upload reads: its host copies, or their bf16 transit copies.
  static std::vector<torch::Tensor> UploadSources(const Part& p);

  /// Discrete: device memory for part p's next upload, in the types it travels as, and the
  /// compute stream's mark: no compute queued after it uses that memory.
  void ReserveOnDevice(Part& p);

  /// bf16 weight transit: part p's bf16 copies made from its host copies, if they changed
  /// since the last cast (rounded to bf16 as autocast rounds).
  void CastTransitCopies(Part& p);

  /// Shard k's host copies changed (stepped on the host, or imported): its bf16 weights are
  /// cast anew at their next upload.
  void HostCopiesChanged(size_t k);

  /// bf16 weight transit: pinned bf16 copies for the weights of shard s's matrix products
  /// (Linear and Conv2d weights: autocast computes with their bf16 casts only). Not their
  /// biases: LibTorch's autocast adds those unrounded (measured: a bf16 bias changes the sums).
  std::vector<torch::Tensor> TransitCopies(const LayerSequence& seq, const Shard& s) const;

  /// bf16 weight transit, after each micro-batch's backward of shard k: the bf16 weights'
  /// gradients join their fp32 sums (as autocast's fp32 masters accumulate them).
  void SumTransitGrads(size_t k);

  /// bf16 weight transit, once shard k's backward is done: the fp32 sums become the
  /// gradients that go to the host optimizer.
  void TakeTransitGrads(size_t k);

  /// Discrete: part p's device tensors (newer than the host copies) are copied out on the
  /// write-back stream and leave the device.
  void Download(Part& p);

  /// Discrete: part p's device tensors are copied out to its host copies on the write-back
  /// stream; they stay on the device (compute must not change them before out_done:
  /// ComputeWaitsCopiesOut).
  void CopyOut(Part& p) { p.out_done = streams_.CopyOut(p.host, Values(p.tensors), p.in_done); }

  /// Before compute changes shard k's device tensors (its optimizer step, an import): it waits
  /// for their last copy out, which a shard kept on the device may still have under way.
  void ComputeWaitsCopiesOut(size_t k);

  /// Discrete: part p's tensors give their device memory back (the caching allocator keeps it
  /// from reuse until the streams that use it are done).
  void LeaveDevice(Part& p);

  /// The layers' buffers, each once (GPT-2's blocks share their causal mask).
  std::vector<torch::Tensor> Buffers() const;

  /// Discrete, after the model is built: the tied parameters and the layers' buffers (GPT-2's
  /// causal mask) live on the device for the trial's life. On a move the tensors they leave are
  /// added to `sources`, if given.
  void MoveResidentsToDevice(std::vector<torch::Tensor>* sources = nullptr);

  /// Discrete: shard k's weight gradients leave the device for host memory (`*host`, fresh
  /// pinned buffers; with `host` null, they stay), and with `tied` so do the tied parameters'
  /// (into their host copies' gradients). Waits for the copies: the host reads them next.
  void GradsToHost(size_t k, std::vector<torch::Tensor>* host, bool tied);

  /// Discrete: host memory for all of shard s's weight gradients, in one slab of the host pool.
  std::vector<torch::Tensor> HostGradsFor(const Shard& s) const;

  /// The gradients of `ts` that this step made.
  static std::vector<torch::Tensor> DefinedGrads(const NamedTensors& ts);

  /// Host memory of ts' shapes and types, in one slab of the host pool.
  std::vector<torch::Tensor> HostLike(const std::vector<torch::Tensor>& ts) const;

  /// Discrete, with clipping: puts shard k's parked host gradients where its optimizer steps:
  /// up to the device, or (stepping on the host) on the host copies, with the tied parameters'
  /// device gradients brought down beside them.
  void GradsForStep(size_t k);

  /// Discrete: the host copies of the tied parameters, stepped on the host, go up to their
  /// resident device tensors.
  void TiedToDevice(const Shard& s);

  /// A batch tensor on the compute device.
  torch::Tensor ToDevice(const torch::Tensor& t) const;

  // ---- compute -----------------------------------------------------------------------------

  torch::Tensor ForwardShard(size_t k, torch::Tensor x);

  /// The loss of the last shard `k` on `x`: its forward and the trial's loss in one.
  torch::Tensor ShardLoss(size_t k, const torch::Tensor& x, const torch::Tensor& target);

  /// Runs shard k's optimizer step right after its backward (unless clipping must first see
  /// every shard's gradient norm), then frees its gradients.
  Status AfterBackward(size_t k, bool clipping);

  /// A host-stepped shard's optimizer step that AfterBackward left for later (it has no tied
  /// parameters: those are shard 0's), now: the host copies are changed before any fetch reads
  /// them, since the backward of the shard before it comes first in every step.
  void RunPendingHostStep();

  /// Shard k's optimizer step, then its gradients go from the device's ledger.
  void StepOptimizer(size_t k);

  /// Shard k's optimizer step on the gradients where it steps, then its gradients go; the
  /// tied weights a host step changed go up.
  void StepShard(size_t k);

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
  size_t TasksPerStep() const;

  /// Whether shard k keeps its forward's autograd graph for its backward (Harmony's stash): in
  /// the host tier on a CPU; on a discrete device in its memory, where the plan counted it
  /// (PartitionPlan::stash_on_device; the state in host memory, the weights travelling as
  /// they are).
  bool Stashes(size_t k) const;

  /// Whether shard k keeps its forward's graph but moves what it saved to host memory until its
  /// backward (ActivationPolicy::kOffload; planned only where Stashes could keep it).
  bool Offloads(size_t k) const;

  /// Whether shard k, which recomputes, keeps its input in host memory until its backward
  /// (ShardPlan::input_offloaded; planned only where the previous shard recomputes too, so no
  /// graph holds that input).
  bool OffloadsInput(size_t k) const;

  /// Discrete: whether shard k's forward graph may outlive its forward on the device (the plan
  /// counted it there: state in host memory, the weights travelling as they are).
  bool GraphMayStayOnDevice(size_t k) const;

  /// Where shard k's stashed graph is counted.
  Tier StashTier() const { return on_.discrete ? Tier::kDevice : Tier::kHost; }

  static torch::Tensor Leaf(const torch::Tensor& t, size_t k);

  /// Runs the next task of the step, beginning one if none is under way.
  Status Task(bool* finished);

  Status BeginStep();

  /// Forward of shard k (not the last) over all micro-batches: weights move once per step.
  Status ForwardTask(size_t k);

  /// Shard k's input (every micro-batch's) stays on the device until its backward: the ledger
  /// counts it from the forward that makes it, as the plan's peak does (PackPeak), but for
  /// while shard k's own forward or backward runs, whose workspace counts it (UnkeepInput).
  /// Shard 0's input, the token ids, is the embedding's activation.
  Status KeepInput(size_t k);

  void UnkeepInput(size_t k);

  /// After shard k's forward (Offloads): the storages its graph saved, but for its weights and
  /// the boundary activations the step keeps, start copying to host memory on the write-back
  /// stream and leave the device; the weights then leave as a stash's do (EvictKeepingGraph).
  Status Offload(size_t k, const std::vector<torch::Tensor>& saved);

  /// Shard k's offloaded storages (`what`: its graph's, or its input) start copying to host
  /// memory, counted there, and on the device until the next forward (StepInProgress::
  /// copying_out); BackwardTask takes them back.
  Status MoveOut(size_t k, std::unique_ptr<OffloadedGraph> moving, const std::string& what);

  /// After shard k's forward (OffloadsInput): the input it keeps for its backward starts
  /// copying to host memory on the write-back stream and leaves the device, as an offloaded
  /// graph's storages do; it comes back beside the backward after it (BringBackGraph) into the
  /// same storage, which the backward's recompute then reads.
  Status OffloadInput(size_t k);

  /// Starts copying shard k's offloaded graph back to the device (beside the backward before
  /// its own); nothing if it has none.
  Status BringBackGraph(size_t k);

  /// The last shard runs forward and backward back to back, micro-batch by micro-batch.
  Status LastShardTask();

  /// The device bytes shard k's backward takes beyond its state at its peak: its workspace and
  /// gradients, less what autograd frees of the activations before the last gradients appear
  /// (ShardPlan::backward_freed_bytes).
  Status AcquireBackward(size_t k);

  /// After shard k's backward: all but its gradients, which its optimizer step releases.
  void ReleaseBackward(size_t k);

  /// On a GPU the step's loss, complete once the last shard's micro-batches are done, starts
  /// for host memory at once. Read at the step's end, its copy out would queue behind the
  /// write-backs queued meanwhile (the copy engine takes device-to-host copies in order,
  /// whatever their streams): on an H200 the step ended 16 ms after its last kernel, waiting
  /// for shard 0's 0.86 GB to reach host memory, which the next step does not need.
  void LossToHost(StepInProgress& c);

  /// The step's summed loss on the host.
  static double StepLoss(const StepInProgress& c);

  /// Backward of shard k (not the last), stepping its optimizer as soon as its gradients are
  /// done (unless clipping waits for every shard's norm).
  Status BackwardTask(size_t k);

  /// Shard k's backward (with its optimizer step, unless clipping) is its last use in the step.
  /// A resident shard stays on the device as it is (Evict). On a discrete device with the state
  /// in host memory, the shard the step ends with (shard 0, which the next one begins with)
  /// stays there: its stepped state is copied out, so the host copies are current for a
  /// checkpoint, a move or an evaluation, but not dropped, so the next step's first forward
  /// waits neither for that copy out nor for an upload. Any other shard is evicted, unless the
  /// lookahead keeps it there the same way until after its next forward (Hold). (With the disk
  /// tier shard 0 is written back as usual and stays through its write: FetchPart, and Task,
  /// which leaves that write running past the step's end.)
  Status AfterLastUse(size_t k, bool clipping);

  /// With clipping: shard k's optimizer step, its gradients scaled by the global clip factor
  /// (computed before the first apply, once every shard's gradient norm is known).
  Status ApplyTask(size_t k);

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
  void MakeLookahead();

  /// Task t begins: the holds the plan's fetches take over at t end, the bytes the others have
  /// on the device are counted, and the ledger's window for t's high-water mark starts.
  void BeginTaskWindow(size_t t);

  /// The task under way's device high-water mark, before what the lookahead holds at its end.
  void RecordTask();

  void EndLookaheadStep();

  /// The shards' places changed outside a step's tasks: what was measured no longer holds.
  void ResetLookahead();

  /// Every hold ends (the shards left the device: a move within a step); the measurements stay.
  void ForgetHolds();

  void AbandonStep();

  /// The task whose fetch brings shard k (not the last) up for its backward: the backward of
  /// shard k + 1, or the last shard's task.
  size_t BackwardFetchTask(size_t k) const { return 2 * shards_.size() - 3 - k; }

  /// Shard k's parts that come to the device: its weights and, where it steps there, its
  /// optimizer state.
  std::vector<const Part*> DeviceParts(size_t k) const;

  /// Device bytes shard k holds with DeviceParts.
  int64_t DeviceBytes(size_t k) const;

  /// Of DeviceBytes(k), those not on the device now.
  int64_t MissingBytes(size_t k) const;

  /// Whether the ledger has room, under the lookahead's limit, for shard k's missing bytes now.
  bool RoomNow(size_t k) const;

  /// Whether spilled shard k may stay on the device (or come up) from the next task on as `h`
  /// says: the ledger has room now for what it lacks, and the lookahead for all of it over the
  /// tasks h spans.
  bool Hold(size_t k, EarlyHold h);

  /// Shard k (not the last) from the next task until the plan fetches it for its backward.
  bool HoldForBackward(size_t k);

  /// Shard k (not the first) after its last use in the step until the next step's forward of
  /// it is done: the plan's fetch for that forward takes over its weights (and the last
  /// shard's state); its optimizer state stays early until the forward ends, where
  /// HoldForBackward may keep it on.
  bool HoldIntoNextStep(size_t k);

  /// After task t, where no forward still waits for an upload: the backward uploads of the
  /// shards whose forwards are done begin, soonest needed first, while the lookahead has room
  /// (a shard held since its forward brings its optimizer state). The first refused stops
  /// them: an upload queued before it would delay it.
  Status FetchEarly(size_t t);

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

}  // namespace hydra::executor::spilling
