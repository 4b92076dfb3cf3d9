// PlaceWaitingTrials: waiting trials onto the job's agents (the shared pool's or its own pods').
#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "controller/reconciler/conditions.h"
#include "controller/reconciler/early_stopping_pass.h"
#include "controller/reconciler/phases.h"
#include "proto/trial_proto.h"

namespace hydra::controller {
namespace {

namespace fs = std::filesystem;
namespace cond = conditions;

/// Why the agent's own GetStatus does not confirm what Prometheus says of it (its node and
/// every device with its total memory); empty when it does.
std::string ConfirmationProblem(const AgentInventory& a, const v1::GetStatusResponse& r) {
  if (r.node_name() != a.node) {
    return "it answers as node '" + r.node_name() + "', Prometheus says '" + a.node + "'";
  }
  for (const auto& d : a.devices) {
    bool match = false;
    for (const auto& rd : r.devices())
      match = match || (rd.name() == d.name && rd.memory_total_bytes() == d.total_bytes);
    if (!match) {
      return "it does not report device " + d.name + " with " + std::to_string(d.total_bytes) +
             " bytes, as Prometheus does";
    }
  }
  return "";
}

/// Refusals no other agent or capacity fixes: the spec or the storage must change (a missing
/// dataset, a path outside the roots, a spec the agent finds invalid).
bool IsRejection(const Status& s) {
  return s.code() == StatusCode::kNotFound || s.code() == StatusCode::kPermissionDenied ||
         s.code() == StatusCode::kInvalidArgument;
}

/// The inventory's agents whose own GetStatus confirms the node and devices they claim (and,
/// for the job's own pods, not being removed by this pass).
std::vector<AgentInventory> ConfirmedAgents(const ReconcileContext& ctx, const Pass& pass) {
  std::vector<AgentInventory> out;
  for (AgentInventory a : *pass.inventory) {
    if (pass.own_agents && pass.pods.AtEndpoint(a.endpoint) == nullptr) continue;
    auto report = pass.reports.find(a.endpoint);
    const std::string problem = report == pass.reports.end()
                                    ? "has not answered GetStatus yet"
                                    : ConfirmationProblem(a, report->second);
    std::lock_guard<std::mutex> lock(ctx.memory->mu);
    if (problem.empty()) {
      // The agent's own numbers are fresher than a scrape.
      for (auto& d : a.devices) {
        for (const auto& r : report->second.devices()) {
          if (r.name() == d.name) d.free_bytes = std::min(d.free_bytes, r.memory_free_bytes());
        }
      }
      ctx.memory->unconfirmed_logged.erase(a.endpoint);
      out.push_back(std::move(a));
      continue;
    }
    if (report != pass.reports.end() && ctx.memory->unconfirmed_logged.insert(a.endpoint).second) {
      std::fprintf(stderr, "hydra-controller: not using agent %s at %s: %s\n", a.node.c_str(),
                   a.endpoint.c_str(), problem.c_str());
    }
  }
  return out;
}

/// Why placement waits this pass: an agent of the shared pool was just seen and its first
/// answer is still to be expected (FirstAnswerDue, bounded by the pool). Without the wait,
/// every trial would go to the agents that happened to answer first. Empty when none is
/// awaited. A job's own pods are waited for otherwise: a trial per device while any is not
/// serving (PlaceWaitingTrials).
std::string AwaitedAgent(const Pass& pass) {
  if (pass.own_agents) return "";
  for (const AgentInventory& a : *pass.inventory) {
    if (pass.first_answer_due.count(a.endpoint)) {
      return "waiting for the first answer of agent " + a.node + " at " + a.endpoint +
             ", just seen";
    }
  }
  return "";
}

/// Why trials of a job with its own agents wait when none serves: the pods' states.
std::string WaitingForPods(const Pass& pass) {
  std::map<std::string, int> by_phase;
  std::string detail;
  for (const auto* p : pass.pods.Live()) {
    by_phase[AgentPodPhaseName(p->phase)] += 1;
    if (detail.empty() && !p->reason.empty()) detail = p->name + ": " + p->reason;
  }
  if (by_phase.empty()) {
    return pass.pods.problem.empty() ? "no agent pod yet" : pass.pods.problem;
  }
  std::string text = "the job's agent pods are ";
  bool first = true;
  for (const auto& [phase, n] : by_phase) {
    text += (first ? "" : ", ") + std::to_string(n) + " " + phase;
    first = false;
  }
  return text + (detail.empty() ? "" : " (" + detail + ")");
}

/// Trials per agent: what its (polled) report says, or what the entries have assigned there,
/// whichever is more (the report may not show an assignment of a moment ago).
void CountAssigned(Pass& pass) {
  std::map<std::string, int> assigned;
  for (const auto& [n, e] : pass.entries) {
    if (e.OnAgent() && !e.Final()) assigned[e.agent_endpoint] += 1;
  }
  for (const auto& [ep, n] : assigned) pass.load[ep] = std::max(pass.load[ep], n);
}

std::vector<TrialToPlace> WaitingTrials(const Pass& pass) {
  std::vector<TrialToPlace> waiting;
  for (const auto& [n, e] : pass.entries) {
    if (!pass.by_name.count(n)) continue;
    // Interrupted: suspended (spec.suspend), now resumed.
    if (!e.OnAgent() && !e.stop_early &&
        (e.state == TrialState::kPending || e.state == TrialState::kInterrupted)) {
      const Trial& t = pass.by_name.at(n);
      waiting.push_back({t, EstimatedRemainingSeconds(t, e.step)});
    }
  }
  return waiting;
}

v1::AssignTrialRequest Assignment(const ReconcileContext& ctx, const Pass& pass, const Placement& p,
                                  const TrialEntry& e) {
  v1::AssignTrialRequest req;
  const Trial& trial = pass.by_name.at(p.trial);
  wire::TrialToProto(trial, req.mutable_trial());
  // The agent plans for its own devices at its measured rates; only a manifest's
  // shardBoundaries bind it, and they reach it as the controller's plan.
  if (!trial.resources.shard_boundaries.empty()) {
    wire::ShardPlanToProto(p.plan, req.mutable_shard_plan());
  }
  req.set_checkpoint_dir((fs::path(ctx.options->checkpoint_root) / pass.ns / pass.name / p.trial)
                             .lexically_normal()
                             .string());
  req.set_resume_from_step(0);  // the newest intact checkpoint, if an earlier run left one
  req.set_attempt(e.attempt);
  req.set_step_limit(WantedStepLimit(e));
  return req;
}

/// Calls the agent of each placement; records what it answered. The assigned, for the Event.
std::vector<std::string> Assign(const ReconcileContext& ctx, Pass& pass,
                                const std::vector<Placement>& placements) {
  std::vector<std::string> assigned;
  for (const auto& p : placements) {
    TrialEntry& e = pass.entries[p.trial];
    v1::AssignTrialRequest req = Assignment(ctx, pass, p, e);
    v1::AssignTrialResponse resp;
    Status s = ctx.agents->Assign(p.endpoint, req, &resp);
    if (s.ok() || s.code() == StatusCode::kAlreadyExists) {
      // ALREADY_EXISTS: this very attempt is already there (an earlier call's answer was lost).
      e.agent = p.node;
      e.agent_endpoint = p.endpoint;
      e.state = TrialState::kPending;  // queued there (a resumed suspension was Interrupted)
      // The plan the agent made, as it answered (ALREADY_EXISTS answers nothing: the one sent,
      // if any, until the agent's next report).
      const v1::ShardPlan& made = resp.trial().shard_plan().shards_size() > 0
                                      ? resp.trial().shard_plan()
                                      : req.shard_plan();
      e.shard_plan =
          made.shards_size() > 0 ? std::optional<ShardPlanStatus>(PlanStatus(made)) : std::nullopt;
      e.message.clear();
      ++pass.result.assigned;
      assigned.push_back(p.trial + " to " + p.node + " (" + std::to_string(p.plan.shards.size()) +
                         " shard" + (p.plan.shards.size() == 1 ? "" : "s") + ")");
      continue;
    }
    if (IsRejection(s)) {
      // No other agent or more capacity fixes this: say so once per distinct problem.
      if (e.message != Truncated(s.message())) {
        ctx.Event(pass.job, "Warning", cond::kEventTrialRejected, p.trial + ": " + s.message());
      }
      pass.rejected[p.trial] = s.message();
    } else {
      pass.no_room[p.trial] = s.message();
    }
    e.message = Truncated(s.message());
  }
  return assigned;
}

}  // namespace

StatusOr<bool> PlaceWaitingTrials(const ReconcileContext& ctx, Pass& pass) {
  if (pass.suspend) return true;
  std::vector<TrialToPlace> waiting = WaitingTrials(pass);
  if (waiting.empty()) return true;
  if (!pass.inventory.ok()) {
    for (const auto& w : waiting) pass.no_room[w.trial.name] = pass.inventory.status().message();
    return true;
  }
  if (const std::string why = AwaitedAgent(pass); !why.empty()) {
    for (const auto& w : waiting) pass.no_room[w.trial.name] = why;
    return true;
  }
  const auto agents = ConfirmedAgents(ctx, pass);
  CountAssigned(pass);
  if (agents.empty() && (pass.own_agents || !pass.inventory->empty())) {
    const std::string why =
        pass.own_agents
            ? WaitingForPods(pass)
            : "no agent has confirmed over gRPC the node and devices Prometheus reports for it";
    for (const auto& w : waiting) pass.no_room[w.trial.name] = why;
    return true;
  }
  // A job's own agents take a trial per device while any pod it wants is not serving yet
  // (waiting for a node, for Kueue's quota, starting, or Ready with an agent that has not
  // answered): the pods made for the other trials would otherwise come up idle, and with the
  // quota of one pod the job trains there a trial at a time. Trials share a device only when
  // every pod the job may have serves (maxAgents).
  bool pods_coming = static_cast<int>(agents.size()) < pass.pods.desired;
  for (const auto* p : pass.pods.Live()) {
    pods_coming = pods_coming || p->phase != AgentPodPhase::kReady;
  }
  pods_coming = pass.own_agents && pods_coming;
  const auto placements = PlaceTrials(waiting, agents, &pass.load, &pass.no_room, pods_coming);
  if (placements.empty()) return true;
  // Every placement gets a new attempt (the fencing token), stored before any agent is called:
  // an assignment whose answer is lost (a timeout) used a number no later placement reuses.
  for (const auto& p : placements) {
    TrialEntry& e = pass.entries[p.trial];
    e.attempt = std::max(e.attempt, e.restarts) + 1;
  }
  ASSIGN_OR_RETURN(bool reserved, WriteStatus(ctx, pass));
  if (!reserved) return false;
  const std::vector<std::string> assigned = Assign(ctx, pass, placements);
  if (!assigned.empty()) {
    // One Event per pass, not per trial: a 100-trial job would otherwise cost 100 requests.
    std::string text;
    for (const auto& a : assigned) text += (text.empty() ? "" : ", ") + a;
    ctx.Event(pass.job, "Normal", cond::kEventTrialAssigned, "assigned " + text);
  }
  return true;
}

}  // namespace hydra::controller
