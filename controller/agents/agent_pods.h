#pragma once
// Job-owned agent pods (spec.agents, issue 20): the pod the controller creates from a job's
// template, and how many of them a job wants. Pure functions over JSON; the reconciler that
// creates, watches and deletes the pods is not built yet.

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/job.h"
#include "common/status.h"
#include "controller/agents/agent_certs.h"
#include "controller/agents/pod_state.h"

namespace hydra::controller {

/// Labels on every job-owned agent pod (and the selector that finds a job's pods).
inline constexpr char kJobLabel[] = "hydra.dev/job";
inline constexpr char kJobUidLabel[] = "hydra.dev/job-uid";
inline constexpr char kAgentIndexLabel[] = "hydra.dev/agent-index";
/// Kueue's queue label: copied from the job to its pods, which Kueue's plain-pod integration
/// then admits one by one.
inline constexpr char kKueueQueueLabel[] = "kueue.x-k8s.io/queue-name";

/// What the controller adds to a job's template: the agent's ports, roots and TLS.
struct AgentPodOptions {
  int grpc_port = 9443;
  int metrics_port = 8080;
  int health_port = 8081;
  /// The agent's --data-root and --checkpoint-root: where the template's volumes hold the
  /// job's data and checkpoints.
  std::string data_root = "/data";
  std::string checkpoint_root = "/checkpoints";
  /// A Secret of the job's namespace with tls.crt, tls.key (and ca.crt for mutual TLS),
  /// mounted at `tls_dir`; empty: plaintext gRPC (--insecure).
  std::string tls_secret;
  std::string tls_dir = "/etc/hydra/tls";
  /// With TLS: the identity a client certificate must carry (mutual TLS); empty: server TLS
  /// only.
  std::string tls_client_identity;
  /// Seconds a pod has to checkpoint its trials after SIGTERM, unless the template says.
  int64_t termination_grace_seconds = 120;
};

/// The name of a job's agent pod `index`: "<job>-agent-<index>".
std::string AgentPodName(const std::string& job, int index);

/// Agent pod `index` of `job` (the MultiModelJob object as the API server returns it, with
/// spec.agents checked by the parser): the template's metadata and PodSpec, named
/// AgentPodName, in the job's namespace, owned by the job (a controller ownerReference, so
/// deleting the job deletes its pods), labelled with the job, its uid and the index (and
/// Kueue's queue label when the job has one), its agent container (`agents.container`) running
/// hydra-agent with the controller's flags before the template's args, the downward-API
/// environment the flags use, the agent's ports and a readiness probe unless the template has
/// one; with `options.tls_secret`, the Secret mounted for the agent's TLS flags.
/// INVALID_ARGUMENT when the job lacks a name, namespace, uid or spec.agents.template.
StatusOr<nlohmann::json> AgentPod(const nlohmann::json& job, const AgentsSpec& agents, int index,
                                  const AgentPodOptions& options);

/// The Secret (kubernetes.io/tls, `AgentTlsSecretName`) of the job's namespace, owned by the job
/// and labelled with it, holding its agents' certificate and key (tls.crt, tls.key) and the CA
/// of the controller's client certificates (ca.crt: the agents' --tls-client-ca-file).
/// INVALID_ARGUMENT when the job lacks a name, namespace or uid.
StatusOr<nlohmann::json> AgentTlsSecret(const nlohmann::json& job, const IssuedCertificate& cert,
                                        const std::string& client_ca_pem);

/// How many agent pods a job wants: the pods that hold its trials (`busy_pods`: trials do not
/// move between agents but at checkpoints) and enough devices for each trial still waiting for
/// an agent (`unplaced_trials`; an agent has `gpus_per_agent` devices, or one CPU device), at
/// least minAgents and at most maxAgents. So an idle pod goes once the job's tail is elsewhere.
int DesiredAgents(int64_t busy_pods, int64_t unplaced_trials, const AgentsSpec& agents);

/// One of a job's agent pods as the controller sees it.
struct AgentPodLoad {
  std::string name;
  int index = 0;
  int trials = 0;  ///< trials it trains now
  AgentPodPhase phase = AgentPodPhase::kReady;
};

/// Which pods to delete to come down to `desired`: idle ones only (a pod training a trial keeps
/// it until the trial ends or moves), those furthest from serving first (a gated pod holds no
/// quota yet, an unscheduled one keeps an autoscaler adding nodes for nothing, a starting one
/// already holds its node and quota and serves in seconds), then the highest index, so the
/// pods that stay have the lowest names. A deleted agent checkpoints what it holds before it
/// exits.
std::vector<std::string> AgentPodsToRemove(std::vector<AgentPodLoad> pods, int desired);

/// The lowest indices not in use, `count` of them: the pods to create.
std::vector<int> FreeAgentIndices(const std::vector<AgentPodLoad>& pods, int count);

}  // namespace hydra::controller
