// Summarize: the job's counts, best trial, conditions and the Events of this pass's
// transitions.
#include <cmath>
#include <cstdio>

#include "controller/reconciler/conditions.h"
#include "controller/reconciler/phases.h"

namespace hydra::controller {
namespace {

namespace cond = conditions;

/// A loss for people: 4 significant digits ("3.322"), for the printer column.
std::string ForReading(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.4g", v);
  return buf;
}

struct TrialCounts {
  bool suspended = false;  ///< spec.suspend
  int pending = 0, running = 0, succeeded = 0, failed = 0, early_stopped = 0, unplaced = 0,
      total = 0;
  /// Every trial ended: succeeded, stopped early, failed or cancelled.
  bool AllFinal() const { return succeeded + early_stopped + failed == total; }
  /// Every trial ended well: succeeded, or stopped early by the job's own early stopping.
  bool Complete() const { return succeeded + early_stopped == total; }
};

/// Sets one condition of the pass's status at this pass's generation and time.
struct Conditions {
  std::vector<Condition>& list;
  int64_t generation;
  std::string now;
  void Set(const char* type, bool status, const std::string& reason, const std::string& message) {
    SetCondition(list, type, status, reason, Truncated(message), generation, now);
  }
};

void SetProgressingAndReady(Conditions& conds, const TrialCounts& c,
                            const std::map<std::string, std::string>& rejected,
                            const std::map<std::string, std::string>& no_room) {
  const bool all_final = c.AllFinal();
  conds.Set(cond::kProgressing, !all_final, all_final ? cond::kFinished : cond::kTrialsTraining,
            std::to_string(c.running) + " running, " + std::to_string(c.pending) + " pending, " +
                std::to_string(c.succeeded) + " succeeded, " +
                (c.early_stopped > 0 ? std::to_string(c.early_stopped) + " stopped early, "
                                     : std::string()) +
                std::to_string(c.failed) + " failed of " + std::to_string(c.total));
  const char* waiting_reason = rejected.empty() ? cond::kWaitingForCapacity : cond::kTrialRejected;
  conds.Set(cond::kReady, c.unplaced == 0, c.unplaced == 0 ? cond::kTrialsPlaced : waiting_reason,
            c.unplaced == 0 ? "every unfinished trial has an agent"
            : rejected.empty()
                ? std::to_string(c.unplaced) + " trials wait for an agent" +
                      (no_room.empty() ? std::string() : ": " + no_room.begin()->second)
                : rejected.begin()->first + " cannot start: " + rejected.begin()->second);
}

/// Degraded: the first thing that needs attention, most specific first.
void SetDegraded(Conditions& conds, const Pass& pass) {
  std::string reason = cond::kAsExpected, message = "as expected";
  if (!pass.rejected.empty()) {
    reason = cond::kTrialRejected;
    message = pass.rejected.begin()->first + ": " + pass.rejected.begin()->second;
  } else if (pass.own_agents && !pass.pods.problem.empty()) {
    reason = cond::kAgentPodsFailing;
    message = pass.pods.problem;
  } else if (!pass.unreachable.empty()) {
    reason = cond::kAgentUnreachable;
    message = pass.unreachable;
  } else if (!pass.inventory.ok()) {
    reason = cond::kInventoryUnavailable;
    message = pass.inventory.status().message();
  } else if (!pass.no_room.empty()) {
    reason = cond::kWaitingForCapacity;
    message = pass.no_room.begin()->first + ": " + pass.no_room.begin()->second;
  }
  conds.Set(cond::kDegraded, reason != cond::kAsExpected, reason, message);
}

void SetJobConditions(Conditions& conds, const TrialCounts& c, const Pass& pass) {
  const bool all_final = c.AllFinal();
  if (c.suspended && !all_final) {
    const std::string why = "spec.suspend is true: " + std::to_string(c.running) +
                            " trials still stopping, " + std::to_string(c.pending) +
                            " checkpointed or never started, waiting";
    conds.Set(cond::kProgressing, false, cond::kSuspended, why);
    conds.Set(cond::kReady, false, cond::kSuspended, why);
  } else {
    SetProgressingAndReady(conds, c, pass.rejected, pass.no_room);
  }
  conds.Set(cond::kComplete, c.Complete(),
            c.Complete()  ? cond::kAllTrialsSucceeded
            : c.suspended ? cond::kSuspended
                          : cond::kTrialsTraining,
            std::to_string(c.succeeded) + " of " + std::to_string(c.total) + " trials succeeded" +
                (c.early_stopped > 0 ? ", " + std::to_string(c.early_stopped) + " stopped early"
                                     : std::string()));
  conds.Set(cond::kFailed, all_final && c.failed > 0,
            c.failed > 0 ? cond::kTrialsFailed : cond::kAsExpected,
            c.failed > 0 ? std::to_string(c.failed) + " trials failed or were cancelled"
                         : "no trial failed");
  SetDegraded(conds, pass);
}

/// spec.agents: status.agents and the Queued condition (every live pod waits for Kueue).
void SummarizePods(Conditions& conds, Pass& pass) {
  AgentPodsStatus s;
  s.desired = pass.pods.desired;
  for (const auto* p : pass.pods.Live()) {
    s.pods += 1;
    s.ready += p->phase == AgentPodPhase::kReady;
    s.gated += p->kueue_gated;
  }
  pass.status.agents = s;
  const std::string queue =
      pass.job["metadata"].value("labels", kube::Json::object()).value(kKueueQueueLabel, "");
  if (s.pods == 0) {
    conds.Set(cond::kQueued, false, cond::kNoAgentPods, "the job has no agent pods now");
  } else if (s.gated == s.pods) {
    conds.Set(cond::kQueued, true, cond::kAwaitingAdmission,
              std::to_string(s.pods) + " agent pods wait for Kueue to admit them" +
                  (queue.empty() ? "" : " (queue " + queue + ")"));
  } else {
    conds.Set(cond::kQueued, false, cond::kAdmitted,
              std::to_string(s.pods - s.gated) + " of " + std::to_string(s.pods) +
                  " agent pods admitted");
  }
}

/// Counts the trials and sends the Events of their transitions since the status was read.
TrialCounts CountTrials(const ReconcileContext& ctx, Pass& pass) {
  std::map<std::string, TrialState> before;  // as read, for transition Events
  for (const auto& o : pass.read_status.trials) before[o.name] = o.state;
  TrialCounts c;
  c.total = static_cast<int>(pass.trials.size());
  c.suspended = pass.suspend;
  for (const auto& t : pass.trials) {
    const TrialEntry& e = pass.entries[t.name];
    const TrialState s = e.state;
    c.pending += s == TrialState::kPending || s == TrialState::kInterrupted;
    c.running += s == TrialState::kRunning;
    c.succeeded += s == TrialState::kSucceeded;
    c.early_stopped += s == TrialState::kEarlyStopped;
    c.failed += s == TrialState::kFailed || s == TrialState::kCancelled;
    c.unplaced += !e.Final() && !e.OnAgent();
    pass.result.trials_by_state[TrialStateName(s)] += 1;
    auto b = before.find(t.name);
    if (b != before.end() && b->second == s) continue;
    if (s == TrialState::kSucceeded) {
      ctx.Event(pass.job, "Normal", cond::kEventTrialSucceeded,
                t.name + " succeeded; validation loss " +
                    (e.validation_loss ? std::to_string(*e.validation_loss) : std::string("n/a")));
    } else if (s == TrialState::kEarlyStopped) {
      ctx.Event(pass.job, "Normal", cond::kEventTrialEarlyStopped,
                t.name + " stopped early: " + e.message);
    } else if (s == TrialState::kFailed || s == TrialState::kCancelled) {
      ctx.Event(pass.job, "Warning", cond::kEventTrialFailed,
                t.name + " " + TrialStateName(s) + ": " + e.message);
    }
  }
  return c;
}

void SetBestTrial(Pass& pass) {
  std::string best;
  double best_loss = INFINITY;
  for (const auto& t : pass.trials) {
    const TrialEntry& e = pass.entries[t.name];
    if (e.state == TrialState::kSucceeded && e.validation_loss && *e.validation_loss < best_loss) {
      best_loss = *e.validation_loss;
      best = t.name;
    }
  }
  if (best.empty()) return;
  pass.status.best_trial = BestTrial{best, best_loss, pass.entries[best].hyperparameters};
  pass.status.best_validation_loss = ForReading(best_loss);
}

void JobEvents(const ReconcileContext& ctx, const Pass& pass, const TrialCounts& c) {
  const std::string best = pass.status.best_trial ? pass.status.best_trial->name : "";
  if (c.failed == 0) {
    ctx.Event(pass.job, "Normal", cond::kEventJobComplete,
              c.early_stopped == 0
                  ? "all " + std::to_string(c.total) + " trials succeeded; best " + best
                  : std::to_string(c.succeeded) + " trials succeeded and " +
                        std::to_string(c.early_stopped) + " stopped early; best " + best);
  } else {
    ctx.Event(pass.job, "Warning", cond::kEventJobFailed,
              std::to_string(c.failed) + " of " + std::to_string(c.total) + " trials failed");
  }
}

}  // namespace

void Summarize(const ReconcileContext& ctx, Pass& pass) {
  if (!pass.suspended.empty()) {
    std::string text;
    for (const auto& t : pass.suspended) text += (text.empty() ? "" : ", ") + t;
    ctx.Event(pass.job, "Normal", cond::kEventTrialsSuspended, "suspended (spec.suspend): " + text);
  }
  for (const auto& [n, why] : pass.no_room) {
    pass.entries[n].message = Truncated("waiting for an agent: " + why);
  }
  const TrialCounts c = CountTrials(ctx, pass);
  JobStatus& status = pass.status;
  status.trial_count = c.total;
  status.pending = c.pending;
  status.running = c.running;
  status.succeeded = c.succeeded;
  status.failed = c.failed;
  if (pass.early_stopping.algorithm != EarlyStoppingAlgorithm::kNone) {
    status.early_stopped = c.early_stopped;
  }
  SetBestTrial(pass);
  const std::string now = ctx.now();
  if (status.start_time.empty() &&
      (c.running + c.succeeded + c.early_stopped + c.failed > 0 || pass.result.assigned > 0)) {
    status.start_time = now;
  }
  pass.all_final = c.AllFinal();
  const bool was_final = !pass.read_status.completion_time.empty();
  if (pass.all_final && !was_final) status.completion_time = now;
  Conditions conds{status.conditions, pass.generation, now};
  SetJobConditions(conds, c, pass);
  if (pass.own_agents) SummarizePods(conds, pass);
  if (pass.all_final && !was_final) JobEvents(ctx, pass, c);
}

}  // namespace hydra::controller
