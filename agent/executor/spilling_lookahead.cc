// SpillingExecutor's lookahead (ExecutorOptions::lookahead): shards fetched ahead of the
// plan's fetches where the device budget has room.
#include "agent/executor/spilling_executor_impl.h"

namespace hydra::executor::spilling {

void SpillingExecutor::MakeLookahead() {
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

void SpillingExecutor::BeginTaskWindow(size_t t) {
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

void SpillingExecutor::RecordTask() {
  if (!lookahead_ || task_recorded_ || !cur_) return;
  lookahead_->Record(cur_->next - 1, ledger_.TakeWindowPeak(Tier::kDevice), early_at_start_);
  task_recorded_ = true;
}

void SpillingExecutor::EndLookaheadStep() {
  if (!lookahead_) return;
  RecordTask();
  lookahead_->EndStep();
  for (auto& h : early_) {
    if (!h.next_step) h = EarlyHold{};
    h.next_step = false;
  }
}

void SpillingExecutor::ResetLookahead() {
  if (!lookahead_) return;
  lookahead_->Reset();
  early_.assign(shards_.size(), EarlyHold{});
}

void SpillingExecutor::ForgetHolds() {
  if (!lookahead_) return;
  lookahead_->DropGrants();
  early_.assign(shards_.size(), EarlyHold{});
}

void SpillingExecutor::AbandonStep() {
  cur_.reset();
  ResetLookahead();
}

std::vector<const Part*> SpillingExecutor::DeviceParts(size_t k) const {
  const Shard& s = shards_[k];
  if (HostSteps(s)) return {&s.weights};
  return {&s.weights, &s.state};
}

int64_t SpillingExecutor::DeviceBytes(size_t k) const {
  int64_t bytes = 0;
  for (const Part* p : DeviceParts(k)) bytes += p->at->bytes();
  return bytes;
}

int64_t SpillingExecutor::MissingBytes(size_t k) const {
  int64_t bytes = 0;
  for (const Part* p : DeviceParts(k)) {
    if (p->at->where() != Residency::kOnDevice) bytes += p->at->bytes();
  }
  return bytes;
}

bool SpillingExecutor::RoomNow(size_t k) const {
  return ledger_.current(Tier::kDevice) + MissingBytes(k) <= lookahead_->limit();
}

bool SpillingExecutor::Hold(size_t k, EarlyHold h) {
  if (!lookahead_ || !cur_ || Resident(k)) return false;
  RecordTask();
  if (!RoomNow(k)) return false;
  const size_t end = h.rest_until + (h.next_step ? TasksPerStep() : 0);
  if (!lookahead_->Grant(cur_->next, end, h.bytes)) return false;
  early_[k] = h;
  ++lookahead_holds_;
  return true;
}

bool SpillingExecutor::HoldForBackward(size_t k) {
  const size_t until = BackwardFetchTask(k);
  return Hold(k, {EarlyHold::Kind::kForBackward, false, until, until, DeviceBytes(k), 0});
}

bool SpillingExecutor::HoldIntoNextStep(size_t k) {
  const bool last = k + 1 == shards_.size();
  const int64_t state = DeviceBytes(k) - shards_[k].weights.at->bytes();
  return Hold(k, {EarlyHold::Kind::kIntoNextStep, true, k - 1, last ? k - 1 : k + 1, DeviceBytes(k),
                  last ? 0 : state});
}

Status SpillingExecutor::FetchEarly(size_t t) {
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

}  // namespace hydra::executor::spilling
