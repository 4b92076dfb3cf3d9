// The reconciler's phases against an in-memory API server (fakes::FakeKubeClient) and agents
// faked at the gRPC boundary (fakes::FakeAgentPool): job-owned agent pods (spec.agents) are
// created for the runnable trials, used once Ready and confirmed, replaced when they fail or
// vanish (their trials requeued at once), removed when idle in the tail and when the job ends or
// is suspended, and reported as Queued while Kueue admits none; the shared pool's rules stay.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "controller/reconciler/conditions.h"
#include "controller/reconciler/pass.h"
#include "controller/reconciler/phases.h"
#include "tests/fakes/fake_agent_pool.h"
#include "tests/fakes/fake_kube_client.h"
#include "tests/fakes/test_certs.h"

namespace hydra::controller {
namespace {

namespace cond = conditions;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using Json = nlohmann::json;

constexpr char kNs[] = "team";
constexpr char kJob[] = "sweep";
constexpr char kUid[] = "uid-job";

Json JobObject(bool with_agents, int max_agents = 2) {
  Json job = Json::parse(R"({
    "apiVersion": "hydra.dev/v1alpha1", "kind": "MultiModelJob",
    "metadata": {"name": "sweep", "uid": "uid-job", "generation": 1},
    "spec": {
      "model": {"family": "gpt2", "nLayer": 2, "nEmbd": 32, "nHead": 2, "contextLength": 32},
      "dataset": {"path": "data/corpus.txt"},
      "search": {"grid": {"learningRate": [0.001, 0.002, 0.003]}},
      "training": {"steps": 10, "batchSize": 8}}})");
  if (with_agents) {
    job["spec"]["agents"] = {
        {"maxAgents", max_agents},
        {"template",
         {{"spec",
           {{"containers", Json::array({{{"name", "agent"}, {"image", "hydra:test"}}})}}}}}};
  }
  return job;
}

ReconcilerOptions Options() {
  ReconcilerOptions o;
  o.data_root = "/data";
  o.checkpoint_root = "/ckpt";
  return o;
}

class PhasesTest : public ::testing::Test {
 protected:
  void PutJob(Json job) { kube_.Put(kMultiModelJobs, kNs, std::move(job)); }
  /// One whole pass, as the controller runs it.
  ReconcileResult Reconcile() {
    auto r = reconciler_.Reconcile(kNs, kJob);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : ReconcileResult{};
  }
  JobStatus Status() {
    return JobStatusFromJson(kube_.Peek(kMultiModelJobs, kNs, kJob).value("status", Json()));
  }
  const Condition& Cond(const JobStatus& s, const char* type) {
    static const Condition kNone{"none", false, "", "", 0, ""};
    const Condition* c = FindCondition(s.conditions, type);
    return c == nullptr ? kNone : *c;
  }
  std::vector<std::string> Pods() { return kube_.Names(kube::kPods, kNs); }
  /// The scheduler and kubelet's work: bound to `node`, Running and Ready at `ip`, its agent
  /// serving this job only.
  void MakeReady(const std::string& pod, const std::string& node, const std::string& ip) {
    Json p = kube_.Peek(kube::kPods, kNs, pod);
    ASSERT_FALSE(p.is_null()) << pod;
    p["spec"]["nodeName"] = node;
    p["status"] = {{"phase", "Running"},
                   {"podIP", ip},
                   {"conditions", Json::array({{{"type", "Ready"}, {"status", "True"}}})}};
    kube_.Put(kube::kPods, kNs, p);
    agents_.AddPodAgent(ip + ":9443", node, kNs, kJob, kUid);
  }
  /// Event reasons recorded so far, with their messages.
  std::vector<std::string> Events() {
    std::vector<std::string> out;
    for (const auto& n : kube_.Names(kube::kEvents, kNs)) {
      const Json e = kube_.Peek(kube::kEvents, kNs, n);
      out.push_back(e.value("reason", "") + ": " + e.value("message", ""));
    }
    return out;
  }
  bool HasEvent(const std::string& reason, const std::string& text) {
    for (const auto& e : Events()) {
      if (e.rfind(reason + ": ", 0) == 0 && e.find(text) != std::string::npos) return true;
    }
    return false;
  }
  /// The trials' agents, by trial name.
  std::map<std::string, std::string> Placed() {
    std::map<std::string, std::string> out;
    for (const auto& t : Status().trials) out[t.name] = t.agent_endpoint;
    return out;
  }

