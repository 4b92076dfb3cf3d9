#include "common/scheduler.h"

#include <algorithm>
#include <limits>
#include <map>
#include <queue>

namespace hydra {

double TrialProfile::MinibatchSeconds() const {
  double s = 0;
  for (const auto& t : tasks) s += t.compute_seconds;
  return s;
}

double Schedule::Utilization() const {
  if (busy_seconds.empty() || makespan <= 0) return 0;
  double total = 0;
  for (double b : busy_seconds) total += b;
  return total / (makespan * static_cast<double>(busy_seconds.size()));
}

namespace {

class ShardedLrtf : public SchedulingPolicyInterface {
 public:
  std::string name() const override { return "sharded-lrtf"; }
  size_t Pick(const std::vector<RunnableTrial>& r) override {
    size_t best = 0;
    for (size_t i = 1; i < r.size(); ++i) {
      if (r[i].remaining_seconds > r[best].remaining_seconds ||
          (r[i].remaining_seconds == r[best].remaining_seconds && r[i].index < r[best].index)) {
        best = i;
      }
    }
    return best;
  }
};

class Fifo : public SchedulingPolicyInterface {
 public:
  std::string name() const override { return "fifo"; }
  size_t Pick(const std::vector<RunnableTrial>& r) override {
    size_t best = 0;
    for (size_t i = 1; i < r.size(); ++i) {
      if (r[i].ready_since < r[best].ready_since ||
          (r[i].ready_since == r[best].ready_since && r[i].index < r[best].index)) {
        best = i;
      }
    }
    return best;
  }
};

class RoundRobin : public SchedulingPolicyInterface {
 public:
  std::string name() const override { return "round-robin"; }
  size_t Pick(const std::vector<RunnableTrial>& r) override {
    // The first runnable trial after the one picked last, cyclically by index.
    size_t best = 0;
    bool found = false;
    for (size_t i = 0; i < r.size(); ++i) {
      if (r[i].index > last_ && (!found || r[i].index < r[best].index)) {
        best = i;
        found = true;
      }
    }
    if (!found) {
      for (size_t i = 1; i < r.size(); ++i) {
        if (r[i].index < r[best].index) best = i;
      }
    }
    last_ = r[best].index;
    return best;
  }

