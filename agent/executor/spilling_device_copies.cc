// SpillingExecutor on a discrete device (a GPU): the host copies, the pinned pools, the copies
// in and out on their streams, and the gradients' way to the host.
#include "agent/executor/spilling_executor_impl.h"

namespace hydra::executor::spilling {

void SpillingExecutor::MakeSlabPool() {
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

bool SpillingExecutor::HostSteps(const Shard& s) const {
  return on_.discrete && s.plan.optimizer == OptimizerPlacement::kHost;
}

bool SpillingExecutor::Resident(size_t k) const {
  return on_.discrete && !disk_ && shards_[k].plan.resident && StepsOnDevice(k);
}

std::vector<torch::Tensor> SpillingExecutor::Values(const NamedTensors& ts) {
  std::vector<torch::Tensor> out;
  for (const auto& [n, t] : ts) out.push_back(t);
  return out;
}

NamedTensors SpillingExecutor::Named(const NamedTensors& names,
                                     const std::vector<torch::Tensor>& ts) {
  NamedTensors out;
  for (size_t i = 0; i < ts.size(); ++i) out.emplace_back(names[i].first, ts[i]);
  return out;
}

NamedTensors SpillingExecutor::HostMasters(size_t k) const {
  const Shard& s = shards_[k];
  NamedTensors all = Named(s.weights.tensors, s.weights.host);
  all.insert(all.end(), s.state.tensors.begin(), s.state.tensors.end());
  return all;
}

std::vector<torch::Tensor> SpillingExecutor::HostSide(const Part& p) const {
  return on_.discrete ? p.host : Values(p.tensors);
}

torch::Tensor SpillingExecutor::HostCopy(const torch::Tensor& t) const {
  torch::NoGradGuard g;
  return host_pool_->GetOne(t.sizes(), t.scalar_type()).copy_(t);
}

void SpillingExecutor::UseHostCopies(Part& p) {
  torch::NoGradGuard g;
  for (size_t i = 0; i < p.tensors.size(); ++i) p.tensors[i].second.set_data(p.host[i]);
}

Optimizer::StateAllocator SpillingExecutor::StateAllocatorFor(const Shard& s) const {
  if (!on_.discrete || disk_ || HostSteps(s)) return nullptr;
  return [this](const torch::Tensor& param) {
    torch::NoGradGuard g;
    return host_pool_->GetOne(param.sizes(), param.scalar_type()).zero_();
  };
}

std::vector<torch::Tensor> SpillingExecutor::Aliases(const NamedTensors& ts) {
  std::vector<torch::Tensor> out;
  for (const auto& [n, t] : ts) out.push_back(t.detach());
  return out;
}

std::vector<torch::Tensor> SpillingExecutor::HostCopies(const NamedTensors& ts) const {
  if (disk_) return Aliases(ts);
  torch::NoGradGuard g;
  std::vector<torch::Tensor> out = HostLike(Values(ts));
  for (size_t i = 0; i < ts.size(); ++i) out[i].copy_(ts[i].second);
  return out;
}

void SpillingExecutor::MakeHostPool() {
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

void SpillingExecutor::Upload(Part& p) {
  torch::NoGradGuard g;
  if (!p.transit.empty()) CastTransitCopies(p);
  if (p.reserved.empty()) ReserveOnDevice(p);
  std::vector<torch::Tensor> dev = std::move(p.reserved), src = UploadSources(p);
  p.reserved.clear();
  p.in_done = streams_.CopyIn(dev, src, p.out_done, p.reserved_free);
  bytes_uploaded_ += Bytes(src);
  for (size_t i = 0; i < dev.size(); ++i) p.tensors[i].second.set_data(dev[i]);
}

std::vector<torch::Tensor> SpillingExecutor::UploadSources(const Part& p) {
  std::vector<torch::Tensor> src = p.host;
  for (size_t i = 0; i < p.transit.size(); ++i) {
    if (p.transit[i].defined()) src[i] = p.transit[i];
  }
  return src;
}

void SpillingExecutor::ReserveOnDevice(Part& p) {
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

void SpillingExecutor::CastTransitCopies(Part& p) {
  if (p.transit_copies == Part::TransitCopies::kCurrent) return;
  p.in_done.Synchronize();  // the last upload read the old copies
  for (size_t i = 0; i < p.transit.size(); ++i) {
    if (!p.transit[i].defined()) continue;
    p.transit[i].copy_(p.host[i]);
    ++weight_casts_;
  }
  p.transit_copies = Part::TransitCopies::kCurrent;
}

void SpillingExecutor::HostCopiesChanged(size_t k) {
  shards_[k].weights.transit_copies = Part::TransitCopies::kStale;
}

std::vector<torch::Tensor> SpillingExecutor::TransitCopies(const LayerSequence& seq,
                                                           const Shard& s) const {
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

void SpillingExecutor::SumTransitGrads(size_t k) {
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

void SpillingExecutor::TakeTransitGrads(size_t k) {
  Shard& s = shards_[k];
  for (size_t i = 0; i < s.grad_sums.size(); ++i) {
    if (s.grad_sums[i].defined()) s.weights.tensors[i].second.mutable_grad() = s.grad_sums[i];
  }
  s.grad_sums.clear();
}

void SpillingExecutor::Download(Part& p) {
  CopyOut(p);
  LeaveDevice(p);
}

void SpillingExecutor::ComputeWaitsCopiesOut(size_t k) {
  for (const Part* p : {&shards_[k].weights, &shards_[k].state}) {
    if (p->at->where() == Residency::kOnDevice) streams_.ComputeWaits(p->out_done);
  }
}

void SpillingExecutor::LeaveDevice(Part& p) {
  torch::NoGradGuard g;
  for (auto& [n, t] : p.tensors) {
    t.set_data(torch::empty({0}, torch::TensorOptions().dtype(t.scalar_type()).device(on_.device)));
  }
}

std::vector<torch::Tensor> SpillingExecutor::Buffers() const {
  std::vector<torch::Tensor> all;
  std::set<const void*> seen;
  for (const auto& layer : model_.layers) {
    for (const auto& b : layer->buffers(/*recurse=*/true)) {
      if (seen.insert(b.unsafeGetTensorImpl()).second) all.push_back(b);
    }
  }
  return all;
}

void SpillingExecutor::MoveResidentsToDevice(std::vector<torch::Tensor>* sources) {
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

void SpillingExecutor::GradsToHost(size_t k, std::vector<torch::Tensor>* host, bool tied) {
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

std::vector<torch::Tensor> SpillingExecutor::HostGradsFor(const Shard& s) const {
  std::vector<torch::ScalarType> types;
  for (const auto& [n, t] : s.weights.tensors) types.push_back(t.scalar_type());
  return host_pool_->Get(s.weights.shapes, types);
}

std::vector<torch::Tensor> SpillingExecutor::DefinedGrads(const NamedTensors& ts) {
  std::vector<torch::Tensor> out;
  for (const auto& [n, t] : ts) {
    if (t.grad().defined()) out.push_back(t.grad());
  }
  return out;
}

std::vector<torch::Tensor> SpillingExecutor::HostLike(const std::vector<torch::Tensor>& ts) const {
  std::vector<std::vector<int64_t>> shapes;
  std::vector<torch::ScalarType> types;
  for (const auto& t : ts) {
    shapes.push_back(t.sizes().vec());
    types.push_back(t.scalar_type());
  }
  return host_pool_->Get(shapes, types);
}

void SpillingExecutor::GradsForStep(size_t k) {
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

void SpillingExecutor::TiedToDevice(const Shard& s) {
  if (s.pinned.empty()) return;
  // The resident tensors compute reads: after the compute queued so far.
  streams_.ComputeWaits(
      streams_.CopyIn(Values(s.pinned), Values(s.pinned_host), {}, streams_.MarkCompute()));
}

torch::Tensor SpillingExecutor::ToDevice(const torch::Tensor& t) const {
  return on_.device.is_cpu() ? t : t.to(on_.device);
}

}  // namespace hydra::executor::spilling
