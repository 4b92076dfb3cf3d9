#include "controller/agents/agent_pods.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>

#include "controller/agents/pod_state.h"

namespace hydra::controller {
namespace {

using Json = nlohmann::json;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

/// A job as the API server returns it, with a template of two containers.
Json Job() {
  return Json::parse(R"({
    "apiVersion": "hydra.dev/v1alpha1", "kind": "MultiModelJob",
    "metadata": {"name": "sweep", "namespace": "team-a", "uid": "u-1",
                 "labels": {"kueue.x-k8s.io/queue-name": "gpu-spot", "other": "x"}},
    "spec": {"agents": {"maxAgents": 4, "template": {
      "metadata": {"labels": {"team": "nlp"}, "annotations": {"a": "b"}},
      "spec": {
        "nodeSelector": {"cloud.google.com/gke-spot": "true"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "corpus"}}],
        "containers": [
          {"name": "log-shipper", "image": "busybox"},
          {"name": "agent", "image": "hydra:0.9", "args": ["--threads=8"],
           "env": [{"name": "POD_IP", "value": "spoofed"}, {"name": "OMP_PROC_BIND", "value": "1"}],
           "resources": {"limits": {"nvidia.com/gpu": 2}},
           "volumeMounts": [{"name": "data", "mountPath": "/data"}]}]}}}}})");
}

AgentsSpec Spec(int64_t gpus = 2, int64_t min = 0, int64_t max = 4) {
  AgentsSpec a;
  a.gpus_per_agent = gpus;
  a.min_agents = min;
  a.max_agents = max;
  return a;
}

const Json* Find(const Json& list, const std::string& name) {
  for (const auto& e : list) {
    if (e.value("name", "") == name) return &e;
  }
  return nullptr;
}

TEST(AgentPodsTest, APodIsTheTemplateOwnedByTheJobWithTheAgentCompleted) {
  AgentPodOptions o;
  auto pod = AgentPod(Job(), Spec(), 3, o);
  ASSERT_TRUE(pod.ok()) << pod.status();
  const Json& md = (*pod)["metadata"];
  EXPECT_EQ(md["name"], "sweep-agent-3");
  EXPECT_EQ(md["namespace"], "team-a") << "the job's own namespace, never another";
  EXPECT_EQ(md["labels"]["team"], "nlp");
  EXPECT_EQ(md["labels"][kJobLabel], "sweep");
  EXPECT_EQ(md["labels"][kJobUidLabel], "u-1");
  EXPECT_EQ(md["labels"][kAgentIndexLabel], "3");
  EXPECT_EQ(md["labels"][kKueueQueueLabel], "gpu-spot") << "Kueue admits each pod";
  EXPECT_FALSE(md["labels"].contains("other")) << "only Kueue's label comes from the job";
  EXPECT_EQ(md["annotations"]["a"], "b");
  ASSERT_EQ(md["ownerReferences"].size(), 1u);
  const Json& owner = md["ownerReferences"][0];
  EXPECT_EQ(owner["kind"], "MultiModelJob");
  EXPECT_EQ(owner["uid"], "u-1");
  EXPECT_EQ(owner["controller"], true);
  const Json& spec = (*pod)["spec"];
  EXPECT_EQ(spec["nodeSelector"]["cloud.google.com/gke-spot"], "true");
  EXPECT_EQ(spec["tolerations"].size(), 1u);
  EXPECT_EQ(spec["terminationGracePeriodSeconds"], 120);
  EXPECT_EQ(*Find(spec["containers"], "log-shipper"),
            Job()["spec"]["agents"]["template"]["spec"]["containers"][0])
      << "other containers as written";
  const Json& agent = *Find(spec["containers"], "agent");
  EXPECT_EQ(agent["command"], Json::array({"hydra-agent"}));
  const auto args = agent["args"].get<std::vector<std::string>>();
  EXPECT_EQ(args.front(), "--node-name=$(NODE_NAME)");
  EXPECT_EQ(args.back(), "--threads=8") << "the template's args come after the controller's";
  for (const std::string want : {"--grpc-advertise-address=$(POD_IP):9443", "--data-root=/data",
                                 "--checkpoint-root=/checkpoints", "--devices=cuda", "--insecure",
                                 "--dedicated-job=team-a/sweep/u-1"}) {
    EXPECT_NE(std::find(args.begin(), args.end(), want), args.end()) << want;
  }
  const Json* ip = Find(agent["env"], "POD_IP");
  ASSERT_NE(ip, nullptr);
  EXPECT_EQ((*ip)["valueFrom"]["fieldRef"]["fieldPath"], "status.podIP") << "not the spoofed one";
  EXPECT_EQ(std::count_if(agent["env"].begin(), agent["env"].end(),
                          [](const Json& e) { return e["name"] == "POD_IP"; }),
            1);
  EXPECT_NE(Find(agent["env"], "OMP_PROC_BIND"), nullptr);
  EXPECT_EQ((*Find(agent["ports"], "grpc"))["containerPort"], 9443);
  EXPECT_EQ(agent["readinessProbe"]["httpGet"]["path"], "/readyz");
  EXPECT_EQ(agent["resources"]["limits"]["nvidia.com/gpu"], 2);
}

