#include "agent/rpc/dedicated_job.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace hydra::agent {
namespace {

using ::testing::HasSubstr;

TEST(DedicatedJobTest, ParsesAllThreeParts) {
  auto j = ParseDedicatedJob("team-a/sweep/1234-abcd");
  ASSERT_TRUE(j.ok()) << j.status().message();
  EXPECT_EQ(j->namespace_, "team-a");
  EXPECT_EQ(j->name, "sweep");
  EXPECT_EQ(j->uid, "1234-abcd");
  EXPECT_EQ(j->ToString(), "team-a/sweep (uid 1234-abcd)");
}

TEST(DedicatedJobTest, RefusesAnythingButNamespaceNameUid) {
  for (const char* bad :
       {"", "team-a", "team-a/sweep", "team-a/sweep/", "/sweep/uid", "team-a//uid", "a/b/c/d"}) {
    auto j = ParseDedicatedJob(bad);
    ASSERT_FALSE(j.ok()) << bad;
    EXPECT_EQ(j.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(j.status().message(), HasSubstr("NAMESPACE/NAME/UID")) << bad;
  }
}

TEST(DedicatedJobTest, OnlyItsJobPassesAndEveryPartMatters) {
  const DedicatedJob job{"team-a", "sweep", "u1"};
  EXPECT_TRUE(CheckDedicatedJob(std::nullopt, "x", "y", "z", "assigned").ok())
      << "a shared agent serves every job";
  EXPECT_TRUE(CheckDedicatedJob(job, "team-a", "sweep", "u1", "assigned").ok());
  // Another namespace's job of the same name, a recreated job (new uid), another job.
  for (const auto& [ns, name, uid] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"team-b", "sweep", "u1"}, {"team-a", "sweep", "u2"}, {"team-a", "other", "u1"}}) {
    Status s = CheckDedicatedJob(job, ns, name, uid, "cancelled");
    EXPECT_EQ(s.code(), StatusCode::kPermissionDenied) << ns << "/" << name << "/" << uid;
    EXPECT_THAT(s.message(), HasSubstr("serves only MultiModelJob team-a/sweep (uid u1)"));
    EXPECT_THAT(s.message(), HasSubstr("is not cancelled here"));
  }
}

}  // namespace
}  // namespace hydra::agent
