// The job's status stays well under etcd's object size limit (1.5 MiB by default) at the cap
// of trials per job, whatever the trials report: each entry as the reconciler fills it, with
// the longest names, paths and messages, every field searched and a plan of 1000 shards.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "common/job.h"
#include "common/job_json.h"
#include "common/trial_result.h"
#include "controller/reconciler/early_stopping_pass.h"
#include "controller/reconciler/job_status.h"
#include "controller/reconciler/phases.h"

namespace hydra::controller {
namespace {

using kube::Json;

constexpr size_t kEtcdLimitBytes = 1536 * 1024;

/// A trial with every searchable field set to a value that prints long.
Trial LongestTrial(int index) {
  Trial t;
  t.name = std::string(kMaxTrialNameLength - 4, 'x') + "-" + std::to_string(1000 + index);
  for (const auto& r : SearchableFieldRules()) {
    ParamValue v = r.kind == FieldRule::Kind::kEnum  ? ParamValue(r.enums.back())
                   : r.kind == FieldRule::Kind::kInt ? ParamValue(int64_t{999999999999})
                                                     : ParamValue(0.00012345678901234567);
    t.hyperparameters.push_back({r.name, v});
  }
  return t;
}

v1::TrialStatus WorstReport(const Trial& t) {
  v1::TrialStatus r;
  r.set_name(t.name);
  r.set_state(v1::RUNNING);
  r.set_step(999999999999);
  r.set_train_loss(3.1415926535897931);
  r.set_validation_loss(2.7182818284590451);
  r.set_last_checkpoint_step(999999999999);
  r.set_checkpoint_dir("/" + std::string(200, 'r') + "/" + std::string(63, 'n') + "/" +
                       std::string(kMaxJobNameLength, 'j') + "/" + t.name);
  r.set_message(std::string(10000, 'm'));  // an agent's message of any length
  auto* plan = r.mutable_shard_plan();
  plan->set_state_tier("disk");
  plan->set_peak_device_bytes(int64_t{1} << 50);
  plan->set_offloaded_bytes(int64_t{1} << 50);
  plan->set_resident_bytes(int64_t{1} << 50);
  for (int i = 0; i < 1000; ++i) {
    auto* s = plan->add_shards();
    s->set_first_layer(i);
    s->set_last_layer(i);
    s->set_state_bytes(int64_t{1} << 40);
    s->set_activations("recompute");
    s->set_resident(true);
  }
  return r;
}

TEST(StatusSizeTest, AJobAtTheTrialCapLeavesRoomForTheRestOfTheObject) {
  JobStatus status;
  size_t entry_bytes = 0;
  for (int i = 0; i < kMaxTrialsPerJob; ++i) {
    const Trial t = LongestTrial(i);
    TrialEntry e;
    e.name = t.name;
    e.restarts = 1000;
    e.attempt = 1000;
    e.notices = 10;
    e.agent = std::string(253, 'a');
    e.agent_endpoint = std::string(253, 'a') + ":65535";
    e.steps = int64_t{999999999999};
    e.hyperparameters = Json::parse(HyperparametersJson(t).dump());
    ApplyTrialReport(WorstReport(t), e);
    // Early stopping's fields at their longest: a stop not yet confirmed, a limit, and the
    // stored evaluations, each loss at 6 significant digits with the longest exponent.
    e.step_limit = int64_t{999999999999};
    e.stop_early = int64_t{999999999999};
    for (size_t k = 0; k < kMaxStoredEvaluations; ++k) {
      e.evaluations.push_back({int64_t{999999999999}, -1.23457e+300});
    }
    status.trials.push_back(e);
    entry_bytes = std::max(entry_bytes, ToJson(e).dump().size());
  }
  const Json trials = ToJson(status)["trials"];
  ASSERT_LE(trials[0]["shardPlan"]["shards"].size(), static_cast<size_t>(kMaxStatusShards));
  EXPECT_EQ(trials[0]["shardPlan"]["shardCount"], 1000);
  ASSERT_LE(trials[0]["message"].get<std::string>().size(), kMaxStatusMessageBytes);
  for (const char* type : {"Ready", "Progressing", "Complete", "Failed", "Degraded", "Queued"}) {
    SetCondition(status.conditions, type, true, "SomeReason",
                 std::string(kMaxStatusMessageBytes, 'c'), 1, "2026-11-24T00:00:00Z");
  }
  status.agents =
      AgentPodsStatus{kMaxAgentsPerJob, kMaxAgentsPerJob, kMaxAgentsPerJob, kMaxAgentsPerJob};
  const size_t bytes = ToJson(status).dump().size();
  std::printf("worst-case status entry: %zu bytes; %lld trials: %zu bytes (%.0f%% of etcd's %zu)\n",
              entry_bytes, static_cast<long long>(kMaxTrialsPerJob), bytes,
              100.0 * static_cast<double>(bytes) / static_cast<double>(kEtcdLimitBytes),
              kEtcdLimitBytes);
  // The rest of the object must fit beside it: annotations (at most 256 KiB in all, kubectl's
  // last-applied copy of the spec included), the spec, and managedFields (about 330 bytes per
  // trial entry: 83 KiB at the cap). 55% leaves 691 KiB for them.
  EXPECT_LT(bytes, kEtcdLimitBytes * 55 / 100);
}

}  // namespace
}  // namespace hydra::controller