  fakes::FakeKubeClient kube_;
  fakes::FakeAgentPool agents_;
  ReconcilerOptions options_ = Options();
  Reconciler reconciler_{&kube_, &agents_, &agents_, options_};
};

TEST_F(PhasesTest, AJobWithAgentsGetsItsOwnPodsForItsRunnableTrials) {
  PutJob(JobObject(true));
  Reconcile();
  EXPECT_THAT(Pods(), ElementsAre("sweep-agent-0", "sweep-agent-1")) << "3 trials, maxAgents 2";
  const Json pod = kube_.Peek(kube::kPods, kNs, "sweep-agent-0");
  EXPECT_EQ(pod["metadata"]["ownerReferences"][0]["uid"], kUid);
  EXPECT_EQ(pod["metadata"]["labels"][kJobUidLabel], kUid);
  EXPECT_THAT(pod["spec"]["containers"][0]["args"].get<std::vector<std::string>>(),
              Contains("--dedicated-job=team/sweep/uid-job"));
  const JobStatus s = Status();
  ASSERT_TRUE(s.agents);
  EXPECT_EQ(s.agents->desired, 2);
  EXPECT_EQ(s.agents->pods, 2);
  EXPECT_EQ(s.agents->ready, 0);
  EXPECT_FALSE(Cond(s, cond::kReady).status);
  EXPECT_THAT(s.trials[0].message, HasSubstr("the job's agent pods are 2 Unscheduled"));
  EXPECT_TRUE(HasEvent(cond::kEventAgentPodsCreated, "sweep-agent-0, sweep-agent-1"));
  EXPECT_THAT(agents_.calls(), IsEmpty()) << "no agent is used before its pod is Ready";
  // A second pass with nothing changed creates nothing more.
  Reconcile();
  EXPECT_EQ(Pods().size(), 2u);
}

TEST_F(PhasesTest, ReadyPodsConfirmedByTheirAgentsGetTheTrials) {
  PutJob(JobObject(true));
  Reconcile();
  MakeReady("sweep-agent-0", "node-a", "10.1.0.1");
  MakeReady("sweep-agent-1", "node-b", "10.1.0.2");
  Reconcile();
  std::set<std::string> used;
  for (const auto& [trial, ep] : Placed()) used.insert(ep);
  EXPECT_THAT(used, ElementsAre("10.1.0.1:9443", "10.1.0.2:9443"));
  const JobStatus s = Status();
  EXPECT_EQ(s.agents->ready, 2);
  EXPECT_TRUE(Cond(s, cond::kReady).status);
  EXPECT_EQ(s.trials[0].attempt, 1);
  // The manifest names no shardBoundaries: each agent plans the trial for its own devices, and
  // the status shows no plan until the agent reports its own.
  for (const auto& [trial, ep] : Placed()) {
    EXPECT_EQ(agents_.LastAssignment(trial).shard_plan().shards_size(), 0) << trial;
  }
  EXPECT_FALSE(s.trials[0].shard_plan);
}

TEST_F(PhasesTest, AReadyPodTakesATrialPerDeviceWhileTheJobsOtherPodsStart) {
  PutJob(JobObject(true, 3));
  Reconcile();
  ASSERT_EQ(Pods().size(), 3u);
  MakeReady("sweep-agent-0", "node-a", "10.1.0.1");
  agents_.HideTrials("10.1.0.1:9443", true);  // its polled report lags behind assignments
  Reconcile();
  Reconcile();
  EXPECT_EQ(agents_.TrialsOn("10.1.0.1:9443").size(), 1u)
      << "the other two trials wait for the pods made for them";
  agents_.HideTrials("10.1.0.1:9443", false);
  MakeReady("sweep-agent-1", "node-b", "10.1.0.2");
  MakeReady("sweep-agent-2", "node-c", "10.1.0.3");
  Reconcile();
  for (const auto* ep : {"10.1.0.1:9443", "10.1.0.2:9443", "10.1.0.3:9443"}) {
    EXPECT_EQ(agents_.TrialsOn(ep).size(), 1u) << ep;
  }
}

TEST_F(PhasesTest, AReadyPodWhoseAgentHasNotAnsweredCountsAsStarting) {
  // Both pods are Ready, but one agent has not answered yet (it is still listening or its TLS is
  // being set up): the answering one takes a trial per device, not every trial, or the other
  // pod would come up idle and be deleted at once.
  PutJob(JobObject(true, 2));
  Reconcile();
  ASSERT_EQ(Pods().size(), 2u);
  MakeReady("sweep-agent-0", "node-a", "10.1.0.1");
  MakeReady("sweep-agent-1", "node-b", "10.1.0.2");
  agents_.SetReachable("10.1.0.1:9443", false);
  agents_.SetReachable("10.1.0.2:9443", false);
  Reconcile();
  // The trials say why they wait: Ready pods whose agents do not answer, and the agent's error.
  EXPECT_THAT(Status().trials[0].message,
              AllOf(HasSubstr("the job's agent pods are 2 Ready"), HasSubstr("10.1.0.1:9443")));
  EXPECT_THAT(agents_.calls(), IsEmpty());
  agents_.SetReachable("10.1.0.1:9443", true);
  agents_.HideTrials("10.1.0.1:9443", true);
  Reconcile();
  Reconcile();
  EXPECT_EQ(agents_.TrialsOn("10.1.0.1:9443").size(), 1u);
  EXPECT_EQ(Pods().size(), 2u) << "the silent pod's agent is waited for, not deleted";
  agents_.HideTrials("10.1.0.1:9443", false);
  agents_.SetReachable("10.1.0.2:9443", true);
  Reconcile();
  EXPECT_EQ(agents_.TrialsOn("10.1.0.2:9443").size(), 1u);
}

TEST_F(PhasesTest, APodWhoseAgentServesAnotherJobIsNotUsed) {
  PutJob(JobObject(true, 1));
  Reconcile();
  MakeReady("sweep-agent-0", "node-a", "10.1.0.1");
  // The pod's IP now answers as another job's agent (an address reused by another tenant).
  agents_.AddPodAgent("10.1.0.1:9443", "node-a", "other-team", kJob, "uid-other");
  Reconcile();
  EXPECT_THAT(agents_.calls(), IsEmpty());
  for (const auto& [trial, ep] : Placed()) EXPECT_EQ(ep, "") << trial;
}

TEST_F(PhasesTest, AFailedPodIsReplacedAndItsTrialsMoveAtOnce) {
  PutJob(JobObject(true, 1));
  Reconcile();
  MakeReady("sweep-agent-0", "node-a", "10.1.0.1");
  Reconcile();
  ASSERT_EQ(agents_.TrialsOn("10.1.0.1:9443").size(), 3u);
  // A spot reclaim: the node is gone and the pod garbage collector failed the pod.
  Json pod = kube_.Peek(kube::kPods, kNs, "sweep-agent-0");
  pod["status"]["phase"] = "Failed";
  pod["status"]["conditions"] = Json::array({{{"type", "DisruptionTarget"},
                                              {"status", "True"},
                                              {"reason", "DeletionByPodGC"},
                                              {"message", "node node-a gone"}}});
  kube_.Put(kube::kPods, kNs, pod);
  agents_.SetReachable("10.1.0.1:9443", false, 1);  // silent for a second only: no waiting
  const ReconcileResult r = Reconcile();
  EXPECT_EQ(r.restarts_by_reason.at("agent_lost"), 3);
  for (const auto& t : Status().trials) {
    EXPECT_EQ(t.state, TrialState::kPending) << t.name;
    EXPECT_EQ(t.restarts, 1) << t.name;
    EXPECT_TRUE(t.agent_endpoint.empty()) << t.name;
  }
  EXPECT_TRUE(HasEvent(cond::kEventTrialRequeued,
                       "its agent pod sweep-agent-0 failed: DeletionByPodGC: node node-a gone"))
      << ::testing::PrintToString(Events());
  EXPECT_THAT(Status().trials[0].message, HasSubstr("waiting for an agent"));
  // The failed pod is deleted (it stays Terminating on its node) and replaced.
  EXPECT_THAT(Pods(), ElementsAre("sweep-agent-0", "sweep-agent-1"));
  EXPECT_TRUE(
      kube_.Peek(kube::kPods, kNs, "sweep-agent-0")["metadata"].contains("deletionTimestamp"));
  EXPECT_TRUE(HasEvent(cond::kEventAgentPodFailed, "sweep-agent-0 failed (DeletionByPodGC"));
  // The replacement serves: the trials resume there.
  kube_.FinishDeletion(kube::kPods, kNs, "sweep-agent-0");
  MakeReady("sweep-agent-1", "node-b", "10.1.0.9");
  Reconcile();
  for (const auto& [trial, ep] : Placed()) EXPECT_EQ(ep, "10.1.0.9:9443") << trial;
  EXPECT_EQ(Status().trials[0].attempt, 2);
}

TEST_F(PhasesTest, APodThatVanishedLosesItsTrialsAndIsReplaced) {
  PutJob(JobObject(true, 1));
  Reconcile();
  MakeReady("sweep-agent-0", "node-a", "10.1.0.1");
  Reconcile();
  kube_.FinishDeletion(kube::kPods, kNs, "sweep-agent-0");  // force-deleted with its node
  Reconcile();
  EXPECT_TRUE(HasEvent(cond::kEventTrialRequeued, "its agent pod is gone"));
  EXPECT_EQ(Status().trials[0].restarts, 1);
  EXPECT_THAT(Pods(), ElementsAre("sweep-agent-0")) << "the lowest free index again";
  EXPECT_EQ(Status().trials[0].state, TrialState::kPending);
  // Its address is nobody's now: the next pass stops polling it.
  Reconcile();
  EXPECT_THAT(agents_.forgotten(), ElementsAre("10.1.0.1:9443"));
  EXPECT_THAT(agents_.tracked(), Not(Contains("10.1.0.1:9443")));
}

TEST_F(PhasesTest, AReadyPodsAgentThatIsSilentKeepsItsTrialsForABlip) {
  PutJob(JobObject(true, 1));
  Reconcile();
  MakeReady("sweep-agent-0", "node-a", "10.1.0.1");
  Reconcile();
  agents_.SetReachable("10.1.0.1:9443", false, 1e6);
  Reconcile();
  for (const auto& [trial, ep] : Placed()) EXPECT_EQ(ep, "10.1.0.1:9443") << trial;
  EXPECT_EQ(Cond(Status(), cond::kDegraded).reason, cond::kAgentUnreachable);
}

TEST_F(PhasesTest, IdlePodsGoInTheTailAndEveryPodGoesWhenTheJobEnds) {
  PutJob(JobObject(true, 3));
  Reconcile();
  MakeReady("sweep-agent-0", "node-a", "10.1.0.1");
  MakeReady("sweep-agent-1", "node-b", "10.1.0.2");
  MakeReady("sweep-agent-2", "node-c", "10.1.0.3");
  Reconcile();
  // Two trials end; the third trains on: one agent is enough.
  const auto placed = Placed();
  std::string busy_trial, busy_ep;
  for (const auto& [trial, ep] : placed) {
    if (busy_trial.empty()) {
      busy_trial = trial;
      busy_ep = ep;
      agents_.SetTrialState(ep, trial, agent::v1::RUNNING, 5);
    } else {
      agents_.SetTrialState(ep, trial, agent::v1::SUCCEEDED, 10);
    }
  }
  Reconcile();
  std::vector<std::string> left;
  for (const auto& n : Pods()) {
    if (!kube_.Peek(kube::kPods, kNs, n)["metadata"].contains("deletionTimestamp")) {
      left.push_back(n);
    }
  }
  ASSERT_EQ(left.size(), 1u) << "only the busy agent's pod stays";
  EXPECT_EQ(kube_.Peek(kube::kPods, kNs, left[0])["status"]["podIP"].get<std::string>() + ":9443",
            busy_ep);
  EXPECT_TRUE(HasEvent(cond::kEventAgentPodsDeleted, "the job's remaining trials need 1 of them"));
  // The last trial ends: every pod goes, and the job is requeued until they are gone.
  agents_.SetTrialState(busy_ep, busy_trial, agent::v1::SUCCEEDED, 10);
  EXPECT_GT(Reconcile().requeue_after.count(), 0);
  for (const auto& n : Pods()) {
    EXPECT_TRUE(kube_.Peek(kube::kPods, kNs, n)["metadata"].contains("deletionTimestamp")) << n;
    kube_.FinishDeletion(kube::kPods, kNs, n);
  }
  EXPECT_TRUE(Cond(Status(), cond::kComplete).status);
  EXPECT_EQ(Reconcile().requeue_after.count(), 0) << "nothing left to do";
  EXPECT_THAT(agents_.tracked(), IsEmpty()) << "the finished trials' agents are not polled";
  EXPECT_THAT(agents_.forgotten(), Contains(busy_ep));
  EXPECT_THAT(Pods(), IsEmpty());
}

TEST_F(PhasesTest, PodsWaitingForKueueMakeTheJobQueued) {
  Json job = JobObject(true);
  job["metadata"]["labels"] = {{kKueueQueueLabel, "gpus"}};
  PutJob(job);
  Reconcile();
  // Kueue's webhook gates every pod of its queue until it admits it.
  for (const auto& n : Pods()) {
    Json p = kube_.Peek(kube::kPods, kNs, n);
    EXPECT_EQ(p["metadata"]["labels"][kKueueQueueLabel], "gpus");
    p["spec"]["schedulingGates"] = Json::array({{{"name", kKueueAdmissionGate}}});
    kube_.Put(kube::kPods, kNs, p);
  }
  Reconcile();
  JobStatus s = Status();
  EXPECT_TRUE(Cond(s, cond::kQueued).status);
  EXPECT_EQ(Cond(s, cond::kQueued).reason, cond::kAwaitingAdmission);
  EXPECT_THAT(Cond(s, cond::kQueued).message, HasSubstr("2 agent pods wait for Kueue"));
  EXPECT_THAT(Cond(s, cond::kQueued).message, HasSubstr("queue gpus"));
  EXPECT_EQ(s.agents->gated, 2);
  // Kueue admits one: the job is no longer queued, and trains on it once Ready.
  Json p = kube_.Peek(kube::kPods, kNs, "sweep-agent-0");
  p["spec"].erase("schedulingGates");
  kube_.Put(kube::kPods, kNs, p);
  MakeReady("sweep-agent-0", "node-a", "10.1.0.1");
  Reconcile();
  s = Status();
  EXPECT_FALSE(Cond(s, cond::kQueued).status);
  EXPECT_EQ(Cond(s, cond::kQueued).message, "1 of 2 agent pods admitted");
  EXPECT_EQ(agents_.TrialsOn("10.1.0.1:9443").size(), 1u)
      << "a trial per device: the others wait for the gated pod, or for this one";
  // More quota: the second pod is admitted and serves; it gets a waiting trial.
  p = kube_.Peek(kube::kPods, kNs, "sweep-agent-1");
  p["spec"].erase("schedulingGates");
  kube_.Put(kube::kPods, kNs, p);
  MakeReady("sweep-agent-1", "node-b", "10.1.0.2");
  Reconcile();
  EXPECT_EQ(agents_.TrialsOn("10.1.0.2:9443").size(), 1u);
  // Every pod the job may have serves (maxAgents 2): the last trial shares a device.
  Reconcile();
  EXPECT_EQ(agents_.TrialsOn("10.1.0.1:9443").size() + agents_.TrialsOn("10.1.0.2:9443").size(),
            3u);
}

TEST_F(PhasesTest, SuspendTakesThePodsDownAfterTheCheckpointsAndResumeBringsThemBack) {
  PutJob(JobObject(true, 1));
  Reconcile();
  MakeReady("sweep-agent-0", "node-a", "10.1.0.1");
  Reconcile();
  Json job = kube_.Peek(kMultiModelJobs, kNs, kJob);
  job["spec"]["suspend"] = true;
  kube_.Put(kMultiModelJobs, kNs, job);
  Reconcile();  // tells the agent to checkpoint and stop each trial; the pod still holds them
  EXPECT_EQ(agents_.calls().size(), 6u) << "3 assignments, 3 suspensions";
  EXPECT_FALSE(
      kube_.Peek(kube::kPods, kNs, "sweep-agent-0")["metadata"].contains("deletionTimestamp"));
  Reconcile();  // they are Interrupted now: the idle pod goes
  for (const auto& t : Status().trials) EXPECT_EQ(t.state, TrialState::kInterrupted) << t.name;
  EXPECT_TRUE(
      kube_.Peek(kube::kPods, kNs, "sweep-agent-0")["metadata"].contains("deletionTimestamp"));
  EXPECT_EQ(Status().agents->desired, 0);
  kube_.FinishDeletion(kube::kPods, kNs, "sweep-agent-0");
  job = kube_.Peek(kMultiModelJobs, kNs, kJob);
  job["spec"]["suspend"] = false;
  kube_.Put(kMultiModelJobs, kNs, job);
  Reconcile();
  EXPECT_THAT(Pods(), ElementsAre("sweep-agent-0"));
  MakeReady("sweep-agent-0", "node-b", "10.1.0.5");
  Reconcile();
  for (const auto& [trial, ep] : Placed()) EXPECT_EQ(ep, "10.1.0.5:9443") << trial;
}

TEST_F(PhasesTest, DeletingTheJobCancelsItsTrialsAndDeletesItsPods) {
  PutJob(JobObject(true, 1));
  Reconcile();
  MakeReady("sweep-agent-0", "node-a", "10.1.0.1");
  Reconcile();
  ASSERT_TRUE(kube_.Delete(kMultiModelJobs, kNs, kJob).ok());  // held by the finalizer
  Reconcile();
  int cancels = 0;
  for (const auto& c : agents_.calls()) cancels += c.rfind("Cancel 10.1.0.1:9443", 0) == 0;
  EXPECT_EQ(cancels, 3);
  EXPECT_TRUE(
      kube_.Peek(kube::kPods, kNs, "sweep-agent-0")["metadata"].contains("deletionTimestamp"));
  EXPECT_TRUE(kube_.Peek(kMultiModelJobs, kNs, kJob).is_null()) << "the finalizer is gone";
  EXPECT_TRUE(HasEvent(cond::kEventAgentPodsDeleted, "1 agent pods deleted with the job"));
}

TEST_F(PhasesTest, PodsThatCannotBeCreatedDegradeTheJobWithTheServersReason) {
  PutJob(JobObject(true, 1));
  kube_.FailNext("create", kube::kPods,
                 PermissionDeniedError("POST pods: 403 Forbidden: pods is forbidden"));
  Reconcile();
  const JobStatus s = Status();
  EXPECT_TRUE(Cond(s, cond::kDegraded).status);
  EXPECT_EQ(Cond(s, cond::kDegraded).reason, cond::kAgentPodsFailing);
  EXPECT_THAT(Cond(s, cond::kDegraded).message,
              HasSubstr("cannot create agent pod sweep-agent-0: POST pods: 403 Forbidden"));
  EXPECT_TRUE(HasEvent(cond::kEventAgentPodsNotCreated, "403 Forbidden"));
  Reconcile();  // the next pass succeeds
  EXPECT_THAT(Pods(), ElementsAre("sweep-agent-0"));
  EXPECT_EQ(Cond(Status(), cond::kDegraded).reason, cond::kWaitingForCapacity);
}

TEST_F(PhasesTest, AnInvalidSpecFailsTheJobAndCreatesNoPods) {
  Json job = JobObject(true);
  job["spec"]["training"]["steps"] = 0;
  PutJob(job);
  Reconcile();
  const JobStatus s = Status();
  EXPECT_TRUE(Cond(s, cond::kFailed).status);
  EXPECT_EQ(Cond(s, cond::kFailed).reason, cond::kInvalidSpec);
  EXPECT_THAT(Pods(), IsEmpty());
}

TEST_F(PhasesTest, TheSharedPoolIsUsedWithoutSpecAgentsAndLosesAnAgentOnlyOnBothSignals) {
  PutJob(JobObject(false));
  agents_.AddAgent("10.0.0.1:9443", "node-a");
  Reconcile();
  EXPECT_THAT(Pods(), IsEmpty());
  for (const auto& [trial, ep] : Placed()) EXPECT_EQ(ep, "10.0.0.1:9443") << trial;
  EXPECT_FALSE(Status().agents) << "status.agents only with spec.agents";
  // Silent for long, but Prometheus still lists it: a blip, nothing moves.
  agents_.SetReachable("10.0.0.1:9443", false, 1e6);
  Reconcile();
  for (const auto& [trial, ep] : Placed()) EXPECT_EQ(ep, "10.0.0.1:9443") << trial;
}

// Two agents of the shared pool, one of them seen a moment ago and not yet heard from: the
// trials wait for its first answer instead of all going to the agent that answered first.
TEST_F(PhasesTest, PlacementWaitsForTheFirstAnswerOfAnAgentJustSeen) {
  PutJob(JobObject(false));
  agents_.AddAgent("10.0.0.1:9443", "node-a");
  agents_.AddAgent("10.0.0.2:9443", "node-b");
  agents_.SetFirstAnswerDue("10.0.0.2:9443", true);
  Reconcile();
  for (const auto& [trial, ep] : Placed()) EXPECT_EQ(ep, "") << trial;
  EXPECT_THAT(Status().trials[0].message,
              HasSubstr("waiting for the first answer of agent node-b at 10.0.0.2:9443"));
  agents_.SetFirstAnswerDue("10.0.0.2:9443", false);
  Reconcile();
  EXPECT_EQ(agents_.TrialsOn("10.0.0.1:9443").size(), 2u);
  EXPECT_EQ(agents_.TrialsOn("10.0.0.2:9443").size(), 1u);
}

TEST(PhasesTlsTest, EachJobGetsACertificateOfItsOwnAndItsAgentsAreCheckedAgainstIt) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("phases-tls-" + std::to_string(::getpid()));
  ASSERT_TRUE(fakes::MakeTestCertificates(dir));
  auto ca = LoadCertificateAuthority((dir / "ca.pem").string(), (dir / "ca.key").string());
  ASSERT_TRUE(ca.ok());
  fakes::FakeKubeClient kube;
  fakes::FakeAgentPool agents;
  ReconcilerOptions options = Options();
  options.agent_pod_ca = std::make_shared<CertificateAuthority>(*ca);
  options.agent_pods.tls_client_identity = "hydra-controller";
  Reconciler reconciler(&kube, &agents, &agents, options);
  // Another Secret of the name the job's certificate goes to, not the job's: no pods, Degraded.
  kube.Put(kube::kSecrets, kNs, Json{{"metadata", {{"name", "sweep-agent-tls"}}}});
  kube.Put(kMultiModelJobs, kNs, JobObject(true, 1));
  ASSERT_TRUE(reconciler.Reconcile(kNs, kJob).ok());
  EXPECT_TRUE(kube.Names(kube::kPods, kNs).empty());
  JobStatus s = JobStatusFromJson(kube.Peek(kMultiModelJobs, kNs, kJob).value("status", Json()));
  EXPECT_THAT(FindCondition(s.conditions, cond::kDegraded)->message,
              HasSubstr("Secret sweep-agent-tls exists and is not this job's"));
  kube.FinishDeletion(kube::kSecrets, kNs, "sweep-agent-tls");
  ASSERT_TRUE(reconciler.Reconcile(kNs, kJob).ok());
  // The job's Secret: its certificate for its own name, owned by the job.
  const Json secret = kube.Peek(kube::kSecrets, kNs, "sweep-agent-tls");
  ASSERT_FALSE(secret.is_null());
  EXPECT_EQ(secret["type"], "kubernetes.io/tls");
  EXPECT_EQ(secret["metadata"]["ownerReferences"][0]["uid"], kUid);
  auto pem = Base64Decode(secret["data"]["tls.crt"].get<std::string>());
  ASSERT_TRUE(pem.ok());
  EXPECT_TRUE(CertificateNotAfter(*pem).ok());
  EXPECT_EQ(*Base64Decode(secret["data"]["ca.crt"].get<std::string>()), ca->cert_pem);
  // Its pod mounts it and serves mutual TLS.
  const Json pod = kube.Peek(kube::kPods, kNs, "sweep-agent-0");
  EXPECT_EQ(pod["spec"]["volumes"][0]["secret"]["secretName"], "sweep-agent-tls");
  const auto args = pod["spec"]["containers"][0]["args"].get<std::vector<std::string>>();
  EXPECT_THAT(args, Contains("--tls-cert-file=/etc/hydra/tls/tls.crt"));
  EXPECT_THAT(args, Contains("--tls-client-identity=hydra-controller"));
  EXPECT_THAT(args, Not(Contains("--insecure")));
  // Once it has an address, the controller expects the job's name there.
  Json p = pod;
  p["spec"]["nodeName"] = "node-a";
  p["status"] = {{"phase", "Running"},
                 {"podIP", "10.1.0.1"},
                 {"conditions", Json::array({{{"type", "Ready"}, {"status", "True"}}})}};
  kube.Put(kube::kPods, kNs, p);
  agents.AddPodAgent("10.1.0.1:9443", "node-a", kNs, kJob, kUid);
  ASSERT_TRUE(reconciler.Reconcile(kNs, kJob).ok());
  EXPECT_EQ(agents.server_names()["10.1.0.1:9443"], "sweep.team.agents.hydra.dev");
  EXPECT_EQ(agents.TrialsOn("10.1.0.1:9443").size(), 3u);
  // Deleting the job deletes its Secret too.
  ASSERT_TRUE(kube.Delete(kMultiModelJobs, kNs, kJob).ok());
  ASSERT_TRUE(reconciler.Reconcile(kNs, kJob).ok());
  EXPECT_TRUE(kube.Peek(kube::kSecrets, kNs, "sweep-agent-tls").is_null());
  fs::remove_all(dir);
}

