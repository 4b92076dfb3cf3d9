#pragma once
// What one of a job's agent pods is doing, read from the pod object (pure; no API calls).

#include <nlohmann/json.hpp>
#include <string>

namespace hydra::controller {

/// Kueue's scheduling gate: a pod that carries it waits for Kueue's admission.
inline constexpr char kKueueAdmissionGate[] = "kueue.x-k8s.io/admission";

/// Where an agent pod is in its life, as the controller acts on it.
enum class AgentPodPhase {
  kGated,        ///< held by a scheduling gate (Kueue has not admitted it)
  kUnscheduled,  ///< waiting for a node (the scheduler, or an autoscaler adding one)
  kStarting,     ///< on a node, its agent not yet Ready
  kReady,        ///< Running and Ready with a pod IP: its agent serves
  kTerminating,  ///< being deleted (its agent checkpoints its trials and exits)
  kFailed,       ///< ended: evicted, its node lost, its agent exited for good
};

/// "Gated", "Unscheduled", "Starting", "Ready", "Terminating", "Failed".
const char* AgentPodPhaseName(AgentPodPhase phase);

/// One agent pod as the controller sees it.
struct AgentPodView {
  std::string name;
  int index = -1;  ///< its hydra.dev/agent-index label (-1: none)
  AgentPodPhase phase = AgentPodPhase::kUnscheduled;
  std::string node;      ///< spec.nodeName
  std::string endpoint;  ///< <pod IP>:<gRPC port> once it has an IP
  bool kueue_gated = false;
  /// Why it waits or ended, from its conditions and containers (the scheduler's
  /// "0/3 nodes are available: ...", "Evicted: ...", "CrashLoopBackOff"); may be empty.
  std::string reason;

  /// Not ending: gated, waiting, starting or ready.
  bool Live() const {
    return phase != AgentPodPhase::kTerminating && phase != AgentPodPhase::kFailed;
  }
};

/// Reads a pod (as the API server returns it) of a job's agents; `grpc_port` is the agent's.
AgentPodView ObserveAgentPod(const nlohmann::json& pod, int grpc_port);

}  // namespace hydra::controller
