#include "controller/agents/pod_state.h"

#include <cstdlib>

#include "controller/agents/agent_pods.h"

namespace hydra::controller {
namespace {

using Json = nlohmann::json;

/// The pod's condition of `type`, or an empty object.
Json PodCondition(const Json& pod, const char* type) {
  for (const auto& c : pod.value("status", Json::object()).value("conditions", Json::array())) {
    if (c.is_object() && c.value("type", "") == type) return c;
  }
  return Json::object();
}

/// "reason: message" of a condition or a container state, whichever parts it has.
std::string Explain(const Json& j) {
  const std::string reason = j.value("reason", ""), message = j.value("message", "");
  if (reason.empty()) return message;
  return message.empty() ? reason : reason + ": " + message;
}

/// Why a pod's containers are not running: the first waiting or terminated state's reason.
std::string ContainerReason(const Json& status) {
  for (const auto& c : status.value("containerStatuses", Json::array())) {
    const Json state = c.value("state", Json::object());
    for (const char* key : {"waiting", "terminated"}) {
      if (state.contains(key)) {
        const std::string why = Explain(state[key]);
        if (!why.empty()) return c.value("name", "") + ": " + why;
      }
    }
  }
  return "";
}

/// Why a pod ended: the kubelet's or the eviction's reason, or its containers'.
std::string FailureReason(const Json& pod) {
  const Json status = pod.value("status", Json::object());
  if (std::string why = Explain(PodCondition(pod, "DisruptionTarget")); !why.empty()) return why;
  if (std::string why = Explain(status); !why.empty()) return why;
  if (std::string why = ContainerReason(status); !why.empty()) return why;
  return "phase " + status.value("phase", std::string("Failed"));
}

bool Gated(const Json& spec, bool* kueue) {
  const Json gates = spec.value("schedulingGates", Json::array());
  for (const auto& g : gates) *kueue = *kueue || g.value("name", "") == kKueueAdmissionGate;
  return !gates.empty();
}

AgentPodPhase PhaseOf(const Json& pod, const std::string& ip, bool* kueue) {
  const Json& md = pod["metadata"];
  const Json spec = pod.value("spec", Json::object());
  const std::string phase = pod.value("status", Json::object()).value("phase", "");
  if (md.contains("deletionTimestamp")) return AgentPodPhase::kTerminating;
  if (phase == "Failed" || phase == "Succeeded") return AgentPodPhase::kFailed;
  if (Gated(spec, kueue)) return AgentPodPhase::kGated;
  if (spec.value("nodeName", "").empty()) return AgentPodPhase::kUnscheduled;
  const bool ready = PodCondition(pod, "Ready").value("status", "") == "True";
  return phase == "Running" && ready && !ip.empty() ? AgentPodPhase::kReady
                                                    : AgentPodPhase::kStarting;
}

}  // namespace

const char* AgentPodPhaseName(AgentPodPhase phase) {
  switch (phase) {
    case AgentPodPhase::kGated: return "Gated";
    case AgentPodPhase::kUnscheduled: return "Unscheduled";
    case AgentPodPhase::kStarting: return "Starting";
    case AgentPodPhase::kReady: return "Ready";
    case AgentPodPhase::kTerminating: return "Terminating";
    case AgentPodPhase::kFailed: return "Failed";
  }
  return "Unscheduled";
}

AgentPodView ObserveAgentPod(const Json& pod, int grpc_port) {
  AgentPodView v;
  const Json md = pod.value("metadata", Json::object());
  const Json status = pod.value("status", Json::object());
  v.name = md.value("name", "");
  const std::string index = md.value("labels", Json::object()).value(kAgentIndexLabel, "");
  char* end = nullptr;
  const long parsed = std::strtol(index.c_str(), &end, 10);
  if (!index.empty() && end != nullptr && *end == '\0' && parsed >= 0 && parsed < 1 << 20) {
    v.index = static_cast<int>(parsed);
  }
  v.node = pod.value("spec", Json::object()).value("nodeName", "");
  const std::string ip = status.value("podIP", "");
  if (!ip.empty()) {
    const bool v6 = ip.find(':') != std::string::npos;
    v.endpoint = (v6 ? "[" + ip + "]" : ip) + ":" + std::to_string(grpc_port);
  }
  v.phase = PhaseOf(pod, ip, &v.kueue_gated);
  switch (v.phase) {
    case AgentPodPhase::kFailed: v.reason = FailureReason(pod); break;
    case AgentPodPhase::kUnscheduled: v.reason = Explain(PodCondition(pod, "PodScheduled")); break;
    case AgentPodPhase::kStarting: v.reason = ContainerReason(status); break;
    default: break;
  }
  return v;
}

}  // namespace hydra::controller
