#include "agent/executor/lookahead.h"

#include <algorithm>

namespace hydra::executor {

Lookahead::Lookahead(size_t tasks, int64_t limit) : tasks_(tasks), limit_(limit) { Reset(); }

void Lookahead::Record(size_t t, int64_t peak, int64_t early) {
  if (t >= tasks_) return;
  recording_[t] = std::max<int64_t>(0, peak - early);
  recorded_[t] = true;
}

void Lookahead::EndStep() {
  const bool whole = std::all_of(recorded_.begin(), recorded_.end(), [](bool r) { return r; });
  if (whole) {
    base_ = recording_;
    ++steps_;
  } else {
    steps_ = 0;  // a step with tasks unrecorded: its bases are not known
  }
  recorded_.assign(tasks_, false);
  std::copy(granted_.begin() + static_cast<std::ptrdiff_t>(tasks_), granted_.end(),
            granted_.begin());
  std::fill(granted_.begin() + static_cast<std::ptrdiff_t>(tasks_), granted_.end(), 0);
}

bool Lookahead::Grant(size_t from, size_t until, int64_t bytes) {
  if (!measured() || from > until || until > 2 * tasks_ || bytes < 0) return false;
  for (size_t i = from; i < until; ++i) {
    if (base_[i % tasks_] + granted_[i] + bytes > limit_) return false;
  }
  for (size_t i = from; i < until; ++i) granted_[i] += bytes;
  return true;
}

void Lookahead::DropGrants() { granted_.assign(2 * tasks_, 0); }

void Lookahead::Reset() {
  base_.assign(tasks_, 0);
  recording_.assign(tasks_, 0);
  recorded_.assign(tasks_, false);
  granted_.assign(2 * tasks_, 0);
  steps_ = 0;
}

}  // namespace hydra::executor
