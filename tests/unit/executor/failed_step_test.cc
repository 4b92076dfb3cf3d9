// FailedStep: an executor's memory of a step that failed midway.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "agent/executor/executor.h"

namespace hydra::executor {
namespace {

using ::testing::HasSubstr;

TEST(FailedStepTest, RunsUntilAStepFailsThenRefusesNamingTheFirstFailure) {
  FailedStep failed;
  int runs = 0;
  EXPECT_TRUE(failed.Guard("step 3", 3, [&] { return ++runs, OkStatus(); }).ok());
  EXPECT_FALSE(failed.failed());
  const Status disk = DataLossError("shard0.w.spill is corrupt");
  EXPECT_EQ(failed.Guard("step 4", 4, [&] { return ++runs, disk; }), disk);
  EXPECT_TRUE(failed.failed());
  // Refused without running, as a StatusOr too; a later failure does not replace the first.
  StatusOr<double> eval = failed.Guard("evaluating t", 4, [&]() -> StatusOr<double> {
    ++runs;
    return 1.0;
  });
  EXPECT_EQ(runs, 2);
  ASSERT_FALSE(eval.ok());
  EXPECT_EQ(eval.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(eval.status().message(), HasSubstr("evaluating t refused: step 4 failed midway"));
  EXPECT_THAT(eval.status().message(), HasSubstr("DATA_LOSS: shard0.w.spill is corrupt"));
  EXPECT_THAT(eval.status().message(), HasSubstr("last checkpoint"));
  failed.Record(InternalError("later"), 5);
  EXPECT_THAT(failed.Check("x").message(), HasSubstr("step 4"));
  EXPECT_THAT(failed.Check("x").message(), ::testing::Not(HasSubstr("later")));
}

TEST(FailedStepTest, AFirstFailureThatWasUnavailableKeepsItsCode) {
  // A full spill directory (UNAVAILABLE) while a move finished its writes: the move's caller
  // takes UNAVAILABLE for "no room there" and goes on; the next task is refused UNAVAILABLE, so
  // the trial is interrupted and resumes, not failed (FAILED_PRECONDITION).
  FailedStep failed;
  const Status full = UnavailableError("writing spill file shard0.w.spill: No space left");
  EXPECT_EQ(failed.GuardMove(
                "moving t", 2, [&] { return full; }, [] { return OkStatus(); }),
            full);
  const Status next = failed.Check("step 3 of t");
  EXPECT_EQ(next.code(), StatusCode::kUnavailable) << next;
  EXPECT_THAT(next.message(), HasSubstr("No space left"));
}

TEST(FailedStepTest, AnOkStatusIsNoFailure) {
  FailedStep failed;
  failed.Record(OkStatus(), 1);
  EXPECT_FALSE(failed.failed());
  EXPECT_TRUE(failed.Check("x").ok());
}

}  // namespace
}  // namespace hydra::executor
