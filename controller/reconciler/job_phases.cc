// The phases about the job object itself: reading it, its finalizer, its spec's trials, and
// finalizing it on deletion.
#include "common/job_json.h"
#include "controller/agents/agent_pods.h"
#include "controller/reconciler/conditions.h"
#include "controller/reconciler/phases.h"

namespace hydra::controller {
namespace {

namespace cond = conditions;
using kube::Json;

bool HasOurFinalizer(const Json& metadata) {
  for (const auto& f : metadata.value("finalizers", Json::array())) {
    if (f == cond::kFinalizer) return true;
  }
  return false;
}

/// Cancels every trial of the job on its agent; returns how many, and the first problem.
int CancelTrials(const ReconcileContext& ctx, const Pass& pass, bool delete_checkpoints,
                 std::string* problem) {
  int cancelled = 0;
  for (const auto& t : pass.read_status.trials) {
    if (t.agent_endpoint.empty()) continue;
    if (t.Final() && !delete_checkpoints) continue;
    // Exactly this job's trial: same namespace, job, uid and name (another job of the same
    // name, in this namespace or another, is never touched).
    Status s = ctx.agents->Cancel(t.agent_endpoint, pass.Ref(t.name), delete_checkpoints);
    if (s.ok()) {
      ++cancelled;
    } else if (s.code() != StatusCode::kNotFound && s.code() != StatusCode::kFailedPrecondition &&
               problem->empty()) {
      *problem = s.message();
    }
  }
  return cancelled;
}

/// Deletes the job's agent pods (its own, by the job's uid); a pod already gone is fine.
Status DeleteAgentPods(const ReconcileContext& ctx, const Pass& pass, int* deleted) {
  ASSIGN_OR_RETURN(
      Json pods, ctx.kube->List(kube::kPods, pass.ns, std::string(kJobUidLabel) + "=" + pass.uid));
  for (const auto& p : pods.value("items", Json::array())) {
    if (p["metadata"].contains("deletionTimestamp")) continue;
    Status s = ctx.kube->Delete(kube::kPods, pass.ns, p["metadata"].value("name", ""));
    if (!s.ok() && s.code() != StatusCode::kNotFound) return s;
    *deleted += s.ok();
  }
  return OkStatus();
}

/// Deletes the job's agents' certificate Secret, if it is the job's (a Secret of that name
/// someone else made stays).
Status DeleteAgentTlsSecret(const ReconcileContext& ctx, const Pass& pass) {
  const std::string name = AgentTlsSecretName(pass.name);
  auto secret = ctx.kube->Get(kube::kSecrets, pass.ns, name);
  if (!secret.ok()) {
    return secret.status().code() == StatusCode::kNotFound ? OkStatus() : secret.status();
  }
  const Json labels = (*secret)["metadata"].value("labels", Json::object());
  if (labels.value(kJobUidLabel, "") != pass.uid) return OkStatus();
  Status s = ctx.kube->Delete(kube::kSecrets, pass.ns, name);
  return s.ok() || s.code() == StatusCode::kNotFound ? OkStatus() : s;
}

}  // namespace

Status ReadJob(const ReconcileContext& ctx, const std::string& ns, const std::string& name,
               Pass& pass) {
  ASSIGN_OR_RETURN(pass.job, ctx.kube->Get(kMultiModelJobs, ns, name));
  const Json& md = pass.job["metadata"];
  pass.ns = ns;
  pass.name = name;
  pass.uid = md.value("uid", "");
  pass.generation = md.value("generation", int64_t{1});
  pass.stored = pass.job.value("status", Json::object());
  pass.read_status = JobStatusFromJson(pass.stored);
  pass.status = pass.read_status;
  pass.status.observed_generation = pass.generation;
  return OkStatus();
}

Status Finalize(const ReconcileContext& ctx, Pass& pass) {
  if (!HasOurFinalizer(pass.job["metadata"])) return OkStatus();
  const bool delete_checkpoints =
      pass.job["spec"].value("checkpointRetention", "Retain") == "Delete";
  std::string problem;
  const int cancelled = CancelTrials(ctx, pass, delete_checkpoints, &problem);
  if (!problem.empty()) {
    // An unreachable agent must not keep the job forever: its trials die with the node.
    ctx.Event(pass.job, "Warning", cond::kEventTrialsCancelled,
              "could not reach every agent: " + problem);
  }
  ctx.Event(pass.job, "Normal", cond::kEventTrialsCancelled,
            std::to_string(cancelled) + " trials cancelled on their agents" +
                (delete_checkpoints ? ", checkpoints removed" : ", checkpoints kept"));
  if (pass.job["spec"].contains("agents")) {
    // The pods' owner references would let a garbage collector do it, but only after the job
    // is gone; the job's agents go with the job, whoever runs the cluster.
    int deleted = 0;
    RETURN_IF_ERROR(DeleteAgentPods(ctx, pass, &deleted));
    RETURN_IF_ERROR(DeleteAgentTlsSecret(ctx, pass));
    if (deleted > 0) {
      ctx.Event(pass.job, "Normal", cond::kEventAgentPodsDeleted,
                std::to_string(deleted) + " agent pods deleted with the job");
    }
  }
  auto removed = ctx.kube->UpdateWithRetry(kMultiModelJobs, pass.ns, pass.name, [](Json& o) {
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
  ForgetGoneEndpoints(ctx, pass, {});
  return OkStatus();
}

StatusOr<bool> EnsureFinalizer(const ReconcileContext& ctx, Pass& pass) {
  Json& md = pass.job["metadata"];
  if (HasOurFinalizer(md)) return true;
  // With the resourceVersion just read; a conflict means someone else wrote: start over.
  md["finalizers"] = md.value("finalizers", Json::array());
  md["finalizers"].push_back(cond::kFinalizer);
  auto added = ctx.kube->Update(kMultiModelJobs, pass.ns, pass.job);
  if (!added.ok()) {
    if (!kube::IsConflict(added.status())) return added.status();
    return false;
  }
  pass.job = std::move(added).value();
  return true;
}

StatusOr<bool> LoadTrials(const ReconcileContext& ctx, Pass& pass) {
  auto parsed = ParseJobYaml(ManifestText(pass.job), ctx.options->data_root);
  if (parsed.ok()) {
    pass.max_restarts = parsed->spec.max_restarts;
    pass.early_stopping = parsed->spec.early_stopping;
    pass.suspend = parsed->spec.suspend;
    pass.own_agents = parsed->spec.agents;
  }
  StatusOr<std::vector<Trial>> expanded =
      parsed.ok() ? ExpandTrials(*parsed) : StatusOr<std::vector<Trial>>(parsed.status());
  if (expanded.ok()) {
    pass.trials = std::move(expanded).value();
    for (const auto& t : pass.status.trials) pass.entries[t.name] = t;
    for (const auto& t : pass.trials) {
      pass.by_name[t.name] = t;
      TrialEntry& e = pass.entries[t.name];
      e.name = t.name;
      e.hyperparameters = Json::parse(HyperparametersJson(t).dump());
      e.steps = t.training.steps;
      e.precision = t.training.precision;
    }
    return true;
  }
  auto& conds = pass.status.conditions;
  const std::string why = Truncated(expanded.status().message());
  const std::string now = ctx.now();
  SetCondition(conds, cond::kFailed, true, cond::kInvalidSpec, why, pass.generation, now);
  SetCondition(conds, cond::kProgressing, false, cond::kInvalidSpec, "the spec is invalid",
               pass.generation, now);
  SetCondition(conds, cond::kReady, false, cond::kInvalidSpec, "the spec is invalid",
               pass.generation, now);
  const Json status = ToJson(pass.status);
  if (status != pass.stored) {
    ctx.Event(pass.job, "Warning", cond::kEventInvalidSpec, why);
    pass.job["status"] = status;
    auto w = ctx.kube->UpdateStatus(kMultiModelJobs, pass.ns, pass.job);
    if (!w.ok() && !kube::IsConflict(w.status())) return w.status();
    if (!w.ok()) pass.result.requeue_after = std::chrono::milliseconds(100);
  }
  return false;
}

}  // namespace hydra::controller
