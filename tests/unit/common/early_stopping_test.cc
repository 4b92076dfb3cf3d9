#include "common/early_stopping.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <map>

namespace hydra {
namespace {

TEST(AshaRungsTest, GeometricBelowTheLastStep) {
  EarlyStoppingSpec spec{EarlyStoppingAlgorithm::kAsha, 20, 3};
  EXPECT_EQ(AshaRungs(spec, 1000), (std::vector<int64_t>{20, 60, 180, 540}));
  EXPECT_EQ(AshaRungs(spec, 540), (std::vector<int64_t>{20, 60, 180}));
  EXPECT_EQ(AshaRungs(spec, 20), std::vector<int64_t>{});
  spec.min_steps = int64_t{1} << 61;
  EXPECT_EQ(AshaRungs(spec, INT64_MAX),
            (std::vector<int64_t>{int64_t{1} << 61, 3 * (int64_t{1} << 61)}))
      << "no overflow past the last rung";
}

/// Trials that report `loss(trial, step)` at every rung, advanced one rung at a time in
/// round-robin order; waiting trials are asked again after every report at their rung.
/// Returns the step each trial ended at (steps: trained to the end).
std::vector<int64_t> RunAsha(const EarlyStoppingSpec& spec, int trials, int64_t steps,
                             const std::function<double(int, int64_t)>& loss) {
  const auto rungs = AshaRungs(spec, steps);
  MetricBoard board;
  std::vector<int64_t> ended(trials, -1);
  std::vector<bool> stopped(trials, false);
  std::vector<size_t> next_rung(trials, 0);
  std::vector<bool> waiting(trials, false);
  auto settle = [&](int t) {
    const int64_t rung = rungs[next_rung[t]];
    switch (AshaVerdict(spec, board, trials, stopped, t, rung)) {
      case StopVerdict::kContinue:
        waiting[t] = false;
        if (++next_rung[t] == rungs.size()) ended[t] = steps;
        break;
      case StopVerdict::kWait: waiting[t] = true; break;
      case StopVerdict::kStop:
        waiting[t] = false;
        stopped[t] = true;
        ended[t] = rung;
        break;
    }
  };
  for (bool progress = true; progress;) {
    progress = false;
    for (int t = 0; t < trials; ++t) {
      if (ended[t] >= 0 || waiting[t]) continue;
      const int64_t rung = rungs[next_rung[t]];
      board.Record(t, rung, loss(t, rung));
      settle(t);
      for (int w = 0; w < trials; ++w) {
        if (waiting[w] && rungs[next_rung[w]] == rung) settle(w);
      }
      progress = true;
    }
  }
  return ended;
}

TEST(AshaTest, TheTopThirdOfEachRungGoesOnTheRestStop) {
  // 9 trials, trial i's loss 1 + 0.1 i at every step; rungs 10, 30, 90 of 100 steps.
  const EarlyStoppingSpec spec{EarlyStoppingAlgorithm::kAsha, 10, 3};
  const auto ended = RunAsha(spec, 9, 100, [](int t, int64_t) { return 1.0 + 0.1 * t; });
  EXPECT_EQ(ended, (std::vector<int64_t>{100, 30, 30, 10, 10, 10, 10, 10, 10}));
  int64_t trained = 0;
  for (auto s : ended) trained += s;
  EXPECT_EQ(trained, 220) << "of 900 without early stopping";
}

TEST(AshaTest, ALateBloomerIsJudgedByItsLossAtTheRung) {
  // Trial 2 starts worst but is best by step 30; trial 0 is best at step 10 only.
  auto loss = [](int t, int64_t step) {
    if (t == 2) return step <= 10 ? 1.25 : 0.5;
    return 1.0 + 0.1 * t + (t == 0 && step > 10 ? 0.5 : 0.0);
  };
  const EarlyStoppingSpec spec{EarlyStoppingAlgorithm::kAsha, 10, 3};
  // Rung 10 ranks 0, 1, 2(1.25 < 1.3 of trial 3) first: all three go on; at rung 30 trial 2 wins.
  const auto ended = RunAsha(spec, 9, 100, loss);
  EXPECT_EQ(ended, (std::vector<int64_t>{30, 30, 100, 10, 10, 10, 10, 10, 10}));
}

TEST(AshaTest, TheFirstArrivalsWaitUntilTheRungCanRankThem) {
  const EarlyStoppingSpec spec{EarlyStoppingAlgorithm::kAsha, 10, 3};
  MetricBoard board;
  const std::vector<bool> stopped(4, false);
  board.Record(0, 10, 1.0);
  EXPECT_EQ(AshaVerdict(spec, board, 4, stopped, 0, 10), StopVerdict::kWait);
  board.Record(1, 10, 2.0);
  board.Record(2, 10, 3.0);
  EXPECT_EQ(AshaVerdict(spec, board, 4, stopped, 0, 10), StopVerdict::kContinue);
  EXPECT_EQ(AshaVerdict(spec, board, 4, stopped, 1, 10), StopVerdict::kWait) << "trial 3 pending";
  EXPECT_EQ(AshaVerdict(spec, board, 4, {false, false, false, true}, 1, 10), StopVerdict::kStop)
      << "trial 3 failed: the rung is complete";
  EXPECT_EQ(AshaVerdict(spec, board, 4, stopped, 3, 10), StopVerdict::kContinue)
      << "not at this rung: nothing to decide";
}

TEST(AshaTest, ADivergedTrialRanksLastAndABadFactorStopsNothing) {
  EarlyStoppingSpec spec{EarlyStoppingAlgorithm::kAsha, 10, 3};
  MetricBoard board;
  const std::vector<bool> stopped(3, false);
  board.Record(0, 10, std::nan(""));
  board.Record(1, 10, 2.0);
  board.Record(2, 10, 3.0);
  EXPECT_EQ(AshaVerdict(spec, board, 3, stopped, 0, 10), StopVerdict::kStop) << "NaN is worst";
  EXPECT_EQ(AshaVerdict(spec, board, 3, stopped, 1, 10), StopVerdict::kContinue);
  spec.reduction_factor = 0;
  EXPECT_EQ(AshaVerdict(spec, board, 3, stopped, 0, 10), StopVerdict::kContinue) << "no SIGFPE";
  spec.algorithm = EarlyStoppingAlgorithm::kMedian;
  board.Record(1, 20, INFINITY);
  EXPECT_EQ(MedianVerdict(spec, board, 1, 20), StopVerdict::kContinue)
      << "its best so far (2.0) counts; nobody else reached 20";
}

TEST(MedianStoppingTest, StopsExactlyTheTrialsWorseThanTheMedianAfterMinSteps) {
  // Trial i: 1 + 0.1 i - 0.01 s, reported every 10 steps in lockstep; minSteps 20.
  const EarlyStoppingSpec spec{EarlyStoppingAlgorithm::kMedian, 20, 3};
  MetricBoard board;
  for (int64_t s : {10, 20}) {
    for (int t = 0; t < 5; ++t) board.Record(t, s, 1.0 + 0.1 * t - 0.01 * static_cast<double>(s));
  }
  for (int t = 0; t < 5; ++t) {
    EXPECT_EQ(MedianVerdict(spec, board, t, 10), StopVerdict::kContinue) << "before minSteps";
  }
  const std::vector<StopVerdict> want = {StopVerdict::kContinue, StopVerdict::kContinue,
                                         StopVerdict::kContinue, StopVerdict::kStop,
                                         StopVerdict::kStop};
  for (int t = 0; t < 5; ++t) EXPECT_EQ(MedianVerdict(spec, board, t, 20), want[t]) << t;
}

TEST(MedianStoppingTest, ComparesBestLossesSoFarWithTrialsThatReachedTheStep) {
  const EarlyStoppingSpec spec{EarlyStoppingAlgorithm::kMedian, 10, 3};
  MetricBoard board;
  board.Record(0, 10, 0.5);  // best early, worse now: its best (0.5) counts
  board.Record(0, 20, 2.0);
  board.Record(1, 20, 1.0);
  board.Record(2, 20, 1.2);
  board.Record(3, 10, 0.1);  // has not reached step 20: left out
  EXPECT_EQ(MedianVerdict(spec, board, 0, 20), StopVerdict::kContinue);
  EXPECT_EQ(MedianVerdict(spec, board, 2, 20), StopVerdict::kStop) << "1.2 > median(0.5, 1.0)";
  EXPECT_EQ(MedianVerdict(spec, board, 3, 10), StopVerdict::kContinue) << "0.1 beats 0.5";
  MetricBoard alone;
  alone.Record(0, 50, 9.0);
  EXPECT_EQ(MedianVerdict(spec, alone, 0, 50), StopVerdict::kContinue) << "nobody to compare";
}

TEST(ReachableStepTest, TheNextRungForAshaTheEndOtherwise) {
  EarlyStoppingSpec spec{EarlyStoppingAlgorithm::kAsha, 10, 3};
  MetricBoard board;
  EXPECT_EQ(ReachableStep(spec, board, 100, 0), 10);
  board.Record(0, 10, 1.0);
  EXPECT_EQ(ReachableStep(spec, board, 100, 0), 30);
  board.Record(0, 90, 1.0);
  EXPECT_EQ(ReachableStep(spec, board, 100, 0), 100);
  spec.algorithm = EarlyStoppingAlgorithm::kMedian;
  EXPECT_EQ(ReachableStep(spec, MetricBoard(), 100, 0), 100);
}

TEST(ModelledStopStepsTest, AFractionOfTheTrialsAtEachRungStops) {
  const EarlyStoppingSpec asha{EarlyStoppingAlgorithm::kAsha, 10, 3};
  // Nine trials of 90 steps: rungs 10 and 30; two thirds stop at each.
  const auto reached = ModelledStopSteps(asha, std::vector<int64_t>(9, 90), 2.0 / 3);
  std::map<int64_t, int> count;
  for (int64_t s : reached) ++count[s];
  EXPECT_EQ(count[10], 6);
  EXPECT_EQ(count[30], 2);
  EXPECT_EQ(count[90], 1);
  // Nothing stops without an algorithm or a fraction; a trial too short for a rung finishes.
  EXPECT_EQ(ModelledStopSteps({}, {90, 90}, 0.5), (std::vector<int64_t>{90, 90}));
  EXPECT_EQ(ModelledStopSteps(asha, {90, 90}, 0), (std::vector<int64_t>{90, 90}));
  EXPECT_EQ(ModelledStopSteps(asha, {5, 5}, 1.0), (std::vector<int64_t>{5, 5}));
  const EarlyStoppingSpec median{EarlyStoppingAlgorithm::kMedian, 20, 3};
  EXPECT_EQ(ModelledStopSteps(median, {100, 100, 100, 100}, 0.5),
            (std::vector<int64_t>{100, 20, 100, 20}));
}

TEST(DescribeEarlyStoppingTest, SaysWhatHappensToTrials) {
  EXPECT_EQ(DescribeEarlyStopping({EarlyStoppingAlgorithm::kAsha, 10, 3}, 90),
            "asha on validationLoss: rungs at steps 10, 30 (of 90); the top 1/3 at each rung go "
            "on");
  EXPECT_THAT(DescribeEarlyStopping({EarlyStoppingAlgorithm::kMedian, 20, 3}, 90),
              ::testing::HasSubstr("from step 20"));
  EXPECT_EQ(DescribeEarlyStopping({}, 90), "");
}

}  // namespace
}  // namespace hydra