TEST_F(PhasesTest, EachPhaseAlone) {
  PutJob(JobObject(true, 2));
  const ReconcileContext ctx{&kube_,   &agents_,
                             &agents_, &options_,
                             nullptr,  [] { return std::string("2026-11-24T00:00:00Z"); }};
  AgentMemory memory;
  ReconcileContext c = ctx;
  c.memory = &memory;
  Pass pass;
  ASSERT_TRUE(ReadJob(c, kNs, kJob, pass).ok());
  auto fin = EnsureFinalizer(c, pass);
  ASSERT_TRUE(fin.ok() && *fin);
  EXPECT_EQ(kube_.Peek(kMultiModelJobs, kNs, kJob)["metadata"]["finalizers"][0], cond::kFinalizer);
  auto loaded = LoadTrials(c, pass);
  ASSERT_TRUE(loaded.ok() && *loaded);
  EXPECT_EQ(pass.entries.size(), 3u);
  ASSERT_TRUE(pass.own_agents);
  ObserveAgents(c, pass);
  EXPECT_TRUE(pass.inventory.ok());
  EXPECT_TRUE(pass.pods.pods.empty());
  ScaleAgents(c, pass);
  EXPECT_EQ(pass.pods.desired, 2);
  EXPECT_EQ(pass.pods.pods.size(), 2u);
  EXPECT_EQ(kube_.Calls("create", kube::kPods), 2);
  auto placed = PlaceWaitingTrials(c, pass);
  ASSERT_TRUE(placed.ok() && *placed);
  EXPECT_EQ(pass.no_room.size(), 3u);
  Summarize(c, pass);
  EXPECT_EQ(pass.status.agents->pods, 2);
  auto written = WriteStatus(c, pass);
  ASSERT_TRUE(written.ok() && *written);
  EXPECT_TRUE(pass.wrote);
  // A stale resourceVersion: the write reports the conflict instead of overwriting.
  pass.job["metadata"]["resourceVersion"] = "1";
  pass.status.pending = 99;
  written = WriteStatus(c, pass);
  ASSERT_TRUE(written.ok());
  EXPECT_FALSE(*written);
}

}  // namespace
}  // namespace hydra::controller
