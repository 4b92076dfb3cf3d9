#include "controller/reconciler/reconciler.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <set>

#include "common/job_json.h"
#include "controller/kube/events.h"
#include "controller/kube/leader_election.h"
#include "controller/reconciler/conditions.h"
#include "controller/reconciler/early_stopping_pass.h"
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

/// A message cut to kMaxStatusMessageBytes (at a UTF-8 character boundary).
std::string Truncated(const std::string& message) {
  if (message.size() <= kMaxStatusMessageBytes) return message;
  size_t end = kMaxStatusMessageBytes - 3;
  while (end > 0 && (static_cast<unsigned char>(message[end]) & 0xC0) == 0x80) --end;
  return message.substr(0, end) + "...";
}

/// A loss for people: 4 significant digits ("3.322"), for the printer column.
std::string ForReading(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.4g", v);
  return buf;
}

/// A shard plan as status shows it: the totals and at most kMaxStatusShards shards.
Json PlanJson(const v1::ShardPlan& plan) {
  Json shards = Json::array();
  for (const auto& s : plan.shards()) {
    if (static_cast<int>(shards.size()) == kMaxStatusShards) break;
    shards.push_back({{"firstLayer", s.first_layer()},
                      {"lastLayer", s.last_layer()},
                      {"stateBytes", s.state_bytes()},
                      {"activations", s.activations()}});
  }
  return {{"stateTier", plan.state_tier()},
          {"peakDeviceBytes", plan.peak_device_bytes()},
          {"shardCount", plan.shards_size()},
          {"shards", shards}};
}

}  // namespace

bool OnAgent(const Json& e) {
  return !e.value("agentEndpoint", "").empty() && e.value("state", "") != kTrialInterrupted;
}

void ApplyTrialReport(const v1::TrialStatus& found, Json& e) {
  const std::string state = wire::TrialStateFromProto(found.state());
  e["state"] = state;
  e["step"] = found.step();
  SetNumber(e, "trainLoss", found.train_loss());
  const bool ended = state == kTrialSucceeded || state == kTrialEarlyStopped;
  SetNumber(e, "validationLoss", ended ? found.final_validation_loss() : found.validation_loss());
  if (found.last_checkpoint_step() >= 0) {
    e["lastCheckpoint"] = {{"step", found.last_checkpoint_step()},
                           {"path", found.checkpoint_dir()}};
  }
  if (found.shard_plan().shards_size() > 0) e["shardPlan"] = PlanJson(found.shard_plan());
  if (found.message().empty()) {
    e.erase("message");
  } else {
    e["message"] = Truncated(found.message());
  }
}

