#include "controller/reconciler/reconciler.h"

#include <cmath>
#include <filesystem>
#include <set>

#include "common/job_json.h"
#include "controller/kube/events.h"
#include "controller/kube/leader_election.h"
#include "controller/reconciler/conditions.h"
#include "proto/trial_proto.h"

namespace hydra::controller {
namespace {

namespace fs = std::filesystem;
namespace cond = conditions;
using kube::Json;
using Clock = std::chrono::steady_clock;

bool HasOurFinalizer(const Json& metadata) {
  for (const auto& f : metadata.value("finalizers", Json::array())) {
    if (f == cond::kFinalizer) return true;
  }
  return false;
}

void SetNumber(Json& j, const char* key, double v) {
  if (std::isfinite(v)) {
    j[key] = v;
  } else {
    j.erase(key);
  }
}

Json PlanJson(const v1::ShardPlan& plan) {
  Json shards = Json::array();
  for (const auto& s : plan.shards()) {
    shards.push_back({{"firstLayer", s.first_layer()},
                      {"lastLayer", s.last_layer()},
                      {"stateBytes", s.state_bytes()},
                      {"activations", s.activations()}});
  }
  return {{"stateTier", plan.state_tier()},
          {"peakDeviceBytes", plan.peak_device_bytes()},
          {"shards", shards}};
}

}  // namespace

CachedPrometheusInventory::CachedPrometheusInventory(std::string prometheus_url,
                                                     std::chrono::milliseconds max_age)
    : prometheus_(std::move(prometheus_url)), max_age_(max_age) {}

StatusOr<std::vector<AgentInventory>> CachedPrometheusInventory::Inventory() {
  std::lock_guard<std::mutex> lock(mu_);
  if (Clock::now() - fetched_at_ > max_age_) {
    cached_ = FetchInventory(prometheus_);
    fetched_at_ = Clock::now();
  }
  return cached_;
}

bool SetCondition(Json& conditions, const std::string& type, bool status, const std::string& reason,
                  const std::string& message, int64_t generation) {
  if (!conditions.is_array()) conditions = Json::array();
  const std::string s = status ? "True" : "False";
  for (auto& c : conditions) {
    if (c.value("type", "") != type) continue;
    const bool flip = c.value("status", "") != s;
    const bool changed = flip || c.value("reason", "") != reason ||
                         c.value("message", "") != message ||
                         c.value("observedGeneration", int64_t{0}) != generation;
    if (flip) c["lastTransitionTime"] = kube::TimeNow();
    c["status"] = s;
    c["reason"] = reason;
    c["message"] = message;
    c["observedGeneration"] = generation;
    return changed;
  }
  conditions.push_back({{"type", type},
                        {"status", s},
                        {"reason", reason},
                        {"message", message},
                        {"observedGeneration", generation},
                        {"lastTransitionTime", kube::TimeNow()}});
  return true;
}

std::string ManifestText(const Json& job) {
  Json m = {{"apiVersion", job.value("apiVersion", "")},
            {"kind", job.value("kind", "")},
            {"metadata",
             {{"name", job["metadata"].value("name", "")},
              {"namespace", job["metadata"].value("namespace", "")}}},
            {"spec", job.value("spec", Json::object())}};
  return m.dump();
}

Reconciler::Reconciler(kube::KubeClient* kube, AgentPoolInterface* agents,
                       InventorySourceInterface* inventory, ReconcilerOptions options)
    : kube_(kube), agents_(agents), inventory_(inventory), options_(std::move(options)) {}

void Reconciler::Event(const Json& job, const std::string& type, const std::string& reason,
                       const std::string& message) {
  // Events are best effort: a failure to record one must not fail the reconcile.
  (void)kube::RecordEvent(*kube_, job, type, reason, message, options_.component);
}

Status Reconciler::Finalize(Json& job) {
  const std::string ns = job["metadata"].value("namespace", "");
  const std::string name = job["metadata"].value("name", "");
  const bool delete_checkpoints = job["spec"].value("checkpointRetention", "Retain") == "Delete";
  int cancelled = 0;
  std::vector<std::string> problems;
  for (const auto& t : job["status"].value("trials", Json::array())) {
    const std::string endpoint = t.value("agentEndpoint", "");
    if (endpoint.empty()) continue;
    if (IsFinalTrialState(t.value("state", "")) && !delete_checkpoints) continue;
    Status s = agents_->Cancel(endpoint, t.value("name", ""), delete_checkpoints);
    if (s.ok()) {
      ++cancelled;
    } else if (s.code() != StatusCode::kNotFound && s.code() != StatusCode::kFailedPrecondition) {
      problems.push_back(s.message());
    }
  }
  if (!problems.empty()) {
    // An unreachable agent must not keep the job forever: its trials die with the node.
    Event(job, "Warning", cond::kEventTrialsCancelled,
          "could not reach every agent: " + problems.front());
  }
  Event(job, "Normal", cond::kEventTrialsCancelled,
        std::to_string(cancelled) + " trials cancelled on their agents" +
            (delete_checkpoints ? ", checkpoints removed" : ", checkpoints kept"));
  auto removed = kube_->UpdateWithRetry(kMultiModelJobs, ns, name, [](Json& o) {
    auto& f = o["metadata"]["finalizers"];
    if (!f.is_array()) return false;
    Json kept = Json::array();
    for (const auto& x : f) {
      if (x != cond::kFinalizer) kept.push_back(x);
    }
    if (kept.size() == f.size()) return false;
    f = kept;
    return true;
  });
  if (!removed.ok() && removed.status().code() != StatusCode::kNotFound) return removed.status();
  return OkStatus();
}

StatusOr<ReconcileResult> Reconciler::Reconcile(const std::string& ns, const std::string& name) {
  ReconcileResult result;
  auto got = kube_->Get(kMultiModelJobs, ns, name);
  if (!got.ok() && got.status().code() == StatusCode::kNotFound) return result;  // gone
  if (!got.ok()) return got.status();
  Json job = std::move(got).value();
  auto& md = job["metadata"];
  const int64_t generation = md.value("generation", int64_t{1});

  if (md.contains("deletionTimestamp")) {
    if (HasOurFinalizer(md)) RETURN_IF_ERROR(Finalize(job));
    return result;
  }
  // The finalizer comes before any state outside the API server (trials on agents).
  if (!HasOurFinalizer(md)) {
    // With the resourceVersion just read; a conflict means someone else wrote: start over.
    md["finalizers"] = md.value("finalizers", Json::array());
    md["finalizers"].push_back(cond::kFinalizer);
    auto added = kube_->Update(kMultiModelJobs, ns, job);
    if (!added.ok()) {
      if (!kube::IsConflict(added.status())) return added.status();
      result.requeue_after = std::chrono::milliseconds(100);
      return result;
    }
    job = std::move(added).value();
  }

  const Json old_status = job.value("status", Json::object());
  Json status = old_status;
  status["observedGeneration"] = generation;
  Json& conds = status["conditions"];
  if (!conds.is_array()) conds = Json::array();

  // The spec as `hydra run` reads it: the same parser, the same rules.
  std::vector<Trial> trials;
  int64_t max_restarts = 10;
  {
    auto parsed = ParseJobYaml(ManifestText(job), options_.data_root);
    if (parsed.ok()) max_restarts = parsed->spec.max_restarts;
    StatusOr<std::vector<Trial>> expanded =
        parsed.ok() ? ExpandTrials(*parsed) : StatusOr<std::vector<Trial>>(parsed.status());
    if (!expanded.ok()) {
      SetCondition(conds, cond::kFailed, true, cond::kInvalidSpec, expanded.status().message(),
                   generation);
      SetCondition(conds, cond::kProgressing, false, cond::kInvalidSpec, "the spec is invalid",
                   generation);
      SetCondition(conds, cond::kReady, false, cond::kInvalidSpec, "the spec is invalid",
                   generation);
      if (status != old_status) {
        Event(job, "Warning", cond::kEventInvalidSpec, expanded.status().message());
        job["status"] = status;
        auto w = kube_->UpdateStatus(kMultiModelJobs, ns, job);
        if (!w.ok() && !kube::IsConflict(w.status())) return w.status();
        if (!w.ok()) result.requeue_after = std::chrono::milliseconds(100);
      }
      return result;
    }
    trials = std::move(expanded).value();
  }

  // Current entries by trial name.
  std::map<std::string, Json> entries;
  for (const auto& t : status.value("trials", Json::array())) entries[t.value("name", "")] = t;
  std::map<std::string, Trial> by_name;
  for (const auto& t : trials) {
    by_name[t.name] = t;
    auto& e = entries[t.name];
    if (e.is_null() || !e.is_object()) {
      e = {{"name", t.name}, {"state", kTrialPending}, {"step", 0}, {"restarts", 0}};
    }
    e["hyperparameters"] = Json::parse(HyperparametersJson(t).dump());
    e["steps"] = t.training.steps;
  }

  // What the agents say about our trials.
  auto inventory = inventory_->Inventory();
  std::vector<std::string> endpoints;
  std::set<std::string> seen;
  if (inventory.ok()) {
    for (const auto& a : *inventory) {
      if (seen.insert(a.endpoint).second) endpoints.push_back(a.endpoint);
    }
  }
  for (const auto& [n, e] : entries) {
    const std::string ep = e.value("agentEndpoint", "");
    if (!ep.empty() && seen.insert(ep).second) endpoints.push_back(ep);
  }
  agents_->Track(endpoints);
  std::string unreachable;
  std::map<std::string, int> load;  // unfinished trials per agent, from the agents themselves
  std::map<std::string, v1::GetStatusResponse> reports;
  for (const auto& ep : endpoints) {
    auto r = agents_->LastStatus(ep);
    if (!r.ok()) continue;
    for (const auto& t : r->trials()) {
      load[ep] += t.state() == v1::PENDING || t.state() == v1::RUNNING;
    }
    reports[ep] = std::move(r).value();
  }
  {
    std::lock_guard<std::mutex> lock(lost_mu_);
    for (const auto& [ep, r] : reports) lost_agents_.erase(ep);
  }
  std::set<std::string> in_inventory;
  if (inventory.ok()) {
    for (const auto& a : *inventory) in_inventory.insert(a.endpoint);
  }
  std::map<std::string, int> restarts;
  auto requeue = [&](const std::string& n, Json& e, const std::string& reason,
                     const std::string& why) {
    restarts[reason] += 1;
    e["restarts"] = e.value("restarts", 0) + 1;
    e.erase("agent");
    e.erase("agentEndpoint");
    if (e["restarts"].get<int64_t>() > max_restarts) {
      e["state"] = kTrialFailed;
      e["message"] = why + "; restarted " + std::to_string(e["restarts"].get<int64_t>()) +
                     " times, more than spec.maxRestarts (" + std::to_string(max_restarts) + ")";
      return;
    }
    e["state"] = kTrialPending;
    e["message"] = why;
    Event(job, "Normal", cond::kEventTrialRequeued, n + ": " + why + "; placing it again");
  };
  for (auto& [n, e] : entries) {
    const std::string ep = e.value("agentEndpoint", "");
    if (ep.empty() || IsFinalTrialState(e.value("state", ""))) continue;
    auto report = reports.find(ep);
    if (report == reports.end()) {
      const double silent = agents_->SecondsSinceContact(ep);
      // Both signals must agree; without an inventory (Prometheus unreachable) nothing is
      // declared lost: the controller's own blip must not move every trial.
      const bool lost = silent * 1000 > static_cast<double>(options_.agent_lost_after.count()) &&
                        inventory.ok() && !in_inventory.count(ep);
      if (lost) {
        {
          std::lock_guard<std::mutex> lock(lost_mu_);
          result.agents_lost += lost_agents_.insert(ep).second;
        }
        requeue(n, e, "agent_lost",
                "agent " + e.value("agent", ep) + " lost (no answer for " +
                    std::to_string(static_cast<int>(silent)) + " s and gone from Prometheus)");
        continue;
      }
      auto why = agents_->LastStatus(ep);
      if (why.status().code() == StatusCode::kUnavailable) {
        unreachable = why.status().message();
        e["message"] = unreachable;
      }
      continue;  // not reached yet, or a blip: keep the last known state
    }
    // A copy of an older attempt is not ours (it is stopping: the agent refuses to start a
    // newer attempt next to it), unless it finished: its results are the trial's results.
    const int64_t attempt = e.value("attempt", int64_t{0});
    auto ours = [&](const v1::TrialStatus& t) {
      return t.name() == n && t.job() == name && t.namespace_() == ns &&
             (t.attempt() >= attempt || t.state() == v1::SUCCEEDED);
    };
    const v1::TrialStatus* found = nullptr;
    for (const auto& t : report->second.trials()) {
      if (ours(t)) found = &t;
    }
    if (found == nullptr) {
      // The background copy may predate the assignment: ask the agent itself before
      // concluding that it lost the trial.
      auto fresh = agents_->FreshStatus(ep);
      if (!fresh.ok()) continue;  // unreachable now: the lost-agent rule decides later
      report->second = std::move(fresh).value();
      for (const auto& t : report->second.trials()) {
        if (ours(t)) found = &t;
      }
    }
    if (found == nullptr || found->state() == v1::INTERRUPTED ||
        (found->state() == v1::CANCELLED && found->attempt() == e.value("attempt", int64_t{0}))) {
      // The agent lost it (restarted), drained it (preemption notice) or had it cancelled
      // under it: place it again; it resumes from its newest checkpoint.
      requeue(n, e,
              found == nullptr                    ? "agent_forgot"
              : found->state() == v1::INTERRUPTED ? "agent_drained"
                                                  : "cancelled",
              found ? std::string(found->state() == v1::INTERRUPTED ? "interrupted on "
                                                                    : "cancelled on ") +
                          e.value("agent", ep) + " at step " + std::to_string(found->step())
                    : "no longer on " + e.value("agent", ep));
      continue;
    }
    const std::string state = wire::TrialStateFromProto(found->state());
    e["state"] = state;
    e["step"] = found->step();
    SetNumber(e, "trainLoss", found->train_loss());
    SetNumber(e, "validationLoss",
              state == kTrialSucceeded ? found->final_validation_loss() : found->validation_loss());
    if (found->last_checkpoint_step() >= 0) {
      e["lastCheckpoint"] = {{"step", found->last_checkpoint_step()},
                             {"path", found->checkpoint_dir()}};
    }
    if (found->shard_plan().shards_size() > 0) e["shardPlan"] = PlanJson(found->shard_plan());
    if (found->message().empty()) {
      e.erase("message");
    } else {
      e["message"] = found->message();
    }
    // The agent's notices (a corrupt checkpoint skipped, a resume) become Events once.
    const int seen = e.value("notices", 0);
    for (int i = seen; i < found->warnings_size(); ++i) {
      Event(job, "Normal", cond::kEventAgentNotice,
            n + " on " + e.value("agent", ep) + ": " + found->warnings(i));
    }
    e["notices"] = found->warnings_size();
  }

  // Trials the agents hold that our entries do not point at: adopt one that an earlier pass
  // assigned but could not record (a controller restart between AssignTrial and the status
  // write), and cancel copies left on an agent the trial moved away from (a stale agent that
  // came back; fencing already keeps it from writing checkpoints).
  for (const auto& [ep, report] : reports) {
    for (const auto& t : report.trials()) {
      if (t.job() != name || t.namespace_() != ns || !entries.count(t.name())) continue;
      if (t.state() != v1::PENDING && t.state() != v1::RUNNING) continue;
      Json& e = entries[t.name()];
      const std::string mine = e.value("agentEndpoint", "");
      if (mine == ep) continue;
      if (mine.empty() && !IsFinalTrialState(e.value("state", "")) &&
          t.attempt() >= e.value("attempt", 0)) {
        e["agent"] = report.node_name();
        e["agentEndpoint"] = ep;
        e["attempt"] = t.attempt();
        e["state"] = wire::TrialStateFromProto(t.state());
        continue;
      }
      Status s = agents_->Cancel(ep, t.name(), false);
      Event(job, "Warning", cond::kEventStaleTrialCancelled,
            t.name() + " was still running on " + report.node_name() + " (attempt " +
                std::to_string(t.attempt()) + ") after moving to " + e.value("agent", "?") +
                ": cancelled there" + (s.ok() ? "" : " (" + s.message() + ")"));
    }
  }

  // Place what waits, longest remaining first, onto the agents with the most free capacity.
  std::vector<TrialToPlace> waiting;
  for (auto& [n, e] : entries) {
    if (!by_name.count(n)) continue;
    if (e.value("state", "") == kTrialPending && e.value("agentEndpoint", "").empty()) {
      waiting.push_back({by_name[n], EstimatedRemainingSeconds(by_name[n], e.value("step", 0))});
    }
  }
  std::map<std::string, std::string> no_room;
  std::vector<std::string> assigned_now;
  if (!waiting.empty() && inventory.ok()) {
    for (const auto& p : PlaceTrials(waiting, *inventory, &load, &no_room)) {
      const Trial& t = by_name[p.trial];
      v1::AssignTrialRequest req;
      wire::TrialToProto(t, name, ns, req.mutable_trial());
      wire::ShardPlanToProto(p.plan, req.mutable_shard_plan());
      req.set_checkpoint_dir(
          (fs::path(options_.checkpoint_root) / ns / name / t.name).lexically_normal().string());
      req.set_resume_from_step(0);  // the newest intact checkpoint, if an earlier run left one
      auto& entry = entries[p.trial];
      req.set_attempt(entry.value("restarts", int64_t{0}) + 1);  // the fencing token
      v1::AssignTrialResponse resp;
      Status s = agents_->Assign(p.endpoint, req, &resp);
      auto& e = entries[p.trial];
      if (s.ok() || s.code() == StatusCode::kAlreadyExists) {
        // ALREADY_EXISTS: assigned by an earlier pass whose status write was lost.
        e["agent"] = p.node;
        e["agentEndpoint"] = p.endpoint;
        e["attempt"] = req.attempt();
        e["shardPlan"] = PlanJson(*req.mutable_shard_plan());
        e.erase("message");
        ++result.assigned;
        assigned_now.push_back(p.trial + " to " + p.node + " (" +
                               std::to_string(p.plan.shards.size()) + " shard" +
                               (p.plan.shards.size() == 1 ? "" : "s") + ")");
      } else {
        e["message"] = s.message();
        no_room[p.trial] = s.message();
      }
    }
  } else if (!waiting.empty()) {
    for (const auto& w : waiting) no_room[w.trial.name] = inventory.status().message();
  }
  if (!assigned_now.empty()) {
    // One Event per pass, not per trial: a 100-trial job would otherwise cost 100 requests.
    std::string text;
    for (const auto& a : assigned_now) text += (text.empty() ? "" : ", ") + a;
    Event(job, "Normal", cond::kEventTrialAssigned, "assigned " + text);
  }
  for (const auto& [n, why] : no_room) entries[n]["message"] = "waiting for an agent: " + why;

  // Counts, best trial, conditions, times.
  std::map<std::string, std::string> old_states;  // as last written, for transition Events
  for (const auto& o : old_status.value("trials", Json::array())) {
    old_states[o.value("name", "")] = o.value("state", "");
  }
  Json list = Json::array();
  int pending = 0, running = 0, succeeded = 0, failed = 0;
  std::string best;
  double best_loss = INFINITY;
  for (const auto& t : trials) {  // grid order
    Json& e = entries[t.name];
    const std::string state = e.value("state", kTrialPending);
    pending += state == kTrialPending || state == kTrialInterrupted;
    running += state == kTrialRunning;
    succeeded += state == kTrialSucceeded;
    failed += state == kTrialFailed || state == kTrialCancelled;
    result.trials_by_state[state] += 1;
    if (state == kTrialSucceeded && e.contains("validationLoss") &&
        e["validationLoss"].get<double>() < best_loss) {
      best_loss = e["validationLoss"].get<double>();
      best = t.name;
    }
    // Events on state changes since the last written status.
    const std::string before = old_states.count(t.name) ? old_states[t.name] : "";
    if (before != state && state == kTrialSucceeded) {
      Event(job, "Normal", cond::kEventTrialSucceeded,
            t.name + " succeeded; validation loss " +
                (e.contains("validationLoss") ? std::to_string(e["validationLoss"].get<double>())
                                              : std::string("n/a")));
    } else if (before != state && (state == kTrialFailed || state == kTrialCancelled)) {
      Event(job, "Warning", cond::kEventTrialFailed,
            t.name + " " + state + ": " + e.value("message", ""));
    }
    list.push_back(e);
  }
  const int total = static_cast<int>(trials.size());
  status["trials"] = list;
  status["trialCount"] = total;
  status["pending"] = pending;
  status["running"] = running;
  status["succeeded"] = succeeded;
  status["failed"] = failed;
  if (!best.empty()) {
    status["bestTrial"] = {{"name", best},
                           {"validationLoss", best_loss},
                           {"hyperparameters", entries[best]["hyperparameters"]}};
  }
  if (!status.contains("startTime") && (running + succeeded + failed > 0 || result.assigned > 0)) {
    status["startTime"] = kube::TimeNow();
  }
  const bool all_final = succeeded + failed == total;
  const bool was_final = old_status.contains("completionTime");
  if (all_final && !was_final) status["completionTime"] = kube::TimeNow();
  int unplaced = 0;
  for (const auto& [n, e] : entries) {
    unplaced += by_name.count(n) && !IsFinalTrialState(e.value("state", "")) &&
                e.value("agentEndpoint", "").empty();
  }
  SetCondition(conds, cond::kProgressing, !all_final,
               all_final ? cond::kFinished : cond::kTrialsTraining,
               std::to_string(running) + " running, " + std::to_string(pending) + " pending, " +
                   std::to_string(succeeded) + " succeeded, " + std::to_string(failed) +
                   " failed of " + std::to_string(total),
               generation);
  SetCondition(conds, cond::kReady, unplaced == 0,
               unplaced == 0 ? cond::kTrialsPlaced : cond::kWaitingForCapacity,
               unplaced == 0 ? "every unfinished trial has an agent"
                             : std::to_string(unplaced) + " trials wait for an agent",
               generation);
  SetCondition(conds, cond::kComplete, succeeded == total,
               succeeded == total ? cond::kAllTrialsSucceeded : cond::kTrialsTraining,
               std::to_string(succeeded) + " of " + std::to_string(total) + " trials succeeded",
               generation);
  SetCondition(
      conds, cond::kFailed, all_final && failed > 0,
      failed > 0 ? cond::kTrialsFailed : cond::kAsExpected,
      failed > 0 ? std::to_string(failed) + " trials failed or were cancelled" : "no trial failed",
      generation);
  const std::string degraded_reason = !unreachable.empty() ? cond::kAgentUnreachable
                                      : !inventory.ok()    ? cond::kInventoryUnavailable
                                      : !no_room.empty()   ? cond::kWaitingForCapacity
                                                           : cond::kAsExpected;
  const std::string degraded_message = !unreachable.empty() ? unreachable
                                       : !inventory.ok()    ? inventory.status().message()
                                       : !no_room.empty()
                                           ? no_room.begin()->first + ": " + no_room.begin()->second
                                           : "as expected";
  SetCondition(conds, cond::kDegraded, degraded_reason != cond::kAsExpected, degraded_reason,
               degraded_message, generation);
  if (all_final && !was_final) {
    if (failed == 0) {
      Event(job, "Normal", cond::kEventJobComplete,
            "all " + std::to_string(total) + " trials succeeded; best " + best);
    } else {
      Event(job, "Warning", cond::kEventJobFailed,
            std::to_string(failed) + " of " + std::to_string(total) + " trials failed");
    }
  }

  if (status != old_status) {
    job["status"] = status;
    // Optimistic concurrency: the resourceVersion we read must still be current.
    auto w = kube_->UpdateStatus(kMultiModelJobs, ns, job);
    if (!w.ok()) {
      if (!kube::IsConflict(w.status())) return w.status();
      result.requeue_after = std::chrono::milliseconds(100);  // re-read and recompute
      return result;
    }
  }
  result.restarts_by_reason = std::move(restarts);
  if (!all_final) result.requeue_after = options_.progress_resync;
  return result;
}

}  // namespace hydra::controller
