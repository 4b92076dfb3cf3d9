// ScaleAgents: the job's own agent pods (spec.agents) follow its runnable trials.
#include <algorithm>

#include "controller/reconciler/conditions.h"
#include "controller/reconciler/phases.h"

namespace hydra::controller {
namespace {

namespace cond = conditions;
using kube::Json;

std::string Join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& i : items) out += (out.empty() ? "" : ", ") + i;
  return out;
}

/// Trials that will still train and wait for an agent: not ended, not stopped early, on none.
int64_t UnplacedTrials(const Pass& pass) {
  int64_t n = 0;
  for (const auto& t : pass.trials) {
    const TrialEntry& e = pass.entries.at(t.name);
    n += !e.Final() && !e.stop_early && !e.OnAgent();
  }
  return n;
}

/// The trials an agent pod holds: what its agent reports, or what the entries say it was
/// given (an assignment its report does not show yet), whichever is more.
int TrialsOn(const Pass& pass, const AgentPodView& pod) {
  int assigned = 0;
  for (const auto& [n, e] : pass.entries) {
    assigned +=
        e.OnAgent() && !e.Final() && !pod.endpoint.empty() && e.agent_endpoint == pod.endpoint;
  }
  auto reported = pass.load.find(pod.endpoint);
  return std::max(assigned, reported == pass.load.end() ? 0 : reported->second);
}

/// A Warning Event for a problem with the pods, once: not again while Degraded says it.
void PodProblem(const ReconcileContext& ctx, Pass& pass, const std::string& problem) {
  pass.pods.problem = problem;
  const Condition* degraded = FindCondition(pass.read_status.conditions, cond::kDegraded);
  if (degraded == nullptr || degraded->message != Truncated(problem)) {
    ctx.Event(pass.job, "Warning", cond::kEventAgentPodsNotCreated, problem);
  }
}

/// Deletes pods that ended (evicted, their node lost, their agent exited for good): the scale
/// step then creates their replacements.
void DeleteFailedPods(const ReconcileContext& ctx, Pass& pass) {
  for (const auto& p : pass.pods.pods) {
    if (p.phase != AgentPodPhase::kFailed) continue;
    Status s = ctx.kube->Delete(kube::kPods, pass.ns, p.name);
    if (!s.ok() && s.code() != StatusCode::kNotFound) continue;  // tried again next pass
    pass.pods.removing.insert(p.name);
    ctx.Event(pass.job, "Warning", cond::kEventAgentPodFailed,
              "agent pod " + p.name + " failed" + (p.reason.empty() ? "" : " (" + p.reason + ")") +
                  "; its trials resume from their checkpoints on another agent");
  }
}

/// Whether the job's certificate must be issued (again): none yet, unreadable, or expiring.
bool NeedsNewCertificate(const ReconcileContext& ctx, const kube::Json& secret) {
  auto pem = Base64Decode(secret.value("data", Json::object()).value("tls.crt", ""));
  if (!pem.ok()) return true;
  auto not_after = CertificateNotAfter(*pem);
  return !not_after.ok() ||
         *not_after - std::chrono::system_clock::now() < ctx.options->agent_cert_renew_before;
}

/// With TLS: the Secret holding the job's agents' certificate, created or renewed before new
/// pods mount it (pods already running keep the one they started with).
Status EnsureAgentTls(const ReconcileContext& ctx, const Pass& pass) {
  const CertificateAuthority& ca = *ctx.options->agent_pod_ca;
  const std::string name = AgentTlsSecretName(pass.name);
  auto existing = ctx.kube->Get(kube::kSecrets, pass.ns, name);
  if (!existing.ok() && existing.status().code() != StatusCode::kNotFound) {
    return existing.status();
  }
  if (existing.ok()) {
    const Json labels = (*existing)["metadata"].value("labels", Json::object());
    if (labels.value(kJobUidLabel, "") != pass.uid) {
      return FailedPreconditionError("Secret " + name + " exists and is not this job's (no label " +
                                     kJobUidLabel + "=" + pass.uid +
                                     "): the job's agents' certificate goes there; delete or "
                                     "rename that Secret");
    }
    if (!NeedsNewCertificate(ctx, *existing)) return OkStatus();
  }
  ASSIGN_OR_RETURN(IssuedCertificate cert,
                   IssueServerCertificate(ca, AgentServerName(pass.ns, pass.name),
                                          ctx.options->agent_cert_validity));
  ASSIGN_OR_RETURN(Json secret, AgentTlsSecret(pass.job, cert, ca.cert_pem));
  if (!existing.ok()) return ctx.kube->Create(kube::kSecrets, pass.ns, secret).status();
  secret["metadata"]["resourceVersion"] = (*existing)["metadata"].value("resourceVersion", "");
  return ctx.kube->Update(kube::kSecrets, pass.ns, secret).status();
}

