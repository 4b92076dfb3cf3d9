#include "common/early_stopper.h"

#include <gtest/gtest.h>

#include <map>

namespace hydra {
namespace {

using Kind = StopDecision::Kind;

/// The decisions as trial -> (kind, step), the last one per trial.
std::map<int, std::pair<Kind, int64_t>> Last(const std::vector<StopDecision>& all) {
  std::map<int, std::pair<Kind, int64_t>> out;
  for (const auto& d : all) out[d.trial] = {d.kind, d.step};
  return out;
}

TEST(EarlyStopperTest, LimitsStartAtTheFirstRung) {
  EarlyStopper asha({EarlyStoppingAlgorithm::kAsha, 10, 3}, {90, 5, 90});
  EXPECT_EQ(asha.Limit(0), 10);
  EXPECT_EQ(asha.Limit(1), 5);  // no rung below its steps
  EarlyStopper median({EarlyStoppingAlgorithm::kMedian, 10, 3}, {90});
  EXPECT_EQ(median.Limit(0), 90);
  EarlyStopper none({EarlyStoppingAlgorithm::kNone, 0, 3}, {90});
  EXPECT_EQ(none.Limit(0), 90);
}

TEST(EarlyStopperTest, AshaPromotesTheTopThirdOfEachRung) {
  // Nine trials; trial i's loss is i at every step. Rungs 10 and 30 below 90 steps.
  EarlyStopper es({EarlyStoppingAlgorithm::kAsha, 10, 3}, std::vector<int64_t>(9, 90));
  std::vector<StopDecision> all;
  for (int t = 0; t < 9; ++t) {
    auto d = es.Report(t, 10, t);
    all.insert(all.end(), d.begin(), d.end());
  }
  auto last = Last(all);
  ASSERT_EQ(last.size(), 9u);
  for (int t = 0; t < 3; ++t) EXPECT_EQ(last[t], std::make_pair(Kind::kLimit, int64_t{30})) << t;
  for (int t = 3; t < 9; ++t) EXPECT_EQ(last[t], std::make_pair(Kind::kStop, int64_t{10})) << t;
  // Trial 0 was promoted as soon as three results were in (asynchronous), not at the end.
  EXPECT_EQ(all.front().trial, 0);
  EXPECT_EQ(all.front().kind, Kind::kLimit);

  // Rung 30: the three survivors; the best goes on to the end, the others stop.
  EXPECT_TRUE(es.Report(0, 30, 0).empty());  // two others may still report here: it waits
  EXPECT_TRUE(es.Waiting(0));
  EXPECT_TRUE(es.Report(1, 30, 1).empty());
  last = Last(es.Report(2, 30, 2));
  EXPECT_EQ(last[0], std::make_pair(Kind::kLimit, int64_t{90}));
  EXPECT_EQ(last[1], std::make_pair(Kind::kStop, int64_t{30}));
  EXPECT_EQ(last[2], std::make_pair(Kind::kStop, int64_t{30}));
  EXPECT_TRUE(es.Stopped(5));
  EXPECT_FALSE(es.Stopped(0));
  // The final evaluation decides nothing.
  EXPECT_TRUE(es.Report(0, 90, 0).empty());
}

TEST(EarlyStopperTest, ATrialThatEndsCompletesTheRungOthersWaitAt) {
  EarlyStopper es({EarlyStoppingAlgorithm::kAsha, 10, 3}, {90, 90, 90});
  EXPECT_TRUE(es.Report(0, 10, 2.0).empty());
  EXPECT_TRUE(es.Report(1, 10, 1.0).empty());
  auto last = Last(es.Ended(2));  // failed before rung 10: the rung is complete
  EXPECT_EQ(last[1], std::make_pair(Kind::kLimit, int64_t{30}));
  EXPECT_EQ(last[0], std::make_pair(Kind::kStop, int64_t{10}));
  EXPECT_EQ(last.count(2), 0u);
}

TEST(EarlyStopperTest, RepeatedAndLateReportsDecideNothingTwice) {
  EarlyStopper es({EarlyStoppingAlgorithm::kAsha, 10, 2}, {40, 40});
  EXPECT_TRUE(es.Report(0, 10, 1.0).empty());
  auto d = es.Report(1, 10, 2.0);
  ASSERT_EQ(d.size(), 2u);
  EXPECT_TRUE(es.Report(1, 10, 2.0).empty());  // a replayed report (a resumed trial)
  EXPECT_TRUE(es.Report(1, 20, 0.5).empty());  // after it stopped
  EXPECT_TRUE(es.Stopped(1));
}

TEST(EarlyStopperTest, MedianStopsTrialsWorseThanTheOthersMedian) {
  EarlyStopper es({EarlyStoppingAlgorithm::kMedian, 20, 3}, {100, 100, 100});
  // Before minSteps nothing stops.
  EXPECT_TRUE(es.Report(0, 10, 1.0).empty());
  EXPECT_TRUE(es.Report(1, 10, 9.0).empty());
  EXPECT_TRUE(es.Report(2, 10, 2.0).empty());
  EXPECT_TRUE(es.Report(0, 20, 1.0).empty());  // nobody else at 20 yet
  // Trial 2's best so far (1.5) is worse than the median of the others at 20 (trial 0: 1.0).
  auto d = es.Report(2, 20, 1.5);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].trial, 2);
  EXPECT_EQ(d[0].kind, Kind::kStop);
  EXPECT_EQ(d[0].step, 20);
  // Trial 1 (8.0) against the median of trials 0 and 2 (1.25): stops too.
  d = es.Report(1, 20, 8.0);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].trial, 1);
  EXPECT_EQ(d[0].kind, Kind::kStop);
  // Trial 0 goes on to the end.
  EXPECT_TRUE(es.Report(0, 40, 0.9).empty());
  EXPECT_FALSE(es.Stopped(0));
}

