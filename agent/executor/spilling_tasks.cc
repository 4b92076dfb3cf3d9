// SpillingExecutor's step as tasks: forwards, the last shard, backwards and optimizer steps,
// with stashed, offloaded or recomputed activations.
#include "agent/executor/spilling_executor_impl.h"

namespace hydra::executor::spilling {

torch::Tensor SpillingExecutor::ForwardShard(size_t k, torch::Tensor x) {
  PrecisionScope precision(trial_.training.precision, on_.device.type());
  for (int i = shards_[k].plan.first_layer; i <= shards_[k].plan.last_layer; ++i) {
    x = model_.layers[i]->forward(x);
  }
  return x;
}

torch::Tensor SpillingExecutor::ShardLoss(size_t k, const torch::Tensor& x,
                                          const torch::Tensor& target) {
  PrecisionScope precision(trial_.training.precision, on_.device.type());
  return LayersLoss(trial_, model_, shards_[k].plan.first_layer, shards_[k].plan.last_layer, x,
                    target);
}

Status SpillingExecutor::AfterBackward(size_t k, bool clipping) {
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

void SpillingExecutor::RunPendingHostStep() {
  if (!cur_ || !cur_->pending_host_step) return;
  StepShard(*std::exchange(cur_->pending_host_step, std::nullopt));
  ++host_steps_deferred_;
}

void SpillingExecutor::StepOptimizer(size_t k) {
  StepShard(k);
  ledger_.Release(Tier::kDevice, shards_[k].grad_bytes);
}

void SpillingExecutor::StepShard(size_t k) {
  Shard& s = shards_[k];
  if (HostSteps(s)) HostCopiesChanged(k);  // first: a step that throws may have begun
  if (on_.discrete) ComputeWaitsCopiesOut(k);
  s.optimizer->Step(LearningRateAt(trial_.training, step_), step_ + 1);
  s.optimizer->ReleaseGrads();
  if (HostSteps(s)) TiedToDevice(s);
}

size_t SpillingExecutor::TasksPerStep() const {
  const size_t S = shards_.size();
  return 2 * S - 1 + (trial_.training.grad_clip_norm > 0 ? S : 0);
}

bool SpillingExecutor::Stashes(size_t k) const {
  if (shards_[k].plan.policy != ActivationPolicy::kStash) return false;
  return !on_.discrete || GraphMayStayOnDevice(k);
}

bool SpillingExecutor::Offloads(size_t k) const {
  return shards_[k].plan.policy == ActivationPolicy::kOffload && on_.discrete &&
         GraphMayStayOnDevice(k);
}

bool SpillingExecutor::OffloadsInput(size_t k) const {
  return shards_[k].plan.input_offloaded && on_.discrete && GraphMayStayOnDevice(k) &&
         shards_[k].plan.policy == ActivationPolicy::kRecompute;
}

bool SpillingExecutor::GraphMayStayOnDevice(size_t k) const {
  return plan_.stash_on_device && !disk_ && shards_[k].weights.transit.empty();
}

torch::Tensor SpillingExecutor::Leaf(const torch::Tensor& t, size_t k) {
  return k == 0 ? t : t.detach().requires_grad_(true);
}

Status SpillingExecutor::Task(bool* finished) {
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

Status SpillingExecutor::BeginStep() {
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

Status SpillingExecutor::ForwardTask(size_t k) {
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

Status SpillingExecutor::KeepInput(size_t k) {
  StepInProgress& c = *cur_;
  if (k == 0) return OkStatus();
  const int64_t bytes = Bytes(c.inputs[k]);
  RETURN_IF_ERROR(ledger_.Acquire(
      Tier::kDevice, bytes, "input of shard " + std::to_string(k) + " kept for its backward"));
  c.kept_input[k] = bytes;
  return OkStatus();
}

void SpillingExecutor::UnkeepInput(size_t k) {
  ledger_.Release(Tier::kDevice, std::exchange(cur_->kept_input[k], 0));
}

Status SpillingExecutor::Offload(size_t k, const std::vector<torch::Tensor>& saved) {
  StepInProgress& c = *cur_;
  std::vector<torch::Tensor> keep = Values(shards_[k].weights.tensors);
  for (const auto& [n, t] : pinned_) keep.push_back(t);
  for (const auto* boundary : {&c.inputs[k], &c.inputs[k + 1], &c.outputs[k]}) {
    keep.insert(keep.end(), boundary->begin(), boundary->end());
  }
  return MoveOut(k, std::make_unique<OffloadedGraph>(saved, keep, on_.device),
                 "offloaded activations of shard " + std::to_string(k));
}

Status SpillingExecutor::MoveOut(size_t k, std::unique_ptr<OffloadedGraph> moving,
                                 const std::string& what) {
  StepInProgress& c = *cur_;
  RETURN_IF_ERROR(ledger_.Acquire(Tier::kHost, moving->bytes(), what));
  RETURN_IF_ERROR(ledger_.Acquire(Tier::kDevice, moving->bytes(), what + " (copying out)"));
  c.copying_out = moving->bytes();
  moving->MoveOut(streams_, *host_pool_);
  bytes_offloaded_ += moving->bytes();
  c.offloaded[k] = std::move(moving);
  return OkStatus();
}

Status SpillingExecutor::OffloadInput(size_t k) {
  return MoveOut(
      k,
      std::make_unique<OffloadedGraph>(cur_->inputs[k], std::vector<torch::Tensor>{}, on_.device),
      "offloaded input of shard " + std::to_string(k));
}

Status SpillingExecutor::BringBackGraph(size_t k) {
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

Status SpillingExecutor::LastShardTask() {
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

Status SpillingExecutor::AcquireBackward(size_t k) {
  const ShardPlan& p = shards_[k].plan;
  return ledger_.Acquire(Tier::kDevice,
                         p.workspace_bytes - p.backward_freed_bytes + shards_[k].grad_bytes,
                         "activations and gradients of shard " + std::to_string(k));
}

void SpillingExecutor::ReleaseBackward(size_t k) {
  const ShardPlan& p = shards_[k].plan;
  ledger_.Release(Tier::kDevice, p.workspace_bytes - p.backward_freed_bytes);
}

void SpillingExecutor::LossToHost(StepInProgress& c) {
  if (!c.loss_sum.is_cuda()) return;
  c.loss_host = torch::empty({}, torch::TensorOptions().dtype(torch::kDouble).pinned_memory(true));
  c.loss_host.copy_(c.loss_sum, /*non_blocking=*/true);
  c.loss_copied = streams_.MarkCompute();
}

double SpillingExecutor::StepLoss(const StepInProgress& c) {
  if (!c.loss_host.defined()) return c.loss_sum.item<double>();
  c.loss_copied.Synchronize();
  return c.loss_host.item<double>();
}

Status SpillingExecutor::BackwardTask(size_t k) {
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

Status SpillingExecutor::AfterLastUse(size_t k, bool clipping) {
  const bool dirty = !clipping && StepsOnDevice(k);
  const bool stays =
      k == 0 ? dirty && on_.discrete && !disk_ && !Resident(k) : dirty && HoldIntoNextStep(k);
  if (!stays) return Evict(k, dirty);
  for (Part* p : {&shards_[k].weights, &shards_[k].state}) {
    if (p->at->where() == Residency::kOnDevice) CopyOut(*p);
  }
  return OkStatus();
}

Status SpillingExecutor::ApplyTask(size_t k) {
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

}  // namespace hydra::executor::spilling
