#include "controller/agents/agent_pods.h"

#include <algorithm>
#include <set>

namespace hydra::controller {
namespace {

using Json = nlohmann::json;

constexpr char kTlsVolume[] = "hydra-agent-tls";

/// The downward-API variables the agent's flags use.
Json AgentEnv() {
  const auto field = [](const char* name, const char* path) {
    return Json{{"name", name}, {"valueFrom", {{"fieldRef", {{"fieldPath", path}}}}}};
  };
  return Json::array({field("NODE_NAME", "spec.nodeName"), field("POD_NAME", "metadata.name"),
                      field("POD_IP", "status.podIP"),
                      field("POD_NAMESPACE", "metadata.namespace")});
}

/// Whether the template's own args name `flag` ("--devices" or "--devices=...").
bool HasFlag(const Json& args, const std::string& flag) {
  for (const auto& a : args) {
    if (!a.is_string()) continue;
    const std::string s = a.get<std::string>();
    if (s == flag || s.rfind(flag + "=", 0) == 0) return true;
  }
  return false;
}

/// The flags the controller relies on: where the agent listens and advertises itself, its
/// roots, the one job it serves, and TLS; the devices are the pod's GPUs when it has any and the
/// template does not name them (`template_args`).
Json AgentArgs(const std::string& dedicated_job, const AgentsSpec& agents, const AgentPodOptions& o,
               const Json& template_args) {
  const std::string grpc = std::to_string(o.grpc_port);
  Json args = Json::array({"--node-name=$(NODE_NAME)", "--grpc-bind-address=0.0.0.0:" + grpc,
                           "--grpc-advertise-address=$(POD_IP):" + grpc,
                           "--metrics-bind-address=:" + std::to_string(o.metrics_port),
                           "--health-probe-bind-address=:" + std::to_string(o.health_port),
                           "--data-root=" + o.data_root, "--checkpoint-root=" + o.checkpoint_root,
                           "--dedicated-job=" + dedicated_job});
  if (agents.gpus_per_agent > 0 && !HasFlag(template_args, "--devices")) {
    args.push_back("--devices=cuda");
  }
  if (o.tls_secret.empty()) {
    args.push_back("--insecure");
    return args;
  }
  args.push_back("--tls-cert-file=" + o.tls_dir + "/tls.crt");
  args.push_back("--tls-key-file=" + o.tls_dir + "/tls.key");
  if (!o.tls_client_identity.empty()) {
    args.push_back("--tls-client-ca-file=" + o.tls_dir + "/ca.crt");
    args.push_back("--tls-client-identity=" + o.tls_client_identity);
  }
  return args;
}

/// `ours` followed by the entries of `theirs` whose "name" none of `ours` has.
Json MergeByName(Json ours, const Json& theirs) {
  std::set<std::string> names;
  for (const auto& e : ours) names.insert(e.value("name", ""));
  if (theirs.is_array()) {
    for (const auto& e : theirs) {
      if (!e.is_object() || !names.count(e.value("name", ""))) ours.push_back(e);
    }
  }
  return ours;
}

/// Completes the agent container: command, flags, environment, ports, readiness, TLS mount.
void CompleteAgentContainer(Json& c, const std::string& dedicated_job, const AgentsSpec& agents,
                            const AgentPodOptions& o) {
  c["command"] = Json::array({"hydra-agent"});
  const Json theirs = c.value("args", Json::array());
  Json args = AgentArgs(dedicated_job, agents, o, theirs);
  for (const auto& a : theirs) args.push_back(a);
  c["args"] = args;
  c["env"] = MergeByName(AgentEnv(), c.value("env", Json::array()));
  const auto port = [](const char* name, int number) {
    return Json{{"name", name}, {"containerPort", number}, {"protocol", "TCP"}};
  };
  c["ports"] = MergeByName(Json::array({port("grpc", o.grpc_port), port("metrics", o.metrics_port),
                                        port("health", o.health_port)}),
                           c.value("ports", Json::array()));
  if (!c.contains("readinessProbe")) {
    c["readinessProbe"] = {{"httpGet", {{"path", "/readyz"}, {"port", "health"}}},
                           {"periodSeconds", 5}};
  }
  if (!o.tls_secret.empty()) {
    Json mounts = c.value("volumeMounts", Json::array());
    mounts.push_back({{"name", kTlsVolume}, {"mountPath", o.tls_dir}, {"readOnly", true}});
    c["volumeMounts"] = mounts;
  }
}

}  // namespace

std::string AgentPodName(const std::string& job, int index) {
  return job + "-agent-" + std::to_string(index);
}

namespace {

/// An object of the job's namespace that the job owns (deleting the job deletes it).
Json OwnedMetadata(const std::string& object_name, const std::string& job, const std::string& ns,
                   const std::string& uid, const std::string& api_version) {
  return {{"name", object_name},
          {"namespace", ns},
          {"labels", {{kJobLabel, job}, {kJobUidLabel, uid}}},
          {"ownerReferences", Json::array({{{"apiVersion", api_version},
                                            {"kind", "MultiModelJob"},
                                            {"name", job},
                                            {"uid", uid},
                                            {"controller", true},
                                            {"blockOwnerDeletion", true}}})}};
}

}  // namespace

StatusOr<Json> AgentTlsSecret(const Json& job, const IssuedCertificate& cert,
                              const std::string& client_ca_pem) {
  const Json& md = job.value("metadata", Json::object());
  const std::string name = md.value("name", ""), ns = md.value("namespace", ""),
                    uid = md.value("uid", "");
  if (name.empty() || ns.empty() || uid.empty()) {
    return InvalidArgumentError("the job needs metadata.name, namespace and uid for its Secret");
  }
  return Json{{"apiVersion", "v1"},
              {"kind", "Secret"},
              {"type", "kubernetes.io/tls"},
              {"metadata", OwnedMetadata(AgentTlsSecretName(name), name, ns, uid,
                                         job.value("apiVersion", "hydra.dev/v1alpha1"))},
              {"data",
               {{"tls.crt", Base64Encode(cert.cert_pem)},
                {"tls.key", Base64Encode(cert.key_pem)},
                {"ca.crt", Base64Encode(client_ca_pem)}}}};
}

StatusOr<Json> AgentPod(const Json& job, const AgentsSpec& agents, int index,
                        const AgentPodOptions& o) {
  const Json& md = job.value("metadata", Json::object());
  const std::string name = md.value("name", ""), ns = md.value("namespace", ""),
                    uid = md.value("uid", "");
  if (name.empty() || ns.empty() || uid.empty()) {
    return InvalidArgumentError("the job needs metadata.name, namespace and uid for its pods");
  }
  const Json* tmpl = nullptr;
  if (job.contains("spec") && job["spec"].contains("agents") &&
      job["spec"]["agents"].contains("template")) {
    tmpl = &job["spec"]["agents"]["template"];
  }
  if (tmpl == nullptr || !tmpl->is_object() || !tmpl->value("spec", Json()).is_object()) {
    return InvalidArgumentError(ns + "/" + name + ": spec.agents.template.spec is missing");
  }
  Json pod = {{"apiVersion", "v1"}, {"kind", "Pod"}};
  Json& pmd = pod["metadata"];
  pmd = OwnedMetadata(AgentPodName(name, index), name, ns, uid,
                      job.value("apiVersion", "hydra.dev/v1alpha1"));
  Json labels = tmpl->value("metadata", Json::object()).value("labels", Json::object());
  labels[kJobLabel] = name;
  labels[kJobUidLabel] = uid;
  labels[kAgentIndexLabel] = std::to_string(index);
  labels["app.kubernetes.io/component"] = "agent";
  labels["app.kubernetes.io/managed-by"] = "hydra-controller";
  const Json job_labels = md.value("labels", Json::object());
  if (job_labels.contains(kKueueQueueLabel))
    labels[kKueueQueueLabel] = job_labels[kKueueQueueLabel];
  pmd["labels"] = labels;
  if (const Json a = tmpl->value("metadata", Json::object()).value("annotations", Json());
      a.is_object()) {
    pmd["annotations"] = a;
  }
  pod["spec"] = (*tmpl)["spec"];
  Json& spec = pod["spec"];
  bool found = false;
  for (auto& c : spec["containers"]) {
    if (c.value("name", "") != agents.container) continue;
    CompleteAgentContainer(c, ns + "/" + name + "/" + uid, agents, o);
    found = true;
  }
  if (!found) {
    return InvalidArgumentError(ns + "/" + name + ": spec.agents.template has no container " +
                                agents.container);
  }
  if (!spec.contains("terminationGracePeriodSeconds")) {
    spec["terminationGracePeriodSeconds"] = o.termination_grace_seconds;
  }
  if (!o.tls_secret.empty()) {
    Json volumes = spec.value("volumes", Json::array());
    volumes.push_back({{"name", kTlsVolume}, {"secret", {{"secretName", o.tls_secret}}}});
    spec["volumes"] = volumes;
  }
  return pod;
}

int DesiredAgents(int64_t busy_pods, int64_t unplaced_trials, const AgentsSpec& agents) {
  const int64_t devices = std::max<int64_t>(1, agents.gpus_per_agent);
  const int64_t wanted = std::max<int64_t>(0, busy_pods) +
                         (std::max<int64_t>(0, unplaced_trials) + devices - 1) / devices;
  return static_cast<int>(std::clamp(wanted, agents.min_agents, agents.max_agents));
}

std::vector<std::string> AgentPodsToRemove(std::vector<AgentPodLoad> pods, int desired) {
  // Gated, unscheduled, starting, ready: the enum's order is the way to serving.
  std::sort(pods.begin(), pods.end(), [](const AgentPodLoad& a, const AgentPodLoad& b) {
    return a.phase != b.phase ? a.phase < b.phase : a.index > b.index;
  });
  std::vector<std::string> out;
  int excess = static_cast<int>(pods.size()) - desired;
  for (const auto& p : pods) {
    if (excess <= 0) break;
    if (p.trials > 0) continue;
    out.push_back(p.name);
    --excess;
  }
  return out;
}

std::vector<int> FreeAgentIndices(const std::vector<AgentPodLoad>& pods, int count) {
  std::set<int> used;
  for (const auto& p : pods) used.insert(p.index);
  std::vector<int> out;
  for (int i = 0; static_cast<int>(out.size()) < count; ++i) {
    if (!used.count(i)) out.push_back(i);
  }
  return out;
}

}  // namespace hydra::controller