TEST(EarlyStopperTest, ATrialResumedPastItsRungsIsDecidedAtEachOfThem) {
  // Trial 0 resumed at step 45 with reports at 10 and 30 from the earlier run, replayed
  // before the others report at 10: it waits at 10, then (promoted) is decided at 30 at once.
  EarlyStopper es({EarlyStoppingAlgorithm::kAsha, 10, 3}, {90, 90, 90});
  EXPECT_TRUE(es.Report(0, 10, 1.0).empty());
  EXPECT_TRUE(es.Report(0, 30, 0.5).empty());
  EXPECT_TRUE(es.Report(1, 10, 2.0).empty());
  auto last = Last(es.Report(2, 10, 3.0));  // rung 10 complete: only trial 0 goes on
  EXPECT_EQ(last[1].first, Kind::kStop);
  EXPECT_EQ(last[2].first, Kind::kStop);
  // ...and rung 30 is complete too (the others stopped): trial 0 goes on to the end.
  EXPECT_EQ(last[0], std::make_pair(Kind::kLimit, int64_t{90}));
}

TEST(EarlyStopperTest, AnEvaluationPastTheRungStandsForTheRung) {
  // Resumed from a checkpoint without an evaluation at rung 10 (another configuration's run):
  // the scheduler evaluates it where it stands, at step 12.
  EarlyStopper es({EarlyStoppingAlgorithm::kAsha, 10, 2}, {40, 40});
  EXPECT_TRUE(es.Report(0, 12, 1.0).empty());
  EXPECT_TRUE(es.Waiting(0));
  auto last = Last(es.Report(1, 10, 2.0));
  EXPECT_EQ(last[0], std::make_pair(Kind::kLimit, int64_t{20}));
  EXPECT_EQ(last[1].first, Kind::kStop);
}

using Phase = EarlyStopper::Phase;

