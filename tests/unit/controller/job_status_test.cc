// The typed MultiModelJob status: JSON round trips, tolerance of hand-edited status, and the
// condition rule (lastTransitionTime changes only on a flip).
#include "controller/reconciler/job_status.h"

#include <gtest/gtest.h>

#include <string>

#include "controller/reconciler/phases.h"

namespace hydra::controller {
namespace {

using Json = nlohmann::json;

TrialEntry FullEntry() {
  TrialEntry e;
  e.name = "sweep-lr0.001";
  e.hyperparameters = {{"learningRate", 0.001}};
  e.agent = "node-1";
  e.agent_endpoint = "10.0.0.7:9443";
  e.state = TrialState::kRunning;
  e.message = "resumed from step 40";
  e.step = 42;
  e.steps = 100;
  e.precision = Precision::kBf16;
  e.train_loss = 3.25;
  e.validation_loss = 3.5;
  e.step_limit = 50;
  e.evaluations = {{10, 4.5}, {50, 3.5}};
  e.restarts = 1;
  e.attempt = 2;
  e.notices = 1;
  e.last_checkpoint = CheckpointStatus{40, "/ckpt/ns/sweep/sweep-lr0.001"};
  e.shard_plan = ShardPlanStatus{"host", 1 << 20, 3, 4096, 1000, 1, {{0, 1, 1000, "stash"}}};
  return e;
}

TEST(JobStatusTest, EveryFieldSurvivesTheRoundTrip) {
  JobStatus s;
  s.observed_generation = 3;
  s.start_time = "2026-11-24T00:00:00Z";
  s.trial_count = 2;
  s.pending = 1;
  s.running = 1;
  s.early_stopped = 0;
  s.best_trial = BestTrial{"sweep-lr0.001", 3.5, {{"learningRate", 0.001}}};
  s.best_validation_loss = "3.5";
  s.trials = {FullEntry(), TrialEntry{}};
  s.trials[1].name = "sweep-lr0.002";
  s.agents = AgentPodsStatus{2, 2, 1, 1};
  SetCondition(s.conditions, "Ready", true, "TrialsPlaced", "ok", 3, "2026-11-24T00:00:01Z");
  const Json j = ToJson(s);
  EXPECT_EQ(JobStatusFromJson(j), s);
  EXPECT_EQ(ToJson(JobStatusFromJson(j)), j) << "stable: no write when nothing changed";
  EXPECT_EQ(j["trials"][0]["state"], "Running");
  EXPECT_EQ(j["trials"][0]["precision"], "bf16");
  EXPECT_FALSE(j["trials"][1].contains("precision")) << "fp32, the default, is left out";
  EXPECT_EQ(j["trials"][0]["evaluations"], Json::parse("[[10, 4.5], [50, 3.5]]"));
  EXPECT_EQ(j["agents"], Json::parse(R"({"desired": 2, "pods": 2, "ready": 1, "gated": 1})"));
  EXPECT_EQ(j["conditions"][0]["status"], "True");
}

TEST(JobStatusTest, AnAgentsShardPlanShowsItsGpuChoicesInKnownWordsOnly) {
  v1::ShardPlan plan;
  plan.set_state_tier("host");
  plan.set_peak_device_bytes(1 << 30);
  plan.set_offloaded_bytes(123);
  plan.set_resident_bytes(456);
  plan.add_shards()->set_activations("offload");
  plan.add_shards()->set_activations(std::string(1000, 'x'));  // outside the closed set
  plan.mutable_shards(1)->set_resident(true);
  const ShardPlanStatus p = PlanStatus(plan);
  EXPECT_EQ(p.offloaded_bytes, 123);
  EXPECT_EQ(p.resident_bytes, 456);
  EXPECT_EQ(p.resident_shards, 1);
  ASSERT_EQ(p.shards.size(), 2u);
  EXPECT_EQ(p.shards[0].activations, "offload");
  EXPECT_EQ(p.shards[1].activations, "") << "an agent's unknown word is not shown";
  TrialEntry e;
  e.name = "t";
  e.shard_plan = p;
  const Json j = ToJson(e);
  EXPECT_EQ(j["shardPlan"]["residentBytes"], 456);
  EXPECT_EQ(j["shardPlan"]["residentShards"], 1);
  EXPECT_EQ(j["shardPlan"]["offloadedBytes"], 123);
  JobStatus s;
  s.trials = {e};
  EXPECT_EQ(JobStatusFromJson(ToJson(s)), s);
  e.shard_plan = PlanStatus(v1::ShardPlan());  // a CPU's plan: none of the GPU's fields
  EXPECT_FALSE(ToJson(e)["shardPlan"].contains("residentBytes"));
  EXPECT_FALSE(ToJson(e)["shardPlan"].contains("offloadedBytes"));
}

TEST(JobStatusTest, AbsentFieldsStayAbsent) {
  TrialEntry e;
  e.name = "t";
  const Json j = ToJson(e);
  EXPECT_EQ(j, Json::parse(R"({"name": "t", "hyperparameters": {}, "state": "Pending",
                               "step": 0, "steps": 0, "restarts": 0})"));
  JobStatus s;
  EXPECT_FALSE(ToJson(s).contains("agents")) << "only jobs with spec.agents";
  EXPECT_FALSE(ToJson(s).contains("earlyStopped"));
}

TEST(JobStatusTest, AStatusEditedByHandReadsAsDefaultsNotAnError) {
  const Json j = Json::parse(R"({
    "trialCount": "many",
    "conditions": [{"type": "Ready", "status": "Maybe"}, 7, {"status": "True"}],
    "trials": [{"name": "a", "state": "Exploded", "step": "x", "evaluations": [[1], "y", [2, 3.5]],
                "shardPlan": []},
               {"state": "Running"}, 5],
    "agents": {"desired": -1}})");
  const JobStatus s = JobStatusFromJson(j);
  EXPECT_EQ(s.trial_count, 0);
  ASSERT_EQ(s.conditions.size(), 1u);
  EXPECT_FALSE(s.conditions[0].status);
  ASSERT_EQ(s.trials.size(), 1u) << "entries without a name are dropped";
  EXPECT_EQ(s.trials[0].state, TrialState::kPending);
  EXPECT_EQ(s.trials[0].step, 0);
  ASSERT_EQ(s.trials[0].evaluations.size(), 1u);
  EXPECT_EQ(s.trials[0].evaluations[0].loss, 3.5);
  EXPECT_FALSE(s.trials[0].shard_plan);
  EXPECT_TRUE(s.agents);
  EXPECT_EQ(JobStatusFromJson(Json("not an object")), JobStatus{});
}

TEST(JobStatusTest, StatesAndWhatIsOnAnAgent) {
  for (auto st :
       {TrialState::kPending, TrialState::kRunning, TrialState::kSucceeded, TrialState::kFailed,
        TrialState::kInterrupted, TrialState::kCancelled, TrialState::kEarlyStopped}) {
    EXPECT_EQ(TrialStateFromName(TrialStateName(st)), st);
  }
  EXPECT_TRUE(IsFinal(TrialState::kEarlyStopped));
  EXPECT_FALSE(IsFinal(TrialState::kInterrupted));
  TrialEntry e = FullEntry();
  EXPECT_TRUE(e.OnAgent());
  e.state = TrialState::kInterrupted;
  EXPECT_FALSE(e.OnAgent()) << "a suspended trial names the agent it left";
  e.LeaveAgent();
  EXPECT_TRUE(e.agent.empty() && e.agent_endpoint.empty());
}

TEST(ConditionsTest, TransitionTimeChangesOnlyWhenTheStatusFlips) {
  std::vector<Condition> conds;
  EXPECT_TRUE(SetCondition(conds, "Ready", false, "WaitingForCapacity", "1 waits", 1, "t1"));
  EXPECT_TRUE(SetCondition(conds, "Ready", false, "WaitingForCapacity", "2 wait", 1, "t2"));
  EXPECT_EQ(conds[0].last_transition_time, "t1");
  EXPECT_FALSE(SetCondition(conds, "Ready", false, "WaitingForCapacity", "2 wait", 1, "t3"));
  EXPECT_TRUE(SetCondition(conds, "Ready", true, "TrialsPlaced", "all placed", 2, "t4"));
  EXPECT_EQ(conds[0].last_transition_time, "t4");
  EXPECT_EQ(conds[0].observed_generation, 2);
  ASSERT_EQ(conds.size(), 1u);
  EXPECT_EQ(FindCondition(conds, "Ready"), &conds[0]);
  EXPECT_EQ(FindCondition(conds, "Queued"), nullptr);
}

}  // namespace
}  // namespace hydra::controller