/// The pods' options for this job: its TLS Secret when the controller issues certificates.
AgentPodOptions PodOptions(const ReconcileContext& ctx, const Pass& pass) {
  AgentPodOptions o = ctx.options->agent_pods;
  o.tls_secret = ctx.options->agent_pod_ca ? AgentTlsSecretName(pass.name) : "";
  return o;
}

void CreatePods(const ReconcileContext& ctx, Pass& pass, int count, int64_t unplaced) {
  if (ctx.options->agent_pod_ca) {
    if (Status tls = EnsureAgentTls(ctx, pass); !tls.ok()) {
      PodProblem(ctx, pass, "cannot issue the agents' certificate: " + tls.message());
      return;
    }
  }
  std::vector<AgentPodLoad> all;
  for (const auto& p : pass.pods.pods) all.push_back({p.name, p.index, 0, p.phase});
  std::vector<std::string> created;
  const AgentPodOptions options = PodOptions(ctx, pass);
  for (int index : FreeAgentIndices(all, count)) {
    auto pod = AgentPod(pass.job, *pass.own_agents, index, options);
    if (!pod.ok()) {
      PodProblem(ctx, pass,
                 "cannot build agent pod " + std::to_string(index) + ": " + pod.status().message());
      break;
    }
    auto made = ctx.kube->Create(kube::kPods, pass.ns, *pod);
    if (!made.ok() && made.status().code() == StatusCode::kAlreadyExists) continue;
    if (!made.ok()) {
      PodProblem(ctx, pass,
                 "cannot create agent pod " + AgentPodName(pass.name, index) + ": " +
                     made.status().message());
      break;
    }
    pass.pods.pods.push_back(ObserveAgentPod(*made, ctx.options->agent_pods.grpc_port));
    created.push_back(pass.pods.pods.back().name);
  }
  if (created.empty()) return;
  ctx.Event(pass.job, "Normal", cond::kEventAgentPodsCreated,
            "created " + Join(created) + " (" + std::to_string(pass.pods.desired) +
                " agents wanted: " + std::to_string(unplaced) + " trials wait for one)");
}

void RemoveIdlePods(const ReconcileContext& ctx, Pass& pass) {
  std::vector<AgentPodLoad> live;
  for (const auto* p : pass.pods.Live()) {
    live.push_back({p->name, p->index, TrialsOn(pass, *p), p->phase});
  }
  std::vector<std::string> deleted;
  for (const auto& name : AgentPodsToRemove(live, pass.pods.desired)) {
    Status s = ctx.kube->Delete(kube::kPods, pass.ns, name);
    if (!s.ok() && s.code() != StatusCode::kNotFound) continue;  // tried again next pass
    pass.pods.removing.insert(name);
    deleted.push_back(name);
  }
  if (deleted.empty()) return;
  const std::string why = pass.all_final ? "the job has ended"
                          : pass.suspend ? "spec.suspend is true"
                                         : "the job's remaining trials need " +
                                               std::to_string(pass.pods.desired) + " of them";
  ctx.Event(pass.job, "Normal", cond::kEventAgentPodsDeleted,
            "deleted idle " + Join(deleted) + " (" + why + ")");
}

}  // namespace

void ScaleAgents(const ReconcileContext& ctx, Pass& pass) {
  if (!pass.own_agents || !pass.inventory.ok()) return;  // not listed: change nothing
  pass.all_final = std::all_of(pass.trials.begin(), pass.trials.end(),
                               [&](const Trial& t) { return pass.entries.at(t.name).Final(); });
  DeleteFailedPods(ctx, pass);
  int busy = 0;
  for (const auto* p : pass.pods.Live()) busy += TrialsOn(pass, *p) > 0;
  const int64_t unplaced = UnplacedTrials(pass);
  pass.pods.desired =
      pass.all_final || pass.suspend ? 0 : DesiredAgents(busy, unplaced, *pass.own_agents);
  const int live = static_cast<int>(pass.pods.Live().size());
  if (live < pass.pods.desired) CreatePods(ctx, pass, pass.pods.desired - live, unplaced);
  if (live > pass.pods.desired) RemoveIdlePods(ctx, pass);
}

}  // namespace hydra::controller
