#include "controller/metrics/controller_metrics.h"

#include <gtest/gtest.h>

namespace hydra::controller {
namespace {

TEST(ControllerMetricsTest, TrialsAndRestartsArePerJobAndGoWithTheJob) {
  ControllerMetrics m;
  m.SetJobTrials("team-a", "sweep", {{"Running", 2}, {"Succeeded", 1}});
  m.SetJobTrials("team-b", "sweep", {{"Pending", 4}});
  m.AddTrialRestarts("team-a", "sweep", "agent_lost", 2);
  m.AddTrialRestarts("team-a", "sweep", "agent_lost", 1);
  m.AddTrialRestarts("team-a", "sweep", "agent_drained", 0);
  std::string text = m.Render();
  EXPECT_NE(
      text.find(R"(hydra_controller_trials{job="sweep",namespace="team-a",state="Running"} 2)"),
      std::string::npos)
      << text;
  EXPECT_NE(
      text.find(R"(hydra_controller_trials{job="sweep",namespace="team-b",state="Pending"} 4)"),
      std::string::npos);
  EXPECT_NE(
      text.find(R"(hydra_controller_trials{job="sweep",namespace="team-b",state="Running"} 0)"),
      std::string::npos);
  EXPECT_NE(text.find(R"(hydra_controller_trial_restarts_total{job="sweep",namespace="team-a",)"
                      R"(reason="agent_lost"} 3)"),
            std::string::npos)
      << text;
  // Every reason's counter exists from the job's first count on, at 0 until it happens.
  EXPECT_NE(text.find(R"(hydra_controller_trial_restarts_total{job="sweep",namespace="team-b",)"
                      R"(reason="agent_drained"} 0)"),
            std::string::npos)
      << text;

  // A new count replaces the old one; deletion removes the job's series only.
  m.SetJobTrials("team-a", "sweep", {{"Succeeded", 3}});
  m.ForgetJob("team-b", "sweep");
  text = m.Render();
  EXPECT_NE(
      text.find(R"(hydra_controller_trials{job="sweep",namespace="team-a",state="Succeeded"} 3)"),
      std::string::npos);
  EXPECT_EQ(text.find("team-b"), std::string::npos) << text;
  m.ForgetJob("team-a", "sweep");
  text = m.Render();
  EXPECT_EQ(text.find("team-a"), std::string::npos) << text;
}

}  // namespace
}  // namespace hydra::controller