TEST(AgentPodsTest, TlsMountsTheSecretAndPassesItsFiles) {
  AgentPodOptions o;
  o.tls_secret = "hydra-agent-tls";
  o.tls_client_identity = "hydra-controller";
  auto pod = AgentPod(Job(), Spec(/*gpus=*/0), 0, o);
  ASSERT_TRUE(pod.ok()) << pod.status();
  const Json& spec = (*pod)["spec"];
  const Json* volume = Find(spec["volumes"], "hydra-agent-tls");
  ASSERT_NE(volume, nullptr);
  EXPECT_EQ((*volume)["secret"]["secretName"], "hydra-agent-tls");
  EXPECT_NE(Find(spec["volumes"], "data"), nullptr) << "the template's volumes stay";
  const Json& agent = *Find(spec["containers"], "agent");
  const auto args = agent["args"].get<std::vector<std::string>>();
  EXPECT_EQ(std::count(args.begin(), args.end(), "--insecure"), 0);
  EXPECT_EQ(std::count(args.begin(), args.end(), "--devices=cuda"), 0) << "a CPU agent";
  EXPECT_NE(std::find(args.begin(), args.end(), "--tls-client-identity=hydra-controller"),
            args.end());
  EXPECT_NE(Find(agent["volumeMounts"], "hydra-agent-tls"), nullptr);
  EXPECT_NE(Find(agent["volumeMounts"], "data"), nullptr);
}

TEST(AgentPodsTest, TheTemplatesDevicesFlagReplacesTheDefault) {
  Json job = Job();
  job["spec"]["agents"]["template"]["spec"]["containers"][1]["args"] =
      Json::array({"--devices=cuda:0,budget=20Gi"});
  auto pod = AgentPod(job, Spec(), 0, {});
  ASSERT_TRUE(pod.ok()) << pod.status();
  const auto args =
      (*Find((*pod)["spec"]["containers"], "agent"))["args"].get<std::vector<std::string>>();
  EXPECT_EQ(std::count(args.begin(), args.end(), "--devices=cuda"), 0);
  EXPECT_EQ(args.back(), "--devices=cuda:0,budget=20Gi");
}

/// A pod in a given state, as the API server returns it.
Json PodIn(const std::string& phase) {
  return Json{{"metadata", {{"name", "sweep-agent-2"}, {"labels", {{kAgentIndexLabel, "2"}}}}},
              {"spec", {{"nodeName", "n1"}}},
              {"status", {{"phase", phase}, {"podIP", "10.4.0.9"}}}};
}

TEST(PodStateTest, EachPodIsInOnePhase) {
  Json p = PodIn("Pending");
  p["spec"].erase("nodeName");
  p["status"] = {{"phase", "Pending"},
                 {"conditions",
                  {{{"type", "PodScheduled"},
                    {"status", "False"},
                    {"reason", "Unschedulable"},
                    {"message", "0/2 nodes are available: 2 Insufficient nvidia.com/gpu."}}}}};
  AgentPodView v = ObserveAgentPod(p, 9443);
  EXPECT_EQ(v.phase, AgentPodPhase::kUnscheduled);
  EXPECT_EQ(v.index, 2);
  EXPECT_EQ(v.reason, "Unschedulable: 0/2 nodes are available: 2 Insufficient nvidia.com/gpu.");
  EXPECT_TRUE(v.endpoint.empty());

  p["spec"]["schedulingGates"] = Json::array({{{"name", kKueueAdmissionGate}}});
  v = ObserveAgentPod(p, 9443);
  EXPECT_EQ(v.phase, AgentPodPhase::kGated);
  EXPECT_TRUE(v.kueue_gated);

  p = PodIn("Running");
  v = ObserveAgentPod(p, 9443);
  EXPECT_EQ(v.phase, AgentPodPhase::kStarting) << "running, not Ready yet";
  EXPECT_EQ(v.endpoint, "10.4.0.9:9443");
  p["status"]["conditions"] = Json::array({{{"type", "Ready"}, {"status", "True"}}});
  EXPECT_EQ(ObserveAgentPod(p, 9443).phase, AgentPodPhase::kReady);
  p["status"]["podIP"] = "fd00::9";
  EXPECT_EQ(ObserveAgentPod(p, 9443).endpoint, "[fd00::9]:9443");

  p["metadata"]["deletionTimestamp"] = "2026-11-24T00:00:00Z";
  EXPECT_EQ(ObserveAgentPod(p, 9443).phase, AgentPodPhase::kTerminating);

  p = PodIn("Failed");
  p["status"]["reason"] = "Evicted";
  p["status"]["message"] = "The node was low on resource: memory.";
  v = ObserveAgentPod(p, 9443);
  EXPECT_EQ(v.phase, AgentPodPhase::kFailed);
  EXPECT_FALSE(v.Live());
  EXPECT_EQ(v.reason, "Evicted: The node was low on resource: memory.");

  p = PodIn("Running");
  p["status"]["containerStatuses"] = Json::array(
      {{{"name", "agent"}, {"state", {{"waiting", {{"reason", "CrashLoopBackOff"}}}}}}});
  v = ObserveAgentPod(p, 9443);
  EXPECT_EQ(v.phase, AgentPodPhase::kStarting);
  EXPECT_EQ(v.reason, "agent: CrashLoopBackOff");

  p["metadata"]["labels"][kAgentIndexLabel] = "x7";
  EXPECT_EQ(ObserveAgentPod(p, 9443).index, -1) << "not ours to number";
}

