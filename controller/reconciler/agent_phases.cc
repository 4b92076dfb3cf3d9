// The phases that read the agents: which agents the job may use (the shared pool, or its own
// pods), what they report of the job's trials, and the trials that must move.
#include <cmath>
#include <cstdio>
#include <initializer_list>

#include "common/trial_result.h"
#include "controller/reconciler/conditions.h"
#include "controller/reconciler/phases.h"
#include "proto/trial_proto.h"

namespace hydra::controller {
namespace {

namespace cond = conditions;
using kube::Json;

void Track(Pass& pass, std::set<std::string>& seen, const std::string& endpoint) {
  if (!endpoint.empty() && seen.insert(endpoint).second) pass.endpoints.push_back(endpoint);
}

/// Tracks `pass.endpoints` plus those holding the job's trials, and reads their latest reports.
void ReadReports(const ReconcileContext& ctx, Pass& pass, std::set<std::string>& seen) {
  // Not a finished trial's: its agent may be long gone (a job's own pod, deleted with the job's
  // tail), and the inventory or the pods name every agent that is still there.
  for (const auto& [n, e] : pass.entries) {
    if (!e.Final()) Track(pass, seen, e.agent_endpoint);
  }
  ctx.agents->Track(pass.endpoints);
  for (const auto& ep : pass.endpoints) {
    // Asked first: an answer that comes in between is then in the report, not lost between
    // the two (an agent answers once and stays answered).
    const bool due = ctx.agents->FirstAnswerDue(ep);
    auto r = ctx.agents->LastStatus(ep);
    if (!r.ok()) {
      if (due) pass.first_answer_due.insert(ep);
      continue;
    }
    for (const auto& t : r->trials()) {
      pass.load[ep] += t.state() == v1::PENDING || t.state() == v1::RUNNING;
    }
    pass.reports[ep] = std::move(r).value();
  }
  std::lock_guard<std::mutex> lock(ctx.memory->mu);
  for (const auto& [ep, r] : pass.reports) ctx.memory->lost.erase(ep);
}

/// Why an agent pod's own report does not confirm it as this job's agent on its node; empty
/// when it does.
std::string PodConfirmationProblem(const Pass& pass, const AgentPodView& pod,
                                   const v1::GetStatusResponse& r) {
  if (r.node_name() != pod.node) {
    return "it answers as node '" + r.node_name() + "', its pod is on '" + pod.node + "'";
  }
  const auto& j = r.dedicated_job();
  if (j.namespace_() != pass.ns || j.name() != pass.name || j.uid() != pass.uid) {
    return "it does not serve this job only (--dedicated-job " + j.namespace_() + "/" + j.name() +
           "/" + j.uid() + ")";
  }
  return "";
}

/// A Ready pod whose agent confirmed itself, as the inventory placement reads: its devices and
/// their memory from the agent's own report.
AgentInventory PodAgent(const AgentPodView& pod, const v1::GetStatusResponse& r) {
  AgentInventory a;
  a.node = pod.node;
  a.endpoint = pod.endpoint;
  a.version = r.version();
  for (const auto& d : r.devices()) {
    DeviceInventory dev;
    dev.name = d.name();
    dev.total_bytes = d.memory_total_bytes();
    dev.free_bytes = d.memory_free_bytes();
    dev.uuid = d.uuid();
    a.devices.push_back(dev);
  }
  return a;
}

void ObserveSharedPool(const ReconcileContext& ctx, Pass& pass) {
  pass.inventory = ctx.inventory->Inventory();
  std::set<std::string> seen;
  if (pass.inventory.ok()) {
    for (const auto& a : *pass.inventory) {
      pass.in_inventory.insert(a.endpoint);
      Track(pass, seen, a.endpoint);
    }
  }
  ReadReports(ctx, pass, seen);
}

}  // namespace

void ForgetGoneEndpoints(const ReconcileContext& ctx, const Pass& pass,
                         const std::vector<std::string>& still) {
  const std::string key = pass.ns + "/" + pass.name + "/" + pass.uid;
  std::vector<std::string> gone;
  {
    std::lock_guard<std::mutex> lock(ctx.memory->mu);
    auto& last = ctx.memory->own_endpoints[key];
    const std::set<std::string> now(still.begin(), still.end());
    for (const auto& ep : last) {
      if (!now.count(ep)) gone.push_back(ep);
    }
    if (now.empty()) {
      ctx.memory->own_endpoints.erase(key);
    } else {
      last = now;
    }
  }
  if (!gone.empty()) ctx.agents->Forget(gone);
}

namespace {

void ObserveOwnPods(const ReconcileContext& ctx, Pass& pass) {
  std::set<std::string> seen;
  auto listed = ctx.kube->List(kube::kPods, pass.ns, std::string(kJobUidLabel) + "=" + pass.uid);
  if (!listed.ok()) {
    pass.pods.problem = "cannot list the job's agent pods: " + listed.status().message();
    pass.inventory = UnavailableError(pass.pods.problem);
    ReadReports(ctx, pass, seen);
    return;  // nothing is known gone
  }
  for (const auto& item : listed->value("items", Json::array())) {
    pass.pods.pods.push_back(ObserveAgentPod(item, ctx.options->agent_pods.grpc_port));
  }
  for (const auto& p : pass.pods.pods) {
    if (p.phase == AgentPodPhase::kFailed || p.endpoint.empty()) continue;
    pass.in_inventory.insert(p.endpoint);  // its agent may hold trials, even while it ends
    // With TLS, the job's agents prove the job's own name: another job's agent at this
    // address (an address reused) fails the handshake.
    if (ctx.options->agent_pod_ca) {
      ctx.agents->SetServerName(p.endpoint, AgentServerName(pass.ns, pass.name));
    }
    Track(pass, seen, p.endpoint);
  }
  ReadReports(ctx, pass, seen);
  ForgetGoneEndpoints(ctx, pass, pass.endpoints);
  // Only the job's own pods speak for it: what answers at the address of a pod that failed or
  // is gone is not its agent (the address may belong to another pod by now).
  for (auto it = pass.reports.begin(); it != pass.reports.end();) {
    it = pass.in_inventory.count(it->first) ? std::next(it) : pass.reports.erase(it);
  }
  std::vector<AgentInventory> agents;
  for (auto& p : pass.pods.pods) {
    if (p.phase != AgentPodPhase::kReady) continue;
    auto r = pass.reports.find(p.endpoint);
    if (r == pass.reports.end()) {
      // Ready to the kubelet, silent to the controller (still dialling, or a TLS or network
      // problem between them): the status says which.
      p.reason = ctx.agents->LastStatus(p.endpoint).status().message();
      continue;
    }
    const std::string problem = PodConfirmationProblem(pass, p, r->second);
    p.reason = problem;
    if (problem.empty()) {
      agents.push_back(PodAgent(p, r->second));
      continue;
    }
    std::lock_guard<std::mutex> lock(ctx.memory->mu);
    if (ctx.memory->unconfirmed_logged.insert(p.endpoint).second) {
      std::fprintf(stderr, "hydra-controller: not using agent pod %s/%s at %s: %s\n",
                   pass.ns.c_str(), p.name.c_str(), p.endpoint.c_str(), problem.c_str());
    }
  }
  pass.inventory = std::move(agents);
}

/// The pod (any phase) whose agent was at `endpoint`, or null.
const AgentPodView* PodOf(const Pass& pass, const std::string& endpoint) {
  const AgentPodView* found = nullptr;
  for (const auto& p : pass.pods.pods) {
    if (p.endpoint == endpoint && (found == nullptr || p.phase != AgentPodPhase::kFailed)) {
      found = &p;
    }
  }
  return found;
}

/// Whether the agent at `endpoint` is lost, and why. The shared pool: silent for
/// agent_lost_after and gone from Prometheus (both must agree: a blip in one is tolerated).
/// The job's own pods: its pod failed or is gone (the API server says so at once), or a pod
/// that is not Ready has been silent that long.
bool AgentLost(const ReconcileContext& ctx, const Pass& pass, const std::string& ep, double silent,
               std::string* why) {
  const bool silent_long =
      silent * 1000 > static_cast<double>(ctx.options->agent_lost_after.count());
  // Without the inventory or the pod list nothing is declared lost: the controller's own blip
  // must not move every trial.
  if (!pass.inventory.ok()) return false;
  const std::string secs = std::to_string(static_cast<int>(silent));
  if (!pass.own_agents) {
    *why = "no answer for " + secs + " s and gone from Prometheus";
    return silent_long && !pass.in_inventory.count(ep);
  }
  const AgentPodView* pod = PodOf(pass, ep);
  if (pod == nullptr) {
    *why = "its agent pod is gone";
    return true;
  }
  if (pod->phase == AgentPodPhase::kFailed) {
    *why =
        "its agent pod " + pod->name + " failed" + (pod->reason.empty() ? "" : ": " + pod->reason);
    return true;
  }
  *why = "its agent pod " + pod->name + " is " + AgentPodPhaseName(pod->phase) +
         " and its agent has not answered for " + secs + " s";
  return silent_long && pod->phase != AgentPodPhase::kReady;
}

/// The agent's report of trial `n` (this job's, of the entry's attempt or newer), or null.
const v1::TrialStatus* FindOurs(const Pass& pass, const v1::GetStatusResponse& report,
                                const std::string& n, int64_t attempt) {
  const v1::TrialStatus* found = nullptr;
  for (const auto& t : report.trials()) {
    if (pass.Ours(t, n, attempt)) found = &t;
  }
  return found;
}

/// A trial whose agent did not report this pass: lost, unreachable, or a blip.
void FollowUnreported(const ReconcileContext& ctx, Pass& pass, const std::string& n,
                      TrialEntry& e) {
  const std::string ep = e.agent_endpoint;
  const double silent = ctx.agents->SecondsSinceContact(ep);
  std::string why;
  if (AgentLost(ctx, pass, ep, silent, &why)) {
    {
      std::lock_guard<std::mutex> lock(ctx.memory->mu);
      pass.result.agents_lost += ctx.memory->lost.insert(ep).second;
    }
    RequeueTrial(ctx, pass, n, "agent_lost",
                 "agent " + (e.agent.empty() ? ep : e.agent) + " lost (" + why + ")");
    return;
  }
  auto status = ctx.agents->LastStatus(ep);
  if (status.status().code() == StatusCode::kUnavailable) {
    pass.unreachable = status.status().message();
    e.message = Truncated(pass.unreachable);
  }
  // Not reached yet, or a blip: keep the last known state.
}

/// The agent's report says the trial was suspended (spec.suspend), lost, drained or cancelled:
/// records it; false when the report is an ordinary one to apply.
bool FollowEnded(const ReconcileContext& ctx, Pass& pass, const std::string& n, TrialEntry& e,
                 const v1::TrialStatus* found) {
  const std::string where = e.agent.empty() ? e.agent_endpoint : e.agent;
  if (found != nullptr && found->state() == v1::INTERRUPTED &&
      (pass.suspend || IsSuspendedMessage(found->message()))) {
    // Checkpointed and stopped for spec.suspend (even if it is false again by now): it waits,
    // Interrupted, naming the agent that holds its record, and is not a restart.
    ApplyTrialReport(*found, e);
    pass.suspended.push_back(n + " at step " + std::to_string(found->step()));
    return true;
  }
  if (found != nullptr && found->state() != v1::INTERRUPTED &&
      !(found->state() == v1::CANCELLED && found->attempt() == e.attempt)) {
    return false;
  }
  // The agent lost it (restarted), drained it (preemption notice, a full disk, its pod being
  // deleted) or had it cancelled under it: place it again; it resumes from its newest
  // checkpoint.
  if (found == nullptr) {
    RequeueTrial(ctx, pass, n, "agent_forgot", "no longer on " + where);
    return true;
  }
  const bool drained = found->state() == v1::INTERRUPTED;
  RequeueTrial(ctx, pass, n, drained ? "agent_drained" : "cancelled",
               std::string(drained ? "interrupted on " : "cancelled on ") + where + " at step " +
                   std::to_string(found->step()) +
                   (found->message().empty() ? "" : " (" + found->message() + ")"));
  return true;
}

}  // namespace

void ObserveAgents(const ReconcileContext& ctx, Pass& pass) {
  if (pass.own_agents) {
    ObserveOwnPods(ctx, pass);
  } else {
    ObserveSharedPool(ctx, pass);
  }
}

namespace {

/// `value` where it is one of `known`, else empty: the status shows an agent's words for a
/// closed set only (its size stays bounded whatever an agent sends).
std::string OneOf(const std::string& value, std::initializer_list<const char*> known) {
  for (const char* k : known) {
    if (value == k) return value;
  }
  return "";
}

}  // namespace

ShardPlanStatus PlanStatus(const v1::ShardPlan& plan) {
  ShardPlanStatus p;
  p.state_tier = OneOf(plan.state_tier(), {"host", "disk"});
  p.peak_device_bytes = plan.peak_device_bytes();
  p.shard_count = plan.shards_size();
  p.offloaded_bytes = plan.offloaded_bytes();
  p.resident_bytes = plan.resident_bytes();
  for (const auto& s : plan.shards()) {
    p.resident_shards += s.resident() ? 1 : 0;
    if (static_cast<int>(p.shards.size()) == kMaxStatusShards) continue;
    p.shards.push_back({s.first_layer(), s.last_layer(), s.state_bytes(),
                        OneOf(s.activations(), {"stash", "recompute", "offload"})});
  }
  return p;
}

void ApplyTrialReport(const v1::TrialStatus& found, TrialEntry& e) {
  e.state = TrialStateFromName(wire::TrialStateFromProto(found.state()));
  e.step = found.step();
  const auto finite = [](double v) {
    return std::isfinite(v) ? std::optional<double>(v) : std::nullopt;
  };
  e.train_loss = finite(found.train_loss());
  const bool ended = e.state == TrialState::kSucceeded || e.state == TrialState::kEarlyStopped;
  e.validation_loss = finite(ended ? found.final_validation_loss() : found.validation_loss());
  if (found.last_checkpoint_step() >= 0) {
    e.last_checkpoint = CheckpointStatus{found.last_checkpoint_step(), found.checkpoint_dir()};
  }
  if (found.shard_plan().shards_size() > 0) e.shard_plan = PlanStatus(found.shard_plan());
  e.message = Truncated(found.message());
}

void RequeueTrial(const ReconcileContext& ctx, Pass& pass, const std::string& n,
                  const std::string& reason, const std::string& why) {
  TrialEntry& e = pass.entries[n];
  e.LeaveAgent();
  // Stopped early before its agent confirmed: nothing to place again (StopEarly ends it).
  if (e.stop_early) return;
  pass.restarts[reason] += 1;
  e.restarts += 1;
  if (e.restarts > pass.max_restarts) {
    e.state = TrialState::kFailed;
    e.message =
        Truncated(why + "; restarted " + std::to_string(e.restarts) +
                  " times, more than spec.maxRestarts (" + std::to_string(pass.max_restarts) + ")");
    return;
  }
  e.state = TrialState::kPending;
  e.message = Truncated(why);
  ctx.Event(pass.job, "Normal", cond::kEventTrialRequeued, n + ": " + why + "; placing it again");
}

void FollowTrials(const ReconcileContext& ctx, Pass& pass) {
  for (auto& [n, e] : pass.entries) {
    if (!e.OnAgent() || e.Final()) continue;
    auto report = pass.reports.find(e.agent_endpoint);
    if (report == pass.reports.end()) {
      FollowUnreported(ctx, pass, n, e);
      continue;
    }
    // A copy of an older attempt is not ours (it is stopping: the agent refuses to start a
    // newer attempt next to it), unless it finished.
    const v1::TrialStatus* found = FindOurs(pass, report->second, n, e.attempt);
    if (found == nullptr) {
      // The background copy may predate the assignment: ask the agent itself before
      // concluding that it lost the trial.
      auto fresh = ctx.agents->FreshStatus(e.agent_endpoint);
      if (!fresh.ok()) continue;  // unreachable now: the lost-agent rule decides later
      report->second = std::move(fresh).value();
      found = FindOurs(pass, report->second, n, e.attempt);
    }
    if (found != nullptr) pass.found[n] = *found;  // its evaluations, for early stopping
    if (FollowEnded(ctx, pass, n, e, found)) continue;
    ApplyTrialReport(*found, e);
    if (e.Final()) e.stop_early.reset();
    // The agent's notices (a corrupt checkpoint skipped, a resume) become Events once.
    for (int64_t i = e.notices; i < found->warnings_size(); ++i) {
      ctx.Event(pass.job, "Normal", cond::kEventAgentNotice,
                n + " on " + (e.agent.empty() ? e.agent_endpoint : e.agent) + ": " +
                    found->warnings(static_cast<int>(i)));
    }
    e.notices = found->warnings_size();
  }
}

void AdoptOrCancelStale(const ReconcileContext& ctx, Pass& pass) {
  for (const auto& [ep, report] : pass.reports) {
    for (const auto& t : report.trials()) {
      if (t.job() != pass.name || t.namespace_() != pass.ns || t.job_uid() != pass.uid ||
          !pass.entries.count(t.name())) {
        continue;
      }
      if (t.state() != v1::PENDING && t.state() != v1::RUNNING) continue;
      TrialEntry& e = pass.entries[t.name()];
      if (e.agent_endpoint == ep && e.OnAgent()) continue;
      if (!e.OnAgent() && !e.Final() && t.attempt() >= e.attempt) {
        // Assigned by an earlier pass that could not record it (a controller restart between
        // AssignTrial and the status write, or an answer lost to a timeout); a suspended trial
        // (Interrupted) still names the agent it left.
        e.agent = report.node_name();
        e.agent_endpoint = ep;
        e.attempt = t.attempt();
        e.state = TrialStateFromName(wire::TrialStateFromProto(t.state()));
        continue;
      }
      // A copy left on an agent the trial moved away from (a stale agent that came back;
      // fencing already keeps it from writing checkpoints).
      Status s = ctx.agents->Cancel(ep, pass.Ref(t.name()), false);
      ctx.Event(pass.job, "Warning", cond::kEventStaleTrialCancelled,
                t.name() + " was still running on " + report.node_name() + " (attempt " +
                    std::to_string(t.attempt()) + ") after moving to " +
                    (e.agent.empty() ? "?" : e.agent) + ": cancelled there" +
                    (s.ok() ? "" : " (" + s.message() + ")"));
    }
  }
}

}  // namespace hydra::controller
