#include "agent/executor/lookahead.h"

#include <gtest/gtest.h>

#include <vector>

#include "agent/executor/tier_ledger.h"

namespace hydra::executor {
namespace {

/// Records one step whose task t needed needs[t] bytes, with `early[t]` held early as it began.
void RecordStep(Lookahead* l, const std::vector<int64_t>& needs,
                const std::vector<int64_t>& early = {}) {
  for (size_t t = 0; t < needs.size(); ++t) {
    const int64_t e = t < early.size() ? early[t] : 0;
    l->Record(t, needs[t] + e, e);
  }
  l->EndStep();
}

TEST(LookaheadTest, NothingIsGrantedBeforeTwoStepsAreMeasured) {
  Lookahead l(3, 100);
  EXPECT_FALSE(l.Grant(0, 2, 1));
  RecordStep(&l, {10, 10, 10});  // the first step: it began with nothing on the device
  EXPECT_FALSE(l.measured());
  EXPECT_FALSE(l.Grant(0, 2, 1));
  RecordStep(&l, {10, 10, 10});
  EXPECT_TRUE(l.measured());
  EXPECT_TRUE(l.Grant(0, 2, 1));
}

TEST(LookaheadTest, AHoldFitsBesideEveryTaskItSpans) {
  Lookahead l(4, 100);
  RecordStep(&l, {30, 90, 50, 20});
  RecordStep(&l, {30, 90, 50, 20});
  EXPECT_FALSE(l.Grant(0, 3, 20));  // task 1 needs 90: 110 > 100
  EXPECT_TRUE(l.Grant(2, 4, 50));   // 50 + 50 fills the limit exactly
  EXPECT_FALSE(l.Grant(3, 4, 31));  // task 3: 20 + 50 granted + 31
  EXPECT_TRUE(l.Grant(3, 4, 30));
  EXPECT_TRUE(l.Grant(2, 2, 1000));  // spans no task: nothing to count
}

TEST(LookaheadTest, HoldsAcrossTheStepsEndCountInTheNextStep) {
  Lookahead l(3, 100);
  RecordStep(&l, {60, 20, 20});
  RecordStep(&l, {60, 20, 20});
  // From task 2 to the next step's task 1: tasks 2 and (next) 0.
  EXPECT_FALSE(l.Grant(2, 3 + 1, 50));  // next task 0 needs 60
  EXPECT_TRUE(l.Grant(2, 3 + 1, 40));
  RecordStep(&l, {60, 20, 20});  // the next step: its task 0 holds the 40 granted
  EXPECT_FALSE(l.Grant(0, 1, 1));
  EXPECT_TRUE(l.Grant(1, 2, 80));
}

TEST(LookaheadTest, WhatWasHeldEarlyIsNotCountedAsTheTasksNeed) {
  Lookahead l(2, 100);
  RecordStep(&l, {50, 50});
  RecordStep(&l, {50, 50}, {40, 40});  // the ledger saw 90: 40 of it the lookahead's
  EXPECT_TRUE(l.Grant(0, 2, 50));
}

TEST(LookaheadTest, AStepWithTasksUnrecordedAndResetForgetTheMeasurements) {
  Lookahead l(2, 100);
  RecordStep(&l, {10, 10});
  RecordStep(&l, {10, 10});
  l.Record(0, 10, 0);
  l.EndStep();  // task 1 never recorded (an abandoned step)
  EXPECT_FALSE(l.measured());
  RecordStep(&l, {10, 10});
  RecordStep(&l, {10, 10});
  EXPECT_TRUE(l.Grant(0, 2, 10));
  l.Reset();
  EXPECT_FALSE(l.measured());
  EXPECT_FALSE(l.Grant(0, 2, 10));
}

TEST(LookaheadTest, DroppedGrantsFreeTheirRoomAndTheMeasurementsStay) {
  // A move to another device within a step: every hold ends, and what each task needs is
  // still known.
  Lookahead l(3, 100);
  RecordStep(&l, {60, 20, 20});
  RecordStep(&l, {60, 20, 20});
  EXPECT_TRUE(l.Grant(1, 3 + 1, 40));  // this step's tasks 1 and 2, the next step's task 0
  EXPECT_FALSE(l.Grant(1, 2, 41));
  l.DropGrants();
  EXPECT_TRUE(l.measured());
  EXPECT_TRUE(l.Grant(1, 2, 80));
  EXPECT_TRUE(l.Grant(3, 3 + 1, 40));  // the next step's task 0: 60 + 40, nothing left over
}

TEST(LookaheadTest, TheLedgersWindowPeakIsATasksHighWaterMark) {
  TierLedger ledger(0);
  ASSERT_TRUE(ledger.Acquire(Tier::kDevice, 30, "a").ok());
  ASSERT_TRUE(ledger.Acquire(Tier::kDevice, 50, "b").ok());
  ledger.Release(Tier::kDevice, 50);
  EXPECT_EQ(ledger.TakeWindowPeak(Tier::kDevice), 80);
  EXPECT_EQ(ledger.TakeWindowPeak(Tier::kDevice), 30);  // the new window began at 30
  ledger.Release(Tier::kDevice, 30);
  ASSERT_TRUE(ledger.Acquire(Tier::kDevice, 10, "c").ok());
  EXPECT_EQ(ledger.TakeWindowPeak(Tier::kDevice), 30);
  EXPECT_EQ(ledger.peak(Tier::kDevice), 80);  // the overall peak is its own
}

}  // namespace
}  // namespace hydra::executor