TEST(EarlyStopperTest, FromStateDecidesWhatTheStoredStateCallsFor) {
  // Six trials of 90 steps, rungs 10 and 30. Stored: trial 0 already promoted to 30 (its
  // limit), trial 5 stopped. Everyone reported at 10; trial 0's loss there is now the worst.
  MetricBoard board;
  const std::vector<double> at10 = {9, 1, 2, 3, 4, 0.5};
  for (int t = 0; t < 6; ++t) board.Record(t, 10, at10[t]);
  std::vector<Phase> phases(6, Phase::kActive);
  phases[5] = Phase::kStopped;
  auto es =
      EarlyStopper::FromState({EarlyStoppingAlgorithm::kAsha, 10, 3}, std::vector<int64_t>(6, 90),
                              board, {30, 0, 0, 0, 0, 0}, phases);
  auto last = Last(es.Decide());
  // floor(6/3) = 2 go on: trials 5 and 1 by loss; 5 is stopped already, so of the waiting ones
  // only trial 1 ranks in the top two; the rung is complete, so 2, 3 and 4 stop. Trial 0's
  // stored promotion is not taken back, and trial 5 is not decided again.
  EXPECT_EQ(last.count(0), 0u);
  EXPECT_EQ(last.count(5), 0u);
  EXPECT_EQ(last[1], std::make_pair(Kind::kLimit, int64_t{30}));
  for (int t : {2, 3, 4}) EXPECT_EQ(last[t], std::make_pair(Kind::kStop, int64_t{10})) << t;
  EXPECT_EQ(es.Limit(0), 30);
}

TEST(EarlyStopperTest, FromStateWaitsUntilTheRungCanDecide) {
  MetricBoard board;
  board.Record(0, 10, 1.0);  // trials 1 and 2 have not reached 10 yet
  board.Record(1, 4, 2.0);
  auto es = EarlyStopper::FromState({EarlyStoppingAlgorithm::kAsha, 10, 3}, {90, 90, 90}, board, {},
                                    std::vector<Phase>(3, Phase::kActive));
  EXPECT_TRUE(es.Decide().empty());
  EXPECT_TRUE(es.Waiting(0));
  // Trial 2 ended (failed) without reporting, trial 1 reported worse: 0 goes on at once.
  board.Record(1, 10, 2.0);
  auto again = EarlyStopper::FromState({EarlyStoppingAlgorithm::kAsha, 10, 3}, {90, 90, 90}, board,
                                       {}, {Phase::kActive, Phase::kActive, Phase::kEnded});
  auto last = Last(again.Decide());
  EXPECT_EQ(last[0], std::make_pair(Kind::kLimit, int64_t{30}));
  EXPECT_EQ(last[1], std::make_pair(Kind::kStop, int64_t{10}));
}

TEST(EarlyStopperTest, FromStateJudgesAResumedTrialAtItsLimitAndMedianAtTheLatestStep) {
  MetricBoard board;
  board.Record(0, 12, 5.0);  // resumed past its limit 10 without an evaluation there
  board.Record(1, 10, 1.0);
  auto asha = EarlyStopper::FromState({EarlyStoppingAlgorithm::kAsha, 10, 2}, {90, 90}, board,
                                      {10, 10}, std::vector<Phase>(2, Phase::kActive));
  auto last = Last(asha.Decide());
  EXPECT_EQ(last[1], std::make_pair(Kind::kLimit, int64_t{20}));
  EXPECT_EQ(last[0], std::make_pair(Kind::kStop, int64_t{12}));

  MetricBoard curves;
  for (int t = 0; t < 3; ++t) {
    for (int64_t s = 5; s <= 20; s += 5) curves.Record(t, s, t + 10.0 / s);
  }
  auto median = EarlyStopper::FromState({EarlyStoppingAlgorithm::kMedian, 10, 3}, {40, 40, 40},
                                        curves, {}, std::vector<Phase>(3, Phase::kActive));
  last = Last(median.Decide());
  ASSERT_EQ(last.size(), 1u);  // only the worst trial is worse than the others' median
  EXPECT_EQ(last[2], std::make_pair(Kind::kStop, int64_t{20}));
}

}  // namespace
}  // namespace hydra
