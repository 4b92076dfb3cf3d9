#include "agent/metrics/agent_metrics.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace hydra::agent {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(AgentMetricsTest, GpuSeriesCarryDcgmExportersGpuAndUuidLabels) {
  AgentMetrics metrics("node-a", "test");
  DeviceSpec gpu;
  gpu.kind = DeviceKind::kCuda;
  gpu.name = "cuda:1";
  gpu.index = 1;
  gpu.uuid = "GPU-5f6c0f5e-1b1e-3c0a-9b4e-0a1b2c3d4eff";
  metrics.SetDevice(gpu, 100, 60, 40, 0.5);
  metrics.SetDevice(CpuDevice(0, 10), 10, 10, 0, 0);
  const std::string text = metrics.Render();
  EXPECT_THAT(text, HasSubstr("hydra_device_memory_free_bytes{node=\"node-a\",UUID=\"GPU-5f6c0f5e-"
                              "1b1e-3c0a-9b4e-0a1b2c3d4eff\",device=\"cuda:1\",gpu=\"1\"} 60"));
  EXPECT_THAT(text, HasSubstr("hydra_device_busy_ratio{node=\"node-a\",UUID=\"GPU-5f6c0f5e-"));
  EXPECT_THAT(text,
              HasSubstr("hydra_device_memory_total_bytes{node=\"node-a\",device=\"cpu:0\"} 10"))
      << "a CPU device has neither gpu nor UUID";
  EXPECT_THAT(text, Not(HasSubstr("gpu=\"0\"")));
}

TEST(AgentMetricsTest, ADedicatedAgentsInfoNamesItsJobSoTheSharedPoolSkipsIt) {
  AgentMetrics shared("node-a", "test");
  shared.SetInfo({"10.0.0.1:9443", "", "auto"});
  EXPECT_THAT(shared.Render(), Not(HasSubstr("dedicated_job_uid")));
  AgentMetrics dedicated("node-b", "test");
  dedicated.SetInfo({"10.0.0.2:9443", "uid-7", "auto"});
  EXPECT_THAT(dedicated.Render(), HasSubstr("dedicated_job_uid=\"uid-7\""));
}

TEST(AgentMetricsTest, TheInfoSaysWhereSpilledTrialsOptimizersStep) {
  AgentMetrics m("node-a", "test");
  m.SetInfo(AgentMetrics::Info{});
  EXPECT_THAT(m.Render(), HasSubstr("optimizer=\"auto\"")) << "the default";
  m.SetInfo({"10.0.0.1:9443", "", "host"});
  const std::string text = m.Render();
  EXPECT_THAT(text, HasSubstr("optimizer=\"host\""));
  EXPECT_THAT(text, Not(HasSubstr("optimizer=\"auto\""))) << "one info series: the latest";
}

}  // namespace
}  // namespace hydra::agent
