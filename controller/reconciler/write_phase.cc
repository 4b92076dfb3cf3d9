// The phases that decide early stopping, write the status and then tell the agents.
#include <cstdio>

#include "controller/reconciler/early_stopping_pass.h"
#include "controller/reconciler/phases.h"

namespace hydra::controller {

void StopEarly(const ReconcileContext&, Pass& pass) {
  if (pass.early_stopping.algorithm == EarlyStoppingAlgorithm::kNone) return;
  std::vector<EarlyStoppingTrial> trials;
  for (const auto& t : pass.trials) {
    auto f = pass.found.find(t.name);
    trials.push_back(
        {&pass.entries[t.name], t.training.steps, f == pass.found.end() ? nullptr : &f->second});
  }
  DecideEarlyStopping(pass.early_stopping, trials);  // Events: Summarize, on the transitions
}

StatusOr<bool> WriteStatus(const ReconcileContext& ctx, Pass& pass) {
  pass.status.trials.clear();
  for (const auto& t : pass.trials) pass.status.trials.push_back(pass.entries[t.name]);
  const kube::Json status = ToJson(pass.status);
  if (status == pass.stored) return true;
  pass.job["status"] = status;
  // Optimistic concurrency: the resourceVersion we read must still be current.
  auto w = ctx.kube->UpdateStatus(kMultiModelJobs, pass.ns, pass.job);
  if (!w.ok()) {
    if (!kube::IsConflict(w.status())) return w.status();
    return false;
  }
  // Later writes of this pass go on from what was just stored.
  pass.job = std::move(w).value();
  pass.stored = status;
  pass.wrote = true;
  return true;
}

void TellAgents(const ReconcileContext& ctx, Pass& pass) {
  for (auto& [n, e] : pass.entries) {
    auto f = pass.found.find(n);
    if (f == pass.found.end() || e.Final()) continue;
    const v1::TrialStatus& r = f->second;
    if (r.state() != v1::RUNNING && r.state() != v1::PENDING) continue;
    const std::string& ep = e.agent_endpoint;
    const auto log = [&](const char* what, const Status& s) {
      if (s.ok()) return;
      std::fprintf(stderr, "%s %s/%s/%s on %s: %s\n", what, pass.ns.c_str(), pass.name.c_str(),
                   n.c_str(), ep.c_str(), s.ToString().c_str());
    };
    if (pass.suspend) {
      // Checkpointed and stopped after its current step; a later pass reads it Interrupted.
      log("suspending", ctx.agents->Suspend(ep, pass.Ref(n)));
      continue;
    }
    v1::LimitTrialRequest req;
    *req.mutable_trial() = pass.Ref(n);
    if (e.stop_early) {
      req.set_stop(true);
      req.set_reason(EarlyStopReason(pass.early_stopping, *e.stop_early));
    } else if (r.step_limit() != WantedStepLimit(e)) {
      req.set_step_limit(WantedStepLimit(e));
    } else {
      continue;
    }
    // A call that fails is made again by the next pass, which finds the agent still behind.
    log("early stopping of", ctx.agents->Limit(ep, req));
  }
}

}  // namespace hydra::controller
