// SpillingExecutor: where each shard's parts are (device, host, disk) and their moves between
// the tiers: fetches, waits, evictions, write-backs and drops.
#include <malloc.h>

#include "agent/executor/spilling_executor_impl.h"

namespace hydra::executor::spilling {

Status SpillingExecutor::Fetch(size_t k, bool with_state) {
  RETURN_IF_ERROR(FetchPart(k, shards_[k].weights, with_state));
  const bool on_device = shards_[k].plan.optimizer == OptimizerPlacement::kDevice;
  return with_state && on_device ? FetchPart(k, shards_[k].state, true) : OkStatus();
}

Status SpillingExecutor::FetchPart(size_t k, Part& p, bool to_change) {
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

Status SpillingExecutor::Wait(size_t k) {
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

Status SpillingExecutor::Evict(size_t k, bool dirty) {
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

Status SpillingExecutor::EvictKeepingGraph(size_t k) {
  Shard& s = shards_[k];
  RETURN_IF_ERROR(Wait(k));
  if (Resident(k)) return OkStatus();  // the graph reads the weights where they stay
  for (auto& [n, t] : s.weights.tensors) FreeStorageInPlace(t);
  if (s.state.at->where() == Residency::kOnDevice) LeaveDevice(s.state);
  RETURN_IF_ERROR(s.weights.at->To(Residency::kInHost));
  return s.state.at->To(Residency::kInHost);
}

Status SpillingExecutor::WriteBack(size_t k) {
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

Status SpillingExecutor::Spill(size_t k) {
  Status written = WriteParts(k).get();
  Status dropped = Drop(k);
  return written.ok() ? dropped : written;
}

std::future<Status> SpillingExecutor::WriteParts(size_t k) {
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

Status SpillingExecutor::FinishWrite(size_t k) {
  Shard& s = shards_[k];
  if (!s.write.valid()) return OkStatus();
  Status st = s.write.get();
  Status dropped = Drop(k);
  return st.ok() ? dropped : st;
}

Status SpillingExecutor::FinishWrites(size_t from) {
  Status first;
  for (size_t k = from; k < shards_.size(); ++k) {
    Status s = FinishWrite(k);
    if (first.ok()) first = s;
  }
  return first;
}

Status SpillingExecutor::Drop(size_t k) {
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

std::vector<MutableBytes> SpillingExecutor::Materialize(Part& p) {
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

std::vector<size_t> SpillingExecutor::PartSizes(const Part& p) {
  std::vector<size_t> sizes;
  for (size_t i = 0; i < p.tensors.size(); ++i) {
    int64_t n = 1;
    for (int64_t d : p.shapes[i]) n *= d;
    sizes.push_back(static_cast<size_t>(n * p.tensors[i].second.element_size()));
  }
  return sizes;
}

void SpillingExecutor::WaitForCopies() {
  for (auto& s : shards_) {
    for (Part* p : {&s.weights, &s.state}) {
      p->in_done.Synchronize();
      p->out_done.Synchronize();
    }
  }
}

std::vector<ConstBytes> SpillingExecutor::Spans(const std::vector<torch::Tensor>& ts) {
  std::vector<ConstBytes> parts;
  for (const auto& t : ts) {
    parts.push_back({t.data_ptr(), static_cast<size_t>(t.numel() * t.element_size())});
  }
  return parts;
}

std::string SpillingExecutor::Key(size_t k, const char* part) {
  return "shard" + std::to_string(k) + "." + part;
}

}  // namespace hydra::executor::spilling