namespace {

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

struct TrialCounts {
  bool suspended = false;  ///< spec.suspend
  int pending = 0, running = 0, succeeded = 0, failed = 0, early_stopped = 0, unplaced = 0,
      total = 0;
  /// Every trial ended: succeeded, stopped early, failed or cancelled.
  bool AllFinal() const { return succeeded + early_stopped + failed == total; }
  /// Every trial ended well: succeeded, or stopped early by the job's own early stopping.
  bool Complete() const { return succeeded + early_stopped == total; }
};

void SetProgressingAndReady(Json& conds, int64_t generation, const TrialCounts& c,
                            const std::map<std::string, std::string>& rejected) {
  const bool all_final = c.AllFinal();
  SetCondition(conds, cond::kProgressing, !all_final,
               all_final ? cond::kFinished : cond::kTrialsTraining,
               std::to_string(c.running) + " running, " + std::to_string(c.pending) + " pending, " +
                   std::to_string(c.succeeded) + " succeeded, " +
                   (c.early_stopped > 0 ? std::to_string(c.early_stopped) + " stopped early, "
                                        : std::string()) +
                   std::to_string(c.failed) + " failed of " + std::to_string(c.total),
               generation);
  const char* waiting_reason = rejected.empty() ? cond::kWaitingForCapacity : cond::kTrialRejected;
  SetCondition(
      conds, cond::kReady, c.unplaced == 0, c.unplaced == 0 ? cond::kTrialsPlaced : waiting_reason,
      c.unplaced == 0 ? "every unfinished trial has an agent"
      : rejected.empty()
          ? std::to_string(c.unplaced) + " trials wait for an agent"
          : Truncated(rejected.begin()->first + " cannot start: " + rejected.begin()->second),
      generation);
}

void SetJobConditions(Json& conds, int64_t generation, const TrialCounts& c,
                      const std::string& unreachable, const Status& inventory,
                      const std::map<std::string, std::string>& no_room,
                      const std::map<std::string, std::string>& rejected) {
  const bool all_final = c.AllFinal();
  if (c.suspended && !all_final) {
    const std::string why = "spec.suspend is true: " + std::to_string(c.running) +
                            " trials still stopping, " + std::to_string(c.pending) +
                            " checkpointed or never started, waiting";
    SetCondition(conds, cond::kProgressing, false, cond::kSuspended, why, generation);
    SetCondition(conds, cond::kReady, false, cond::kSuspended, why, generation);
  } else {
    SetProgressingAndReady(conds, generation, c, rejected);
  }
  SetCondition(conds, cond::kComplete, c.Complete(),
               c.Complete()  ? cond::kAllTrialsSucceeded
               : c.suspended ? cond::kSuspended
                             : cond::kTrialsTraining,
               std::to_string(c.succeeded) + " of " + std::to_string(c.total) +
                   " trials succeeded" +
                   (c.early_stopped > 0 ? ", " + std::to_string(c.early_stopped) + " stopped early"
                                        : std::string()),
               generation);
  SetCondition(conds, cond::kFailed, all_final && c.failed > 0,
               c.failed > 0 ? cond::kTrialsFailed : cond::kAsExpected,
               c.failed > 0 ? std::to_string(c.failed) + " trials failed or were cancelled"
                            : "no trial failed",
               generation);
  std::string reason = cond::kAsExpected, message = "as expected";
  if (!rejected.empty()) {
    reason = cond::kTrialRejected;
    message = rejected.begin()->first + ": " + rejected.begin()->second;
  } else if (!unreachable.empty()) {
    reason = cond::kAgentUnreachable;
    message = unreachable;
  } else if (!inventory.ok()) {
    reason = cond::kInventoryUnavailable;
    message = inventory.message();
  } else if (!no_room.empty()) {
    reason = cond::kWaitingForCapacity;
    message = no_room.begin()->first + ": " + no_room.begin()->second;
  }
  SetCondition(conds, cond::kDegraded, reason != cond::kAsExpected, reason, Truncated(message),
               generation);
}

}  // namespace

CachedPrometheusInventory::CachedPrometheusInventory(std::string prometheus_url,
                                                     std::string agent_scrape_job,
                                                     std::chrono::milliseconds max_age)
    : prometheus_(std::move(prometheus_url)),
      agent_scrape_job_(std::move(agent_scrape_job)),
      max_age_(max_age) {}

