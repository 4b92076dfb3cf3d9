// The controller's early stopping pass over status entries and agents' reports: what it stores
// and decides, that stored decisions stand, and that stored evaluations stand in for agents
// that no longer report.
#include "controller/reconciler/early_stopping_pass.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/trial_result.h"

namespace hydra::controller {
namespace {

using Json = nlohmann::json;
namespace v1 = agent::v1;

const EarlyStoppingSpec kAsha{EarlyStoppingAlgorithm::kAsha, 10, 3};

/// A trial on an agent that reports it Running at `step` under `limit`, with `losses` at the
/// given steps.
v1::TrialStatus Report(int64_t step, int64_t limit,
                       const std::vector<std::pair<int64_t, double>>& losses) {
  v1::TrialStatus r;
  r.set_state(v1::RUNNING);
  r.set_step(step);
  r.set_step_limit(limit);
  for (const auto& [s, l] : losses) {
    auto* p = r.add_evaluations();
    p->set_step(s);
    p->set_loss(l);
  }
  return r;
}

Json Entry(const std::string& name, bool on_agent) {
  Json e = {{"name", name}, {"state", on_agent ? kTrialRunning : kTrialPending}, {"steps", 90}};
  if (on_agent) e["agentEndpoint"] = "10.0.0.1:7070";
  return e;
}

struct Job {
  std::vector<Json> entries;
  std::vector<v1::TrialStatus> reports;
  std::vector<bool> reported;
  /// Decides over the entries as the status stores them (JSON), and stores the result back.
  std::vector<EarlyStop> Decide(const EarlyStoppingSpec& spec = kAsha) {
    std::vector<TrialEntry> typed;
    for (const auto& e : entries) typed.push_back(TrialEntryFromJson(e));
    std::vector<EarlyStoppingTrial> trials;
    for (size_t i = 0; i < entries.size(); ++i) {
      trials.push_back({&typed[i], 90, reported[i] ? &reports[i] : nullptr});
    }
    auto stops = DecideEarlyStopping(spec, trials);
    for (size_t i = 0; i < entries.size(); ++i) entries[i] = ToJson(typed[i]);
    return stops;
  }
};

TEST(EarlyStoppingPassTest, AshaPromotesTheBestAtARungAndStopsTheRest) {
  Job job;
  const std::vector<double> at10 = {2.0, 1.0, 3.0};
  for (int i = 0; i < 3; ++i) {
    job.entries.push_back(Entry("t" + std::to_string(i), true));
    job.reports.push_back(Report(10, 10, {{5, 9.0}, {10, at10[i]}}));
    job.reported.push_back(true);
  }
  // A fourth trial, not placed yet, with no evaluation: it may still report at the rung.
  job.entries.push_back(Entry("t3", false));
  job.reports.emplace_back();
  job.reported.push_back(false);
  // floor(3/3) = 1 of the results so far goes on: t1 at once (asynchronous promotion); t0 and
  // t2 wait, since t3 may still do better than they did.
  EXPECT_TRUE(job.Decide().empty());
  EXPECT_EQ(job.entries[1]["stepLimit"], 30);
  for (int i : {0, 2, 3}) EXPECT_EQ(job.entries[i]["stepLimit"], 10) << i;
  // Only the rung's result is stored, not the evaluation at step 5.
  EXPECT_EQ(job.entries[1]["evaluations"], Json::parse("[[10, 1.0]]"));
  EXPECT_EQ(WantedStepLimit(TrialEntryFromJson(job.entries[1])), 30);

  // The fourth trial failed without reporting: the rung is complete and the others stop.
  job.entries[3]["state"] = kTrialFailed;
  auto stops = job.Decide();
  ASSERT_EQ(stops.size(), 2u);
  EXPECT_EQ(job.entries[1]["stepLimit"], 30);
  EXPECT_FALSE(job.entries[1].contains("stopEarly"));
  EXPECT_EQ(job.entries[0]["stopEarly"], 10);
  EXPECT_EQ(job.entries[2]["stopEarly"], 10);
  EXPECT_EQ(job.entries[0]["state"], kTrialRunning);  // until its agent reports it stopped
  // A second pass over the same state decides nothing new.
  EXPECT_TRUE(job.Decide().empty());
  EXPECT_NE(stops[0].why.find("not in the top 1/3"), std::string::npos) << stops[0].why;
}

TEST(EarlyStoppingPassTest, StoredDecisionsStandAndStoredLossesReplaceSilentAgents) {
  Job job;
  for (int i = 0; i < 3; ++i) {
    job.entries.push_back(Entry("t" + std::to_string(i), true));
    job.reports.emplace_back();
    job.reported.push_back(false);
  }
  // t0 was promoted to 30 by an earlier pass (stored), though its stored rung loss is the
  // worst. t1 is queued on its agent, which reports it PENDING without a limit yet: the stored
  // limit stands (the agent is told after the status is written, never the other way round).
  // t2 waits at 10, known only from its stored loss: its agent is silent.
  job.entries[0]["stepLimit"] = 30;
  job.entries[0]["evaluations"] = Json::parse("[[10, 5.0]]");
  job.entries[1]["stepLimit"] = 10;
  job.entries[1]["evaluations"] = Json::parse("[[10, 1.0]]");
  job.reports[1] = Report(10, 0, {{5, 1.5}, {10, 1.0}});
  job.reports[1].set_state(v1::PENDING);
  job.reported[1] = true;
  job.entries[2]["stepLimit"] = 10;
  job.entries[2]["evaluations"] = Json::parse("[[10, 4.0]]");
  auto stops = job.Decide();
  EXPECT_EQ(job.entries[0]["stepLimit"], 30);  // not taken back
  // At rung 10: 1.0 (t1), 4.0 (t2), 5.0 (t0); every trial has reported there. t1 goes on,
  // t2 stops.
  EXPECT_EQ(job.entries[1]["stepLimit"], 30);
  ASSERT_EQ(stops.size(), 1u);
  EXPECT_EQ(stops[0].trial, "t2");
  EXPECT_EQ(job.entries[2]["stopEarly"], 10);
  EXPECT_EQ(job.entries[2]["stepLimit"], 10);

  // t2's agent is lost before it confirmed the stop (the reconciler drops the agent): it ends
  // EarlyStopped, not placed again.
  job.entries[2].erase("agentEndpoint");
  EXPECT_TRUE(job.Decide().empty());
  EXPECT_EQ(job.entries[2]["state"], kTrialEarlyStopped);
  EXPECT_FALSE(job.entries[2].contains("stopEarly"));
  EXPECT_NE(job.entries[2]["message"].get<std::string>().find("stopped at step 10"),
            std::string::npos);
}

TEST(EarlyStoppingPassTest, ASuspendedTrialStoppedEarlyEndsAtOnce) {
  Job job;
  for (int i = 0; i < 2; ++i) {
    job.entries.push_back(Entry("t" + std::to_string(i), true));
    job.reports.push_back(Report(10, 10, {{10, 1.0 + i}}));
    job.reported.push_back(i == 0);
  }
  // t1 was suspended at its rung: Interrupted, still naming the agent it left.
  job.entries[1]["state"] = kTrialInterrupted;
  job.entries[1]["stepLimit"] = 10;
  job.entries[1]["evaluations"] = Json::parse("[[10, 2.0]]");
  auto stops = job.Decide(EarlyStoppingSpec{EarlyStoppingAlgorithm::kAsha, 10, 2});
  ASSERT_EQ(stops.size(), 1u);
  EXPECT_EQ(job.entries[0]["stepLimit"], 20);
  EXPECT_EQ(job.entries[1]["state"], kTrialEarlyStopped);
}

TEST(EarlyStoppingPassTest, ATrialOnNoAgentEndsAtOnceAndMedianKeepsItsBestSoFar) {
  const EarlyStoppingSpec median{EarlyStoppingAlgorithm::kMedian, 10, 3};
  Job job;
  for (int i = 0; i < 3; ++i) {
    job.entries.push_back(Entry("t" + std::to_string(i), i != 2));
    job.reports.push_back(Report(20, 0, {{10, 1.0 + i}, {20, 0.5 + i}}));
    job.reported.push_back(i != 2);
  }
  // t2 waits for an agent again (its agent was lost); its stored losses are the worst.
  job.entries[2]["evaluations"] = Json::parse("[[10, 3.0], [20, 2.5]]");
  auto stops = job.Decide(median);
  ASSERT_EQ(stops.size(), 1u);
  EXPECT_EQ(stops[0].trial, "t2");
  EXPECT_EQ(job.entries[2]["state"], kTrialEarlyStopped);
  EXPECT_NE(job.entries[2]["message"].get<std::string>().find("median"), std::string::npos);
  EXPECT_FALSE(job.entries[0].contains("stepLimit"));  // median sets no limits
  // The best loss so far at its evaluations (all of them: fewer than the cap).
  EXPECT_EQ(job.entries[0]["evaluations"], Json::parse("[[10, 1.0], [20, 0.5]]"));

  // Nothing for algorithm none.
  Job none;
  none.entries.push_back(Entry("t0", true));
  none.reports.push_back(Report(20, 0, {{10, 1.0}}));
  none.reported.push_back(true);
  EXPECT_TRUE(none.Decide({}).empty());
  EXPECT_FALSE(none.entries[0].contains("evaluations"));
}

TEST(EarlyStoppingPassTest, StoredEvaluationsAreBoundedAndKeepWhatDecisionsRead) {
  Job job;
  job.entries.push_back(Entry("t0", true));
  std::vector<std::pair<int64_t, double>> curve;
  for (int64_t s = 1; s <= 100; ++s) curve.emplace_back(s, s == 50 ? 0.25 : 1.0 + 1.0 / s);
  job.reports.push_back(Report(100, 0, curve));
  job.reported.push_back(true);
  job.Decide({EarlyStoppingAlgorithm::kMedian, 10, 3});
  const Json& kept = job.entries[0]["evaluations"];
  ASSERT_EQ(kept.size(), kMaxStoredEvaluations);
  EXPECT_EQ(kept.back()[0], 100);  // the latest
  double previous = 1e9;
  for (const auto& p : kept) {
    EXPECT_LE(p[1].get<double>(), previous) << "a best so far never rises";
    previous = p[1].get<double>();
  }
  EXPECT_EQ(kept.back()[1], 0.25);

  // ASHA with 1 and 2: rungs 1, 2, 4, ..., 64 (7 of them); every one is kept.
  Job asha;
  asha.entries.push_back(Entry("t0", true));
  asha.entries[0]["steps"] = 100;
  asha.reports.push_back(Report(100, 0, curve));
  asha.reported.push_back(true);
  asha.Decide({EarlyStoppingAlgorithm::kAsha, 1, 2});
  ASSERT_EQ(asha.entries[0]["evaluations"].size(), 7u);
  EXPECT_EQ(asha.entries[0]["evaluations"][0][0], 1);
  EXPECT_EQ(asha.entries[0]["evaluations"][6][0], 64);
}

}  // namespace
}  // namespace hydra::controller