TEST(AgentPodsTest, AJobWithoutWhatAPodNeedsIsRefused) {
  Json job = Job();
  job["metadata"].erase("uid");
  EXPECT_THAT(AgentPod(job, Spec(), 0, {}).status().message(), HasSubstr("uid"));
  job = Job();
  job["spec"]["agents"].erase("template");
  EXPECT_THAT(AgentPod(job, Spec(), 0, {}).status().message(),
              HasSubstr("spec.agents.template.spec is missing"));
  AgentsSpec other = Spec();
  other.container = "trainer";
  EXPECT_THAT(AgentPod(Job(), other, 0, {}).status().message(), HasSubstr("no container trainer"));
}

TEST(AgentPodsTest, DesiredAgentsAreTheBusyOnesAndRoomForTheWaitingTrials) {
  EXPECT_EQ(DesiredAgents(0, 0, Spec(2, 0, 4)), 0) << "scale to zero";
  EXPECT_EQ(DesiredAgents(0, 0, Spec(2, 1, 4)), 1) << "minAgents stay";
  EXPECT_EQ(DesiredAgents(0, 3, Spec(2, 0, 4)), 2) << "two GPUs each";
  EXPECT_EQ(DesiredAgents(0, 4, Spec(2, 0, 4)), 2);
  EXPECT_EQ(DesiredAgents(0, 100, Spec(2, 0, 4)), 4) << "at most maxAgents";
  EXPECT_EQ(DesiredAgents(0, 3, Spec(0, 0, 8)), 3) << "a CPU agent trains one trial at a time";
  EXPECT_EQ(DesiredAgents(1, 0, Spec(1, 0, 4)), 1)
      << "the tail: the last trials on one agent, another idle one is not wanted";
  EXPECT_EQ(DesiredAgents(2, 3, Spec(1, 0, 4)), 4) << "a lost pod's trials want new ones";
}

TEST(AgentPodsTest, WaitingPodsAreRemovedBeforeServingOnes) {
  const std::vector<AgentPodLoad> pods = {{"j-agent-0", 0, 0, AgentPodPhase::kUnscheduled},
                                          {"j-agent-1", 1, 0, AgentPodPhase::kReady},
                                          {"j-agent-2", 2, 0, AgentPodPhase::kReady}};
  EXPECT_THAT(AgentPodsToRemove(pods, 2), ElementsAre("j-agent-0"))
      << "a pending pod keeps an autoscaler adding nodes for nothing";
  EXPECT_THAT(AgentPodsToRemove(pods, 1), ElementsAre("j-agent-0", "j-agent-2"));
}

TEST(AgentPodsTest, PodsFurthestFromServingGoFirst) {
  // Kueue admitted agent-2 (it starts on a node) while agent-1 still waits at the gate: the
  // gated one goes, whatever the indices (a starting pod serves in seconds and holds the quota).
  const std::vector<AgentPodLoad> pods = {{"j-agent-0", 0, 1, AgentPodPhase::kReady},
                                          {"j-agent-1", 1, 0, AgentPodPhase::kGated},
                                          {"j-agent-2", 2, 0, AgentPodPhase::kStarting},
                                          {"j-agent-3", 3, 0, AgentPodPhase::kUnscheduled}};
  EXPECT_THAT(AgentPodsToRemove(pods, 3), ElementsAre("j-agent-1"));
  EXPECT_THAT(AgentPodsToRemove(pods, 2), ElementsAre("j-agent-1", "j-agent-3"));
  EXPECT_THAT(AgentPodsToRemove(pods, 1), ElementsAre("j-agent-1", "j-agent-3", "j-agent-2"));
}

TEST(AgentPodsTest, OnlyIdlePodsAreRemovedHighestIndexFirst) {
  const std::vector<AgentPodLoad> pods = {
      {"j-agent-0", 0, 1}, {"j-agent-1", 1, 0}, {"j-agent-2", 2, 2}, {"j-agent-3", 3, 0}};
  EXPECT_THAT(AgentPodsToRemove(pods, 3), ElementsAre("j-agent-3"));
  EXPECT_THAT(AgentPodsToRemove(pods, 0), ElementsAre("j-agent-3", "j-agent-1"))
      << "busy pods stay until their trials end or move";
  EXPECT_TRUE(AgentPodsToRemove(pods, 4).empty());
  EXPECT_THAT(FreeAgentIndices({{"j-agent-0", 0, 1}, {"j-agent-2", 2, 0}}, 3),
              ElementsAre(1, 3, 4));
}

}  // namespace
}  // namespace hydra::controller