StatusOr<std::vector<AgentInventory>> CachedPrometheusInventory::Inventory() {
  std::lock_guard<std::mutex> lock(mu_);
  if (Clock::now() - fetched_at_ > max_age_) {
    cached_ = FetchInventory(prometheus_, agent_scrape_job_);
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
  Json metadata = {{"name", job["metadata"].value("name", "")}};
  for (const char* key : {"namespace", "uid"}) {
    if (const std::string v = job["metadata"].value(key, ""); !v.empty()) metadata[key] = v;
  }
  Json m = {{"apiVersion", job.value("apiVersion", "")},
            {"kind", job.value("kind", "")},
            {"metadata", metadata},
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
    // Exactly this job's trial: same namespace, job, uid and name (another job of the same
    // name, in this namespace or another, is never touched).
    v1::TrialRef ref;
    ref.set_namespace_(ns);
    ref.set_job(name);
    ref.set_job_uid(job["metadata"].value("uid", ""));
    ref.set_name(t.value("name", ""));
    Status s = agents_->Cancel(endpoint, ref, delete_checkpoints);
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

/// The state of one reconcile pass over one job.
struct Reconciler::Pass {
  std::string ns, name, uid;
  int64_t generation = 1;
  Json job;          ///< as read; its resourceVersion is what the status write must match
  Json read_status;  ///< as read: transitions (Events) are against it
  Json old_status;   ///< as last stored: a write happens only when `status` differs
  Json status;
  bool wrote = false;         ///< a status write of this pass landed
  std::vector<Trial> trials;  ///< grid order
  std::map<std::string, Trial> by_name;
  std::map<std::string, Json> entries;  ///< status.trials by trial name
  int64_t max_restarts = 10;
  EarlyStoppingSpec early_stopping;
  bool suspend = false;                ///< spec.suspend
  std::vector<std::string> suspended;  ///< trials this pass found checkpointed and stopped
  /// Each followed trial's report from its agent this pass.
  std::map<std::string, v1::TrialStatus> found;
  StatusOr<std::vector<AgentInventory>> inventory = UnavailableError("not read");
  std::set<std::string> in_inventory;
  std::vector<std::string> endpoints;
  std::map<std::string, v1::GetStatusResponse> reports;
  std::map<std::string, int> load;  ///< unfinished trials per agent, from the agents
  std::string unreachable;
  std::map<std::string, std::string> no_room, rejected;
  std::map<std::string, int> restarts;
  bool all_final = false;  ///< every trial succeeded, failed or was cancelled
  ReconcileResult result;

  /// Whether a trial status an agent reports is this job's trial `n` (of attempt `attempt` or
  /// newer; a finished or early-stopped copy of any attempt counts: its results are the
  /// trial's).
  bool Ours(const v1::TrialStatus& t, const std::string& n, int64_t attempt) const {
    return t.name() == n && t.job() == name && t.namespace_() == ns && t.job_uid() == uid &&
           (t.attempt() >= attempt || t.state() == v1::SUCCEEDED || t.state() == v1::EARLY_STOPPED);
  }
  /// This job's identity for agents.
  v1::TrialRef Ref(const std::string& trial) const {
    v1::TrialRef ref;
    ref.set_namespace_(ns);
    ref.set_job(name);
    ref.set_job_uid(uid);
    ref.set_name(trial);
    return ref;
  }
};

StatusOr<ReconcileResult> Reconciler::Reconcile(const std::string& ns, const std::string& name) {
  Pass pass;
  auto got = kube_->Get(kMultiModelJobs, ns, name);
  if (!got.ok() && got.status().code() == StatusCode::kNotFound) return pass.result;  // gone
  if (!got.ok()) return got.status();
  pass.job = std::move(got).value();
  auto& md = pass.job["metadata"];
  if (md.contains("deletionTimestamp")) {
    if (HasOurFinalizer(md)) RETURN_IF_ERROR(Finalize(pass.job));
    return pass.result;
  }
  // The finalizer comes before any state outside the API server (trials on agents).
  if (!HasOurFinalizer(md)) {
    // With the resourceVersion just read; a conflict means someone else wrote: start over.
    md["finalizers"] = md.value("finalizers", Json::array());
    md["finalizers"].push_back(cond::kFinalizer);
    auto added = kube_->Update(kMultiModelJobs, ns, pass.job);
    if (!added.ok()) {
      if (!kube::IsConflict(added.status())) return added.status();
      pass.result.requeue_after = std::chrono::milliseconds(100);
      return pass.result;
    }
    pass.job = std::move(added).value();
  }
  pass.ns = ns;
  pass.name = name;
  pass.uid = pass.job["metadata"].value("uid", "");
  pass.generation = pass.job["metadata"].value("generation", int64_t{1});
  pass.read_status = pass.job.value("status", Json::object());
  pass.old_status = pass.read_status;
  pass.status = pass.read_status;
  pass.status["observedGeneration"] = pass.generation;
  if (!pass.status["conditions"].is_array()) pass.status["conditions"] = Json::array();

  ASSIGN_OR_RETURN(bool valid, LoadTrials(pass));
  if (!valid) return pass.result;
  ReadAgents(pass);
  FollowTrials(pass);
  AdoptOrCancelStale(pass);
  StopEarly(pass);
  ASSIGN_OR_RETURN(bool written, PlaceWaiting(pass));
  if (written) {
    Summarize(pass);
    ASSIGN_OR_RETURN(written, WriteStatus(pass));
  }
  // Decisions reach the agents only once the status holding them is stored.
  if (written) TellAgents(pass);
  // Restarts count once they are stored, so that a retried pass does not count them again.
  if (pass.wrote) pass.result.restarts_by_reason = std::move(pass.restarts);
  if (!written) {
    pass.result.requeue_after = std::chrono::milliseconds(100);  // re-read and recompute
    return pass.result;
  }
  if (!pass.all_final) pass.result.requeue_after = options_.progress_resync;
  return pass.result;
}

StatusOr<bool> Reconciler::LoadTrials(Pass& pass) {
  auto parsed = ParseJobYaml(ManifestText(pass.job), options_.data_root);
  if (parsed.ok()) {
    pass.max_restarts = parsed->spec.max_restarts;
    pass.early_stopping = parsed->spec.early_stopping;
    pass.suspend = parsed->spec.suspend;
  }
  StatusOr<std::vector<Trial>> expanded =
      parsed.ok() ? ExpandTrials(*parsed) : StatusOr<std::vector<Trial>>(parsed.status());
  if (expanded.ok()) {
    pass.trials = std::move(expanded).value();
    for (const auto& t : pass.status.value("trials", Json::array())) {
      pass.entries[t.value("name", "")] = t;
    }
    for (const auto& t : pass.trials) {
      pass.by_name[t.name] = t;
      Json& e = pass.entries[t.name];
      if (e.is_null() || !e.is_object()) {
        e = {{"name", t.name}, {"state", kTrialPending}, {"step", 0}, {"restarts", 0}};
      }
      e["hyperparameters"] = Json::parse(HyperparametersJson(t).dump());
      e["steps"] = t.training.steps;
    }
    return true;
  }
  Json& conds = pass.status["conditions"];
  const std::string why = Truncated(expanded.status().message());
  SetCondition(conds, cond::kFailed, true, cond::kInvalidSpec, why, pass.generation);
  SetCondition(conds, cond::kProgressing, false, cond::kInvalidSpec, "the spec is invalid",
               pass.generation);
  SetCondition(conds, cond::kReady, false, cond::kInvalidSpec, "the spec is invalid",
               pass.generation);
  if (pass.status != pass.old_status) {
    Event(pass.job, "Warning", cond::kEventInvalidSpec, why);
    pass.job["status"] = pass.status;
    auto w = kube_->UpdateStatus(kMultiModelJobs, pass.ns, pass.job);
    if (!w.ok() && !kube::IsConflict(w.status())) return w.status();
    if (!w.ok()) pass.result.requeue_after = std::chrono::milliseconds(100);
  }
  return false;
}

void Reconciler::ReadAgents(Pass& pass) {
  pass.inventory = inventory_->Inventory();
  std::set<std::string> seen;
  if (pass.inventory.ok()) {
    for (const auto& a : *pass.inventory) {
      pass.in_inventory.insert(a.endpoint);
      if (seen.insert(a.endpoint).second) pass.endpoints.push_back(a.endpoint);
    }
  }
  for (const auto& [n, e] : pass.entries) {
    const std::string ep = e.value("agentEndpoint", "");
    if (!ep.empty() && seen.insert(ep).second) pass.endpoints.push_back(ep);
  }
  agents_->Track(pass.endpoints);
  for (const auto& ep : pass.endpoints) {
    auto r = agents_->LastStatus(ep);
    if (!r.ok()) continue;
    for (const auto& t : r->trials()) {
      pass.load[ep] += t.state() == v1::PENDING || t.state() == v1::RUNNING;
    }
    pass.reports[ep] = std::move(r).value();
  }
  std::lock_guard<std::mutex> lock(lost_mu_);
  for (const auto& [ep, r] : pass.reports) lost_agents_.erase(ep);
}

void Reconciler::Requeue(Pass& pass, const std::string& n, Json& e, const std::string& reason,
                         const std::string& why) {
  if (e.contains("stopEarly")) {
    // Stopped early before its agent confirmed: nothing to place again (StopEarly ends it).
    e.erase("agent");
    e.erase("agentEndpoint");
    return;
  }
  pass.restarts[reason] += 1;
  e["restarts"] = e.value("restarts", 0) + 1;
  e.erase("agent");
  e.erase("agentEndpoint");
  if (e["restarts"].get<int64_t>() > pass.max_restarts) {
    e["state"] = kTrialFailed;
    e["message"] =
        Truncated(why + "; restarted " + std::to_string(e["restarts"].get<int64_t>()) +
                  " times, more than spec.maxRestarts (" + std::to_string(pass.max_restarts) + ")");
    return;
  }
  e["state"] = kTrialPending;
  e["message"] = Truncated(why);
  Event(pass.job, "Normal", cond::kEventTrialRequeued, n + ": " + why + "; placing it again");
}

void Reconciler::FollowTrials(Pass& pass) {
  for (auto& [n, e] : pass.entries) {
    const std::string ep = e.value("agentEndpoint", "");
    if (!OnAgent(e) || IsFinalTrialState(e.value("state", ""))) continue;
    auto report = pass.reports.find(ep);
    if (report == pass.reports.end()) {
      const double silent = agents_->SecondsSinceContact(ep);
      // Both signals must agree; without an inventory (Prometheus unreachable) nothing is
      // declared lost: the controller's own blip must not move every trial.
      const bool lost = silent * 1000 > static_cast<double>(options_.agent_lost_after.count()) &&
                        pass.inventory.ok() && !pass.in_inventory.count(ep);
      if (lost) {
        {
          std::lock_guard<std::mutex> lock(lost_mu_);
          pass.result.agents_lost += lost_agents_.insert(ep).second;
        }
        Requeue(pass, n, e, "agent_lost",
                "agent " + e.value("agent", ep) + " lost (no answer for " +
                    std::to_string(static_cast<int>(silent)) + " s and gone from Prometheus)");
        continue;
      }
      auto why = agents_->LastStatus(ep);
      if (why.status().code() == StatusCode::kUnavailable) {
        pass.unreachable = why.status().message();
        e["message"] = Truncated(pass.unreachable);
      }
      continue;  // not reached yet, or a blip: keep the last known state
    }
    // A copy of an older attempt is not ours (it is stopping: the agent refuses to start a
    // newer attempt next to it), unless it finished.
    const int64_t attempt = e.value("attempt", int64_t{0});
    auto find = [&]() -> const v1::TrialStatus* {
      const v1::TrialStatus* found = nullptr;
      for (const auto& t : report->second.trials()) {
        if (pass.Ours(t, n, attempt)) found = &t;
      }
      return found;
    };
    const v1::TrialStatus* found = find();
    if (found == nullptr) {
      // The background copy may predate the assignment: ask the agent itself before
      // concluding that it lost the trial.
      auto fresh = agents_->FreshStatus(ep);
      if (!fresh.ok()) continue;  // unreachable now: the lost-agent rule decides later
      report->second = std::move(fresh).value();
      found = find();
    }
    if (found != nullptr) pass.found[n] = *found;  // its evaluations, for early stopping
    if (found != nullptr && found->state() == v1::INTERRUPTED &&
        (pass.suspend || IsSuspendedMessage(found->message()))) {
      // Checkpointed and stopped for spec.suspend (even if it is false again by now): it waits,
      // Interrupted, naming the agent that holds its record, and is not a restart.
      ApplyTrialReport(*found, e);
      pass.suspended.push_back(n + " at step " + std::to_string(found->step()));
      continue;
    }
    if (found == nullptr || found->state() == v1::INTERRUPTED ||
        (found->state() == v1::CANCELLED && found->attempt() == attempt)) {
      // The agent lost it (restarted), drained it (preemption notice, a full disk) or had it
      // cancelled under it: place it again; it resumes from its newest checkpoint.
      const std::string reason = found == nullptr                    ? "agent_forgot"
                                 : found->state() == v1::INTERRUPTED ? "agent_drained"
                                                                     : "cancelled";
      const std::string why =
          found == nullptr
              ? "no longer on " + e.value("agent", ep)
              : std::string(found->state() == v1::INTERRUPTED ? "interrupted on "
                                                              : "cancelled on ") +
                    e.value("agent", ep) + " at step " + std::to_string(found->step()) +
                    (found->message().empty() ? "" : " (" + found->message() + ")");
      Requeue(pass, n, e, reason, why);
      continue;
    }
    ApplyTrialReport(*found, e);
    if (IsFinalTrialState(e.value("state", ""))) e.erase("stopEarly");
    // The agent's notices (a corrupt checkpoint skipped, a resume) become Events once.
    const int seen = e.value("notices", 0);
    for (int i = seen; i < found->warnings_size(); ++i) {
      Event(pass.job, "Normal", cond::kEventAgentNotice,
            n + " on " + e.value("agent", ep) + ": " + found->warnings(i));
    }
    e["notices"] = found->warnings_size();
  }
}

void Reconciler::AdoptOrCancelStale(Pass& pass) {
  for (const auto& [ep, report] : pass.reports) {
    for (const auto& t : report.trials()) {
      if (t.job() != pass.name || t.namespace_() != pass.ns || t.job_uid() != pass.uid ||
          !pass.entries.count(t.name())) {
        continue;
      }
      if (t.state() != v1::PENDING && t.state() != v1::RUNNING) continue;
      Json& e = pass.entries[t.name()];
      const std::string mine = e.value("agentEndpoint", "");
      const std::string state = e.value("state", "");
      if (mine == ep && OnAgent(e)) continue;
      if (!OnAgent(e) && !IsFinalTrialState(state) && t.attempt() >= e.value("attempt", 0)) {
        // Assigned by an earlier pass that could not record it (a controller restart between
        // AssignTrial and the status write, or an answer lost to a timeout); a suspended trial
        // (Interrupted) still names the agent it left.
        e["agent"] = report.node_name();
        e["agentEndpoint"] = ep;
        e["attempt"] = t.attempt();
        e["state"] = wire::TrialStateFromProto(t.state());
        continue;
      }
      // A copy left on an agent the trial moved away from (a stale agent that came back;
      // fencing already keeps it from writing checkpoints).
      Status s = agents_->Cancel(ep, pass.Ref(t.name()), false);
      Event(pass.job, "Warning", cond::kEventStaleTrialCancelled,
            t.name() + " was still running on " + report.node_name() + " (attempt " +
                std::to_string(t.attempt()) + ") after moving to " + e.value("agent", "?") +
                ": cancelled there" + (s.ok() ? "" : " (" + s.message() + ")"));
    }
  }
}

std::vector<AgentInventory> Reconciler::ConfirmedAgents(const Pass& pass) {
  std::vector<AgentInventory> out;
  for (AgentInventory a : *pass.inventory) {
    auto report = pass.reports.find(a.endpoint);
    const std::string problem = report == pass.reports.end()
                                    ? "has not answered GetStatus yet"
                                    : ConfirmationProblem(a, report->second);
    if (problem.empty()) {
      // The agent's own numbers are fresher than a scrape.
      for (auto& d : a.devices) {
        for (const auto& r : report->second.devices()) {
          if (r.name() == d.name) d.free_bytes = std::min(d.free_bytes, r.memory_free_bytes());
        }
      }
      out.push_back(std::move(a));
      std::lock_guard<std::mutex> lock(lost_mu_);
      unconfirmed_logged_.erase(a.endpoint);
      continue;
    }
    std::lock_guard<std::mutex> lock(lost_mu_);
    if (report != pass.reports.end() && unconfirmed_logged_.insert(a.endpoint).second) {
      std::fprintf(stderr, "hydra-controller: not using agent %s at %s: %s\n", a.node.c_str(),
                   a.endpoint.c_str(), problem.c_str());
    }
  }
  return out;
}

void Reconciler::StopEarly(Pass& pass) {
  if (pass.early_stopping.algorithm == EarlyStoppingAlgorithm::kNone) return;
  std::vector<EarlyStoppingTrial> trials;
  for (const auto& t : pass.trials) {
    auto f = pass.found.find(t.name);
    trials.push_back(
        {&pass.entries[t.name], t.training.steps, f == pass.found.end() ? nullptr : &f->second});
  }
  DecideEarlyStopping(pass.early_stopping, trials);  // Events: Summarize, on the transitions
}

void Reconciler::TellAgents(Pass& pass) {
  for (auto& [n, e] : pass.entries) {
    auto f = pass.found.find(n);
    if (f == pass.found.end() || IsFinalTrialState(e.value("state", ""))) continue;
    const v1::TrialStatus& r = f->second;
    if (r.state() != v1::RUNNING && r.state() != v1::PENDING) continue;
    const std::string ep = e.value("agentEndpoint", "");
    const auto log = [&](const char* what, const Status& s) {
      if (s.ok()) return;
      std::fprintf(stderr, "%s %s/%s/%s on %s: %s\n", what, pass.ns.c_str(), pass.name.c_str(),
                   n.c_str(), ep.c_str(), s.ToString().c_str());
    };
    if (pass.suspend) {
      // Checkpointed and stopped after its current step; a later pass reads it Interrupted.
      log("suspending", agents_->Suspend(ep, pass.Ref(n)));
      continue;
    }
    v1::LimitTrialRequest req;
    *req.mutable_trial() = pass.Ref(n);
    if (e.contains("stopEarly")) {
      req.set_stop(true);
      req.set_reason(EarlyStopReason(pass.early_stopping, e.value("stopEarly", int64_t{0})));
    } else if (r.step_limit() != WantedStepLimit(e)) {
      req.set_step_limit(WantedStepLimit(e));
    } else {
      continue;
    }
    // A call that fails is made again by the next pass, which finds the agent still behind.
    log("early stopping of", agents_->Limit(ep, req));
  }
}

StatusOr<bool> Reconciler::PlaceWaiting(Pass& pass) {
  if (pass.suspend) return true;
  std::vector<TrialToPlace> waiting;
  for (auto& [n, e] : pass.entries) {
    if (!pass.by_name.count(n)) continue;
    const std::string state = e.value("state", "");
    // Interrupted: suspended (spec.suspend), now resumed.
    if (!OnAgent(e) && !e.contains("stopEarly") &&
        (state == kTrialPending || state == kTrialInterrupted)) {
      waiting.push_back(
          {pass.by_name[n], EstimatedRemainingSeconds(pass.by_name[n], e.value("step", 0))});
    }
  }
  if (waiting.empty()) return true;
  if (!pass.inventory.ok()) {
    for (const auto& w : waiting) pass.no_room[w.trial.name] = pass.inventory.status().message();
    return true;
  }
  const auto agents = ConfirmedAgents(pass);
  if (agents.empty() && !pass.inventory->empty()) {
    for (const auto& w : waiting) {
      pass.no_room[w.trial.name] =
          "no agent has confirmed over gRPC the node and devices Prometheus reports for it";
    }
    return true;
  }
  const auto placements = PlaceTrials(waiting, agents, &pass.load, &pass.no_room);
  if (placements.empty()) return true;
  // Every placement gets a new attempt (the fencing token), stored before any agent is called:
  // an assignment whose answer is lost (a timeout) used a number no later placement reuses.
  for (const auto& p : placements) {
    Json& e = pass.entries[p.trial];
    e["attempt"] = std::max(e.value("attempt", int64_t{0}), e.value("restarts", int64_t{0})) + 1;
  }
  ASSIGN_OR_RETURN(bool reserved, WriteStatus(pass));
  if (!reserved) return false;
  std::vector<std::string> assigned;
  for (const auto& p : placements) {
    Json& e = pass.entries[p.trial];
    v1::AssignTrialRequest req;
    wire::TrialToProto(pass.by_name[p.trial], req.mutable_trial());
    wire::ShardPlanToProto(p.plan, req.mutable_shard_plan());
    req.set_checkpoint_dir((fs::path(options_.checkpoint_root) / pass.ns / pass.name / p.trial)
                               .lexically_normal()
                               .string());
    req.set_resume_from_step(0);  // the newest intact checkpoint, if an earlier run left one
    req.set_attempt(e["attempt"].get<int64_t>());
    req.set_step_limit(WantedStepLimit(e));
    v1::AssignTrialResponse resp;
    Status s = agents_->Assign(p.endpoint, req, &resp);
    if (s.ok() || s.code() == StatusCode::kAlreadyExists) {
      // ALREADY_EXISTS: this very attempt is already there (an earlier call's answer was lost).
      e["agent"] = p.node;
      e["agentEndpoint"] = p.endpoint;
      e["state"] = kTrialPending;  // queued there (a resumed suspension was Interrupted)
      e["shardPlan"] = PlanJson(*req.mutable_shard_plan());
      e.erase("message");
      ++pass.result.assigned;
      assigned.push_back(p.trial + " to " + p.node + " (" + std::to_string(p.plan.shards.size()) +
                         " shard" + (p.plan.shards.size() == 1 ? "" : "s") + ")");
      continue;
    }
    if (IsRejection(s)) {
      // No other agent or more capacity fixes this: say so once per distinct problem.
      if (e.value("message", "") != Truncated(s.message())) {
        Event(pass.job, "Warning", cond::kEventTrialRejected, p.trial + ": " + s.message());
      }
      pass.rejected[p.trial] = s.message();
    } else {
      pass.no_room[p.trial] = s.message();
    }
    e["message"] = Truncated(s.message());
  }
  if (!assigned.empty()) {
    // One Event per pass, not per trial: a 100-trial job would otherwise cost 100 requests.
    std::string text;
    for (const auto& a : assigned) text += (text.empty() ? "" : ", ") + a;
    Event(pass.job, "Normal", cond::kEventTrialAssigned, "assigned " + text);
  }
  return true;
}

void Reconciler::Summarize(Pass& pass) {
  if (!pass.suspended.empty()) {
    std::string text;
    for (const auto& t : pass.suspended) text += (text.empty() ? "" : ", ") + t;
    Event(pass.job, "Normal", cond::kEventTrialsSuspended, "suspended (spec.suspend): " + text);
  }
  for (const auto& [n, why] : pass.no_room) {
    pass.entries[n]["message"] = Truncated("waiting for an agent: " + why);
  }
  std::map<std::string, std::string> old_states;  // as read, for transition Events
  for (const auto& o : pass.read_status.value("trials", Json::array())) {
    old_states[o.value("name", "")] = o.value("state", "");
  }
  TrialCounts c;
  c.total = static_cast<int>(pass.trials.size());
  c.suspended = pass.suspend;
  std::string best;
  double best_loss = INFINITY;
  for (const auto& t : pass.trials) {
    const Json& e = pass.entries[t.name];
    const std::string state = e.value("state", kTrialPending);
    c.pending += state == kTrialPending || state == kTrialInterrupted;
    c.running += state == kTrialRunning;
    c.succeeded += state == kTrialSucceeded;
    c.early_stopped += state == kTrialEarlyStopped;
    c.failed += state == kTrialFailed || state == kTrialCancelled;
    c.unplaced += !IsFinalTrialState(state) && !OnAgent(e);
    pass.result.trials_by_state[state] += 1;
    if (state == kTrialSucceeded && e.contains("validationLoss") &&
        e["validationLoss"].get<double>() < best_loss) {
      best_loss = e["validationLoss"].get<double>();
      best = t.name;
    }
    const std::string before = old_states.count(t.name) ? old_states[t.name] : "";
    if (before != state && state == kTrialSucceeded) {
      Event(pass.job, "Normal", cond::kEventTrialSucceeded,
            t.name + " succeeded; validation loss " +
                (e.contains("validationLoss") ? std::to_string(e["validationLoss"].get<double>())
                                              : std::string("n/a")));
    } else if (before != state && state == kTrialEarlyStopped) {
      Event(pass.job, "Normal", cond::kEventTrialEarlyStopped,
            t.name + " stopped early: " + e.value("message", ""));
    } else if (before != state && (state == kTrialFailed || state == kTrialCancelled)) {
      Event(pass.job, "Warning", cond::kEventTrialFailed,
            t.name + " " + state + ": " + e.value("message", ""));
    }
  }
  Json& status = pass.status;
  const int total = c.total;
  status["trialCount"] = total;
  status["pending"] = c.pending;
  status["running"] = c.running;
  status["succeeded"] = c.succeeded;
  status["failed"] = c.failed;
  if (pass.early_stopping.algorithm != EarlyStoppingAlgorithm::kNone) {
    status["earlyStopped"] = c.early_stopped;
  }
  if (!best.empty()) {
    status["bestTrial"] = {{"name", best},
                           {"validationLoss", best_loss},
                           {"hyperparameters", pass.entries[best]["hyperparameters"]}};
    status["bestValidationLoss"] = ForReading(best_loss);
  }
  if (!status.contains("startTime") &&
      (c.running + c.succeeded + c.early_stopped + c.failed > 0 || pass.result.assigned > 0)) {
    status["startTime"] = kube::TimeNow();
  }
  pass.all_final = c.AllFinal();
  const bool was_final = pass.read_status.contains("completionTime");
  if (pass.all_final && !was_final) status["completionTime"] = kube::TimeNow();
  SetJobConditions(pass.status["conditions"], pass.generation, c, pass.unreachable,
                   pass.inventory.status(), pass.no_room, pass.rejected);
  if (pass.all_final && !was_final) {
    if (c.failed == 0) {
      Event(pass.job, "Normal", cond::kEventJobComplete,
            c.early_stopped == 0
                ? "all " + std::to_string(total) + " trials succeeded; best " + best
                : std::to_string(c.succeeded) + " trials succeeded and " +
                      std::to_string(c.early_stopped) + " stopped early; best " + best);
    } else {
      Event(pass.job, "Warning", cond::kEventJobFailed,
            std::to_string(c.failed) + " of " + std::to_string(total) + " trials failed");
    }
  }
}

StatusOr<bool> Reconciler::WriteStatus(Pass& pass) {
  Json list = Json::array();
  for (const auto& t : pass.trials) list.push_back(pass.entries[t.name]);  // grid order
  pass.status["trials"] = list;
  if (pass.status == pass.old_status) return true;
  pass.job["status"] = pass.status;
  // Optimistic concurrency: the resourceVersion we read must still be current.
  auto w = kube_->UpdateStatus(kMultiModelJobs, pass.ns, pass.job);
  if (!w.ok()) {
    if (!kube::IsConflict(w.status())) return w.status();
    return false;
  }
  // Later writes of this pass go on from what was just stored.
  pass.job = std::move(w).value();
  pass.old_status = pass.status;
  pass.wrote = true;
  return true;
}

}  // namespace hydra::controller
