#include "agent/executor/residency.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace hydra::executor {
namespace {

using R = Residency;

TEST(ResidencyTest, HostTierStateMovesBetweenHostAndDeviceAndKeepsItsHostCopy) {
  TierLedger ledger(0);
  PartResidency part(&ledger, "weights of shard 0", 40, Tier::kHost);
  EXPECT_EQ(part.where(), R::kInHost);
  EXPECT_EQ(ledger.current(Tier::kHost), 40);
  ASSERT_TRUE(part.To(R::kOnDevice).ok());
  EXPECT_EQ(ledger.current(Tier::kDevice), 40);
  EXPECT_EQ(ledger.current(Tier::kHost), 40);  // the master copy stays in host memory
  ASSERT_TRUE(part.To(R::kOnDevice).ok());     // staying is no move
  EXPECT_EQ(ledger.current(Tier::kDevice), 40);
  ASSERT_TRUE(part.To(R::kInHost).ok());
  EXPECT_EQ(ledger.current(Tier::kDevice), 0);
  for (R disk_state : {R::kOnDisk, R::kReading, R::kWritingBack}) {
    Status s = part.To(disk_state);
    EXPECT_EQ(s.code(), StatusCode::kInternal) << ResidencyName(disk_state);
    EXPECT_NE(s.message().find("host tier"), std::string::npos) << s;
    EXPECT_EQ(part.where(), R::kInHost);
  }
}

TEST(ResidencyTest, DiskTierStateGoesRoundTheCycleAndTheLedgerFollows) {
  TierLedger ledger(0);
  PartResidency part(&ledger, "optimizer state of shard 1", 100, Tier::kDisk);
  EXPECT_EQ(ledger.current(Tier::kHost), 100);  // built in host memory
  ASSERT_TRUE(part.To(R::kOnDisk).ok());        // spilled at set-up
  EXPECT_EQ(ledger.current(Tier::kHost), 0);
  ASSERT_TRUE(part.To(R::kReading).ok());  // a prefetch reserves its device memory
  EXPECT_EQ(ledger.current(Tier::kDevice), 100);
  ASSERT_TRUE(part.To(R::kOnDevice).ok());
  ASSERT_TRUE(part.To(R::kWritingBack).ok());  // freed only once the write is done
  EXPECT_EQ(ledger.current(Tier::kDevice), 100);
  ASSERT_TRUE(part.To(R::kOnDisk).ok());
  EXPECT_EQ(ledger.current(Tier::kDevice), 0);
  EXPECT_EQ(ledger.current(Tier::kHost), 0);
  EXPECT_EQ(ledger.peak(Tier::kDevice), 100);
}

TEST(ResidencyTest, StashedWeightsMoveFromTheDeviceToTheHostTierAndBack) {
  TierLedger ledger(0);
  PartResidency part(&ledger, "weights of shard 2", 30, Tier::kDisk);
  ASSERT_TRUE(part.To(R::kOnDisk).ok());
  ASSERT_TRUE(part.To(R::kReading).ok());
  ASSERT_TRUE(part.To(R::kOnDevice).ok());
  ASSERT_TRUE(part.To(R::kInHost).ok());
  EXPECT_EQ(ledger.current(Tier::kDevice), 0);
  EXPECT_EQ(ledger.current(Tier::kHost), 30);
  ASSERT_TRUE(part.To(R::kOnDevice).ok());  // the backward needs no read
  EXPECT_EQ(ledger.current(Tier::kDevice), 30);
  EXPECT_EQ(ledger.current(Tier::kHost), 0);
  ASSERT_TRUE(part.To(R::kOnDisk).ok());  // its file is current: dropped
  EXPECT_EQ(ledger.current(Tier::kDevice), 0);
}

TEST(ResidencyTest, MovesOffTheEdgesAreRefusedNamingBothStates) {
  TierLedger ledger(0);
  PartResidency part(&ledger, "weights of shard 3", 8, Tier::kDisk);
  ASSERT_TRUE(part.To(R::kOnDisk).ok());
  for (R bad : {R::kOnDevice, R::kInHost, R::kWritingBack}) {
    Status s = part.To(bad);
    EXPECT_EQ(s.code(), StatusCode::kInternal) << ResidencyName(bad);
    EXPECT_NE(s.message().find(std::string("from on disk to ") + ResidencyName(bad)),
              std::string::npos)
        << s;
    EXPECT_NE(s.message().find("weights of shard 3"), std::string::npos) << s;
  }
  ASSERT_TRUE(part.To(R::kReading).ok());
  EXPECT_EQ(part.To(R::kOnDisk).code(), StatusCode::kInternal);  // a read must finish first
  EXPECT_EQ(part.To(R::kWritingBack).code(), StatusCode::kInternal);
  EXPECT_EQ(part.where(), R::kReading);
  EXPECT_EQ(ledger.current(Tier::kDevice), 8);
}

TEST(ResidencyTest, AMoveOverTheDeviceBudgetChangesNothing) {
  TierLedger ledger(100);
  PartResidency a(&ledger, "weights of shard 0", 60, Tier::kDisk);
  PartResidency b(&ledger, "weights of shard 1", 60, Tier::kDisk);
  ASSERT_TRUE(a.To(R::kOnDisk).ok());
  ASSERT_TRUE(b.To(R::kOnDisk).ok());
  ASSERT_TRUE(a.To(R::kReading).ok());
  Status s = b.To(R::kReading);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("weights of shard 1"), std::string::npos) << s;
  EXPECT_EQ(b.where(), R::kOnDisk);
  EXPECT_EQ(ledger.current(Tier::kDevice), 60);
  // Stashed weights coming back to a full device stay in the host tier.
  TierLedger small(50);
  PartResidency c(&small, "weights of shard 2", 60, Tier::kDisk);
  EXPECT_EQ(c.To(R::kOnDevice).code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(c.where(), R::kInHost);
  EXPECT_EQ(small.current(Tier::kHost), 60);
  EXPECT_EQ(small.current(Tier::kDevice), 0);
}

TEST(ResidencyTest, APartGivesBackWhatItHoldsWhenDestroyedAndAMovedFromOneNothing) {
  TierLedger ledger(0);
  {
    PartResidency part(&ledger, "weights", 10, Tier::kHost);
    ASSERT_TRUE(part.To(R::kOnDevice).ok());
    PartResidency moved(std::move(part));
    EXPECT_EQ(moved.where(), R::kOnDevice);
    EXPECT_EQ(ledger.current(Tier::kDevice), 10);
  }
  EXPECT_EQ(ledger.current(Tier::kDevice), 0);
  EXPECT_EQ(ledger.current(Tier::kHost), 0);
}

TEST(ResidencyTest, EveryStateHasItsOwnName) {
  std::set<std::string> names;
  for (R r : {R::kOnDisk, R::kReading, R::kInHost, R::kOnDevice, R::kWritingBack}) {
    names.insert(ResidencyName(r));
  }
  EXPECT_EQ(names.size(), 5u);
}

}  // namespace
}  // namespace hydra::executor