 private:
  size_t last_ = std::numeric_limits<size_t>::max();
};

}  // namespace

std::unique_ptr<SchedulingPolicyInterface> MakeShardedLrtfPolicy() {
  return std::make_unique<ShardedLrtf>();
}
std::unique_ptr<SchedulingPolicyInterface> MakeFifoPolicy() { return std::make_unique<Fifo>(); }
std::unique_ptr<SchedulingPolicyInterface> MakeRoundRobinPolicy() {
  return std::make_unique<RoundRobin>();
}

Schedule Simulate(const std::vector<TrialProfile>& trials, SchedulingPolicyInterface* policy,
                  const SimulationOptions& o) {
  const size_t n = trials.size();
  const int d = std::max(1, o.devices);
  Schedule sched;
  sched.busy_seconds.assign(d, 0);
  struct TrialState {
    int64_t minibatch = 0;
    size_t task = 0;
    double ready = 0;  // when its previous task ended
    bool running = false;
    double remaining = 0;
  };
  std::vector<TrialState> st(n);
  for (size_t i = 0; i < n; ++i) {
    st[i].remaining = trials[i].TotalSeconds();
    if (trials[i].tasks.empty() || trials[i].minibatches <= 0)
      st[i].minibatch = trials[i].minibatches;
  }
  auto finished = [&](size_t i) { return st[i].minibatch >= trials[i].minibatches; };
  std::vector<double> device_free(d, 0.0), device_last_compute(d, 0.0);
  // Events: task completions (time, device, trial).
  using Event = std::tuple<double, int, size_t>;
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> events;
  std::vector<bool> idle(d, true);
  double now = 0;
  auto dispatch = [&]() {
    for (int dev = 0; dev < d; ++dev) {
      if (!idle[dev]) continue;
      std::vector<RunnableTrial> runnable;
      for (size_t i = 0; i < n; ++i) {
        if (finished(i) || st[i].running || st[i].ready > now) continue;
        runnable.push_back({i, st[i].remaining, st[i].ready,
                            st[i].minibatch * static_cast<int64_t>(trials[i].tasks.size()) +
                                static_cast<int64_t>(st[i].task)});
      }
      if (runnable.empty()) return;
      const size_t i = runnable[policy->Pick(runnable)].index;
      const TaskProfile& task = trials[i].tasks[st[i].task];
      const double transfer =
          o.link_bytes_per_second > 0
              ? static_cast<double>(task.transfer_bytes) / o.link_bytes_per_second
              : 0.0;
      // Prefetch overlaps the previous task on this device (double buffering).
      const double exposed = std::max(0.0, transfer - device_last_compute[dev]);
      const double start = now;
      const double end = start + exposed + task.compute_seconds;
      sched.tasks.push_back({i, st[i].minibatch, st[i].task, dev, start, end});
      sched.busy_seconds[dev] += end - start;
      device_last_compute[dev] = task.compute_seconds;
      st[i].running = true;
      idle[dev] = false;
      events.emplace(end, dev, i);
    }
  };
  dispatch();
  while (!events.empty()) {
    auto [t, dev, i] = events.top();
    events.pop();
    now = t;
    idle[dev] = true;
    st[i].running = false;
    st[i].ready = t;
    st[i].remaining -= trials[i].tasks[st[i].task].compute_seconds;
    if (++st[i].task == trials[i].tasks.size()) {
      st[i].task = 0;
      ++st[i].minibatch;
    }
    // Complete every event at this instant before dispatching, so ties see all free devices.
    while (!events.empty() && std::get<0>(events.top()) == now) {
      auto [t2, dev2, i2] = events.top();
      events.pop();
      idle[dev2] = true;
      st[i2].running = false;
      st[i2].ready = t2;
      st[i2].remaining -= trials[i2].tasks[st[i2].task].compute_seconds;
      if (++st[i2].task == trials[i2].tasks.size()) {
        st[i2].task = 0;
        ++st[i2].minibatch;
      }
    }
    dispatch();
    sched.makespan = std::max(sched.makespan, now);
  }
  return sched;
}

double MakespanLowerBound(const std::vector<TrialProfile>& trials, int devices) {
  double total = 0, longest = 0;
  for (const auto& t : trials) {
    total += t.TotalSeconds();
    longest = std::max(longest, t.TotalSeconds());
  }
  return std::max(total / std::max(1, devices), longest);
}

double SequentialModelParallelMakespan(const std::vector<TrialProfile>& trials,
                                       const SimulationOptions& o) {
  // Each shard sits on its own device (if there are enough), so no state moves between tasks,
  // but only one device works at a time.
  double total = 0;
  for (const auto& t : trials) {
    double minibatch = 0;
    const bool fits = static_cast<int>(t.tasks.size() / 2) <= o.devices;
    for (const auto& task : t.tasks) {
      minibatch += task.compute_seconds;
      if (!fits && o.link_bytes_per_second > 0) {
        minibatch += static_cast<double>(task.transfer_bytes) / o.link_bytes_per_second;
      }
    }
    total += minibatch * static_cast<double>(t.minibatches);
  }
  return total;
}

double GpipeMakespan(const std::vector<TrialProfile>& trials, const SimulationOptions& o,
                     int micro_batches) {
  const double d = std::max(1, o.devices);
  double total = 0;
  for (const auto& t : trials) {
    int64_t micro = std::max(1, micro_batches);
    if (t.batch_size > 0) micro = std::min(micro, t.batch_size);
    const double m = static_cast<double>(micro);
    total += t.TotalSeconds() * (m + d - 1.0) / (m * d);
  }
  return total;
}

Status CheckSchedule(const std::vector<TrialProfile>& trials, const Schedule& s) {
  std::map<int, std::vector<const ScheduledTask*>> by_device;
  std::map<size_t, std::vector<const ScheduledTask*>> by_trial;
  for (const auto& t : s.tasks) {
    by_device[t.device].push_back(&t);
    by_trial[t.trial].push_back(&t);
  }
  auto by_start = [](const ScheduledTask* a, const ScheduledTask* b) {
    return a->start < b->start;
  };
  const double eps = 1e-9;
  for (auto& [dev, ts] : by_device) {
    std::sort(ts.begin(), ts.end(), by_start);
    for (size_t i = 1; i < ts.size(); ++i) {
      if (ts[i]->start < ts[i - 1]->end - eps) {
        return FailedPreconditionError("device " + std::to_string(dev) + " runs two tasks at " +
                                       std::to_string(ts[i]->start));
      }
    }
  }
  for (size_t i = 0; i < trials.size(); ++i) {
    auto ts = by_trial[i];
    std::sort(ts.begin(), ts.end(), by_start);
    const size_t expected = trials[i].tasks.size() * static_cast<size_t>(trials[i].minibatches);
    if (ts.size() != expected) {
      return FailedPreconditionError("trial " + trials[i].name + " ran " +
                                     std::to_string(ts.size()) + " of " + std::to_string(expected) +
                                     " tasks");
    }
    for (size_t k = 0; k < ts.size(); ++k) {
      const size_t want_task = k % trials[i].tasks.size();
      const int64_t want_mb = static_cast<int64_t>(k / trials[i].tasks.size());
      if (ts[k]->task != want_task || ts[k]->minibatch != want_mb) {
        return FailedPreconditionError("trial " + trials[i].name + " ran its tasks out of order");
      }
      if (k > 0 && ts[k]->start < ts[k - 1]->end - eps) {
        return FailedPreconditionError("trial " + trials[i].name + " ran on two devices at once");
      }
    }
  }
  return OkStatus();
}

}  // namespace hydra
