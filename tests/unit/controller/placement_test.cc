#include "controller/placement/placement.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/cost_model.h"
#include "common/partitioner.h"
#include "controller/reconciler/reconciler.h"
#include "controller/reconciler/work_queue.h"
#include "tests/fakes/scripted_http_server.h"

namespace hydra::controller {
namespace {

using ::testing::HasSubstr;

Trial MakeTrial(const std::string& name, int64_t layers, int64_t steps) {
  Trial t;
  t.name = name;
  t.model = {ModelFamily::kGpt2, layers, 64, 4, 64, 256};
  t.training.steps = steps;
  t.training.batch_size = 8;
  t.dataset.path = t.dataset.resolved_path = "/data/corpus.txt";
  return t;
}

AgentInventory Agent(const std::string& node, int devices, int64_t bytes, int64_t free_bytes) {
  AgentInventory a;
  a.node = node;
  a.endpoint = node + ":9443";
  for (int d = 0; d < devices; ++d) {
    DeviceInventory dev;
    dev.name = "cpu:" + std::to_string(d);
    dev.total_bytes = bytes;
    dev.free_bytes = free_bytes;
    a.devices.push_back(dev);
  }
  return a;
}

TEST(PlacementTest, LongestRemainingFirstOntoTheAgentWithTheMostFreeCapacity) {
  std::vector<AgentInventory> agents = {Agent("small", 1, int64_t{1} << 30, int64_t{1} << 30),
                                        Agent("big", 2, int64_t{1} << 30, int64_t{1} << 30)};
  std::vector<TrialToPlace> trials;
  for (auto [name, layers] :
       std::vector<std::pair<std::string, int64_t>>{{"short", 1}, {"long", 8}, {"mid", 4}}) {
    Trial t = MakeTrial(name, layers, 100);
    trials.push_back({t, EstimatedRemainingSeconds(t, 0)});
  }
  std::map<std::string, int> load;
  std::map<std::string, std::string> waiting;
  auto placed = PlaceTrials(trials, agents, &load, &waiting);
  ASSERT_EQ(placed.size(), 3u);
  EXPECT_TRUE(waiting.empty());
  EXPECT_EQ(placed[0].trial, "long");  // the longest goes first, to the biggest agent
  EXPECT_EQ(placed[0].node, "big");
  EXPECT_EQ(placed[1].trial, "mid");  // big now carries one: 2 GiB / 2 = 1 GiB ties small's
  EXPECT_EQ(placed[2].trial, "short");
  EXPECT_EQ(load["big:9443"] + load["small:9443"], 3);
  EXPECT_GE(load["small:9443"], 1) << "the load spreads";
}

TEST(PlacementTest, OnAGpuAgentATrialIsPlannedAsTheGpusPlansMayRunIt) {
  // Long context, many heads: one layer's attention scores (what a CPU's plan keeps, or
  // rebuilds in backward) outweigh a GPU's memory here, while the GPU's fused attention keeps
  // none. The controller's check of whether the trial fits plans as a GPU agent may.
  Trial t = MakeTrial("long-context", 2, 100);
  t.model.n_head = 16;
  t.model.context_length = 1024;
  const int64_t fused = EstimateTrialFootprint(t, AttentionMemory::kFused).total_bytes();
  const int64_t bytes = 2 * fused;
  ASSERT_LT(bytes, EstimateTrialFootprint(t).total_bytes() / 4) << "the scores dominate";
  AgentInventory gpu = Agent("gpu-node", 1, bytes, bytes);
  gpu.devices[0].name = "cuda:0";
  const AgentInventory cpu = Agent("cpu-node", 1, bytes, bytes);
  std::map<std::string, int> load;
  std::map<std::string, std::string> waiting;
  const std::vector<TrialToPlace> trials = {{t, EstimatedRemainingSeconds(t, 0)}};
  EXPECT_TRUE(PlaceTrials(trials, {cpu}, &load, &waiting).empty());
  EXPECT_THAT(waiting["long-context"], HasSubstr("cpu-node"));
  waiting.clear();
  auto placed = PlaceTrials(trials, {gpu}, &load, &waiting);
  ASSERT_EQ(placed.size(), 1u) << waiting["long-context"];
  EXPECT_EQ(placed[0].node, "gpu-node");
  EXPECT_EQ(placed[0].plan.attention, AttentionMemory::kFused);
  EXPECT_LE(placed[0].plan.peak_device_bytes, bytes);
  const PartitionOptions po = PlanOptionsOn(t, gpu);
  EXPECT_TRUE(po.stash_on_device && po.fused_attention && po.selective_recompute);
  EXPECT_FALSE(po.resident_state || po.activation_offload || po.checkpoint_offload)
      << "those need the agent's measured link";
  EXPECT_FALSE(PlanOptionsOn(t, cpu).fused_attention);
}

TEST(PlacementTest, ATrialThatFitsOnlyWithItsOptimizerOnTheHostGoesToAnAgentThatAllowsIt) {
  Trial t = MakeTrial("wide", 6, 100);
  t.model.n_embd = 256;
  // An agent's memory at which no plan fits with AdamW's state on the device.
  PartitionOptions device;
  device.optimizer_placement = OptimizerPlacement::kDevice;
  device.device_budget = EstimateTrialFootprint(t).total_bytes();
  while (PlanShards(t, device).ok()) device.device_budget = device.device_budget * 15 / 16;
  const int64_t bytes = device.device_budget;
  AgentInventory older = Agent("older", 1, bytes, bytes);  // its info has no optimizer label
  AgentInventory pinned = Agent("pinned", 1, bytes, bytes);
  pinned.optimizer = OptimizerPlacement::kDevice;
  AgentInventory automatic = Agent("automatic", 1, bytes, bytes);
  automatic.optimizer = std::nullopt;
  AgentInventory host = Agent("host", 1, bytes, bytes);
  host.optimizer = OptimizerPlacement::kHost;
  const std::vector<TrialToPlace> trials = {{t, EstimatedRemainingSeconds(t, 0)}};
  for (const AgentInventory& refuses : {older, pinned}) {
    std::map<std::string, int> load;
    std::map<std::string, std::string> waiting;
    EXPECT_TRUE(PlaceTrials(trials, {refuses}, &load, &waiting).empty()) << refuses.node;
    EXPECT_THAT(waiting["wide"], HasSubstr(refuses.node + ": no sharding fits"));
  }
  for (const AgentInventory& takes : {automatic, host}) {
    std::map<std::string, int> load;
    std::map<std::string, std::string> waiting;
    auto placed = PlaceTrials(trials, {takes}, &load, &waiting);
    ASSERT_EQ(placed.size(), 1u) << takes.node << ": " << waiting["wide"];
    EXPECT_LE(placed[0].plan.peak_device_bytes, bytes);
    for (const auto& s : placed[0].plan.shards) {
      EXPECT_EQ(s.optimizer, OptimizerPlacement::kHost) << takes.node;
    }
  }
  // With the state on disk the agent steps on the device whatever its flag (as it plans).
  t.resources.offload = OffloadTier::kDisk;
  EXPECT_EQ(PlanOptionsOn(t, host).optimizer_placement, std::nullopt);
}

TEST(PlacementTest, TrialsThatFitNoAgentWaitWithTheReason) {
  std::vector<AgentInventory> agents = {Agent("tiny", 1, 1 << 20, 1 << 20)};
  Trial huge = MakeTrial("huge", 4, 10);
  huge.model.n_embd = 4096;
  huge.model.n_head = 32;
  Trial asks = MakeTrial("asks", 1, 10);
  asks.resources.device_memory_budget = int64_t{8} << 30;
  std::map<std::string, int> load;
  std::map<std::string, std::string> waiting;
  auto placed = PlaceTrials({{huge, 1}, {asks, 1}}, agents, &load, &waiting);
  EXPECT_TRUE(placed.empty());
  EXPECT_THAT(waiting["huge"], HasSubstr("tiny"));
  EXPECT_THAT(waiting["asks"], HasSubstr("more than any agent's device"));
  waiting.clear();
  PlaceTrials({{asks, 1}}, {}, &load, &waiting);
  EXPECT_THAT(waiting["asks"], HasSubstr("no agents"));
}

TEST(PlacementTest, DcgmCapsEachGpuByWhatOtherProcessesLeave) {
  AgentInventory a = Agent("gpu", 2, int64_t{16} << 30, int64_t{16} << 30);
  EXPECT_EQ(a.FreeBytes(), int64_t{32} << 30);
  EXPECT_FALSE(a.LimitedByDcgm());
  a.devices[0].dcgm_free_bytes = int64_t{4} << 30;  // someone else's process holds 12 GiB
  EXPECT_EQ(a.devices[0].UsableBytes(), int64_t{4} << 30);
  EXPECT_EQ(a.FreeBytes(), int64_t{20} << 30);
  EXPECT_EQ(a.MaxDeviceBytes(), int64_t{16} << 30) << "the other GPU is whole";
  a.devices[1].dcgm_free_bytes = int64_t{2} << 30;
  a.devices[1].free_bytes = int64_t{10} << 30;  // our trials hold 6 GiB of it
  EXPECT_EQ(a.devices[1].UsableBytes(), int64_t{8} << 30) << "DCGM's free plus our own use";
  EXPECT_EQ(a.MaxDeviceBytes(), int64_t{8} << 30);
  EXPECT_TRUE(a.LimitedByDcgm());
  // A trial that needs more than any GPU can give waits, naming the other processes.
  Trial t = MakeTrial("big", 1, 10);
  t.resources.device_memory_budget = int64_t{12} << 30;
  std::map<std::string, int> load;
  std::map<std::string, std::string> waiting;
  EXPECT_TRUE(PlaceTrials({{t, 1}}, {a}, &load, &waiting).empty());
  EXPECT_THAT(waiting["big"], HasSubstr("DCGM_FI_DEV_FB_FREE"));
  t.resources.device_memory_budget = int64_t{8} << 30;
  EXPECT_EQ(PlaceTrials({{t, 1}}, {a}, &load, &waiting).size(), 1u);
}

TEST(PlacementTest, AnAgentsOwnAllocatorCacheIsNotAnotherProcesssMemory) {
  // An idle agent whose caching allocator kept 12 GiB of a finished trial's blocks: DCGM sees
  // 15.5 of 16 GiB used (with its CUDA context, which no trial can have), the agent's trials
  // plan nothing.
  AgentInventory a = Agent("gpu", 1, int64_t{16} << 30, int64_t{16} << 30);
  DeviceInventory& d = a.devices[0];
  d.dcgm_free_bytes = int64_t{512} << 20;
  EXPECT_EQ(d.UsableBytes(), int64_t{512} << 20) << "without the agent's process bytes";
  d.process_bytes = int64_t{12} << 30;
  EXPECT_EQ(d.UsableBytes(), (int64_t{12} << 30) + (int64_t{512} << 20));
  EXPECT_EQ(d.AvailableBytes(), (int64_t{12} << 30) + (int64_t{512} << 20));
  EXPECT_TRUE(a.LimitedByDcgm()) << "another process holds the remaining 3 GiB";
  // A running trial planned 6 GiB of the cache: 6.5 GiB left for new work.
  d.free_bytes = int64_t{10} << 30;
  EXPECT_EQ(d.UsableBytes(), (int64_t{12} << 30) + (int64_t{512} << 20));
  EXPECT_EQ(d.AvailableBytes(), (int64_t{6} << 30) + (int64_t{512} << 20));
  // Nothing else on the GPU: the agent's whole budget again, capped by its free memory.
  d.dcgm_free_bytes = (int64_t{16} << 30) - d.process_bytes;
  EXPECT_EQ(d.UsableBytes(), int64_t{16} << 30);
  EXPECT_EQ(d.AvailableBytes(), int64_t{10} << 30);
  EXPECT_FALSE(a.LimitedByDcgm());
}

TEST(ManifestTextTest, TheApiObjectParsesWithTheManifestParser) {
  kube::Json obj = {{"apiVersion", "hydra.dev/v1alpha1"},
                    {"kind", "MultiModelJob"},
                    {"metadata",
                     {{"name", "j"},
                      {"namespace", "team"},
                      {"uid", "abc"},
                      {"generation", 3},
                      {"finalizers", {"hydra.dev/trials"}},
                      {"managedFields", kube::Json::array()}}},
                    {"spec",
                     {{"model", {{"family", "gpt2"}, {"nLayer", 2}}},
                      {"dataset", {{"path", "data/corpus.txt"}, {"format", "text"}}},
                      {"search", {{"grid", {{"learningRate", {0.001, 0.002}}}}}},
                      {"training", {{"steps", 5}}},
                      {"checkpointRetention", "Delete"}}},
                    {"status", {{"trialCount", 2}}}};
  auto job = ParseJobYaml(ManifestText(obj), "/data-root");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->spec.dataset.resolved_path, "/data-root/data/corpus.txt");
  EXPECT_EQ(job->spec.checkpoint_retention, MultiModelJobSpec::CheckpointRetention::kDelete);
  EXPECT_EQ(ExpandTrials(*job)->size(), 2u);
}

TEST(WorkQueueTest, DeduplicatesAndNeverHandsOneKeyToTwoWorkers) {
  WorkQueue q;
  q.Add("a");
  q.Add("a");
  q.Add("b");
  EXPECT_EQ(q.Depth(), 2u);
  auto k = q.Get();
  ASSERT_TRUE(k);
  EXPECT_EQ(*k, "a");
  q.Add("a");  // while "a" is processed: queued again only when Done
  EXPECT_EQ(q.Depth(), 1u);
  EXPECT_EQ(*q.Get(), "b");
  q.Done("b");
  q.Done("a");
  EXPECT_EQ(q.Depth(), 1u);
  EXPECT_EQ(*q.Get(), "a");
  q.Done("a");
  q.AddAfter("c", std::chrono::milliseconds(100));
  EXPECT_EQ(q.Depth(), 0u);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(*q.Get(), "c");
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(90));
  q.ShutDown();
  EXPECT_FALSE(q.Get());
}

}  // namespace
}  // namespace hydra::controller

namespace hydra::controller {
namespace {

TEST(InventoryTest, AgentsDevicesAndDcgmFromPrometheus) {
  fakes::ScriptedServer prom;
  auto result = [](const std::string& series) {
    return R"({"status":"success","data":{"resultType":"vector","result":[)" + series + "]}}";
  };
  const std::string prom_replies[3] = {
      result(
          R"({"metric":{"__name__":"hydra_agent_info","node":"n1","grpc_endpoint":"n1:9443","version":"0.1.0","optimizer":"host"},"value":[1,"1"]},
                          {"metric":{"__name__":"hydra_agent_info","node":"n2","grpc_endpoint":"n2:9443","optimizer":"auto"},"value":[1,"1"]},
                          {"metric":{"__name__":"hydra_agent_info","node":"n3","grpc_endpoint":"n3:9443"},"value":[1,"1"]},
                          {"metric":{"__name__":"hydra_agent_info","node":"n4","grpc_endpoint":"10.9.0.4:9443","dedicated_job_uid":"u-9"},"value":[1,"1"]})"),
      result(
          R"({"metric":{"node":"n1","device":"cuda:0","gpu":"0","UUID":"GPU-a"},"value":[1,"17179869184"]},
                          {"metric":{"node":"n1","device":"cuda:1","gpu":"1","UUID":"GPU-b"},"value":[1,"17179869184"]},
                          {"metric":{"node":"n2","device":"cpu:0"},"value":[1,"1073741824"]},
                          {"metric":{"node":"n4","device":"cpu:0"},"value":[1,"1073741824"]})"),
      result(
          R"({"metric":{"node":"n1","device":"cuda:0","gpu":"0","UUID":"GPU-a"},"value":[1,"8589934592"]},
                          {"metric":{"node":"n1","device":"cuda:1","gpu":"1","UUID":"GPU-b"},"value":[1,"17179869184"]},
                          {"metric":{"node":"n2","device":"cpu:0"},"value":[1,"NaN"]})")};
  for (const auto& reply : prom_replies) prom.Push(200, reply);
  // dcgm-exporter's default label Hostname, a relabelled hostname, another node's GPU with
  // the same UUID label, and a GPU no agent reports.
  prom.Push(200, result(R"({"metric":{"Hostname":"n1","gpu":"0","UUID":"GPU-a"},"value":[1,"2048"]},
                          {"metric":{"hostname":"n1","gpu":"1","UUID":"GPU-b"},"value":[1,"1024"]},
                          {"metric":{"Hostname":"n2","gpu":"0","UUID":"GPU-a"},"value":[1,"1"]},
                          {"metric":{"Hostname":"n1","gpu":"7","UUID":"GPU-z"},"value":[1,"1"]})"));
  auto inv = FetchInventory(PrometheusClient(prom.url()), "hydra-agent");
  ASSERT_TRUE(inv.ok()) << inv.status();
  // Only the agents' own scrape job is asked (URL-encoded {job="hydra-agent"}).
  const auto asked = prom.requests();
  ASSERT_GE(asked.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_THAT(asked[i], HasSubstr("%7Bjob%3D%22hydra-agent%22%7D")) << asked[i];
  }
  ASSERT_EQ(inv->size(), 2u) << "n3 has no device series, n4 serves one job's pods: left out";
  const auto& n1 = (*inv)[0];
  EXPECT_EQ(n1.endpoint, "n1:9443");
  ASSERT_EQ(n1.devices.size(), 2u);
  EXPECT_EQ(n1.devices[0].uuid, "GPU-a");
  EXPECT_EQ(n1.devices[0].dcgm_free_bytes, int64_t{2048} << 20);
  EXPECT_EQ(n1.devices[1].dcgm_free_bytes, int64_t{1024} << 20);
  // cuda:0: 8 GiB ours + 2 GiB DCGM-free; cuda:1: nothing ours, 1 GiB free.
  EXPECT_EQ(n1.devices[0].UsableBytes(), int64_t{10} << 30);
  EXPECT_EQ(n1.MaxDeviceBytes(), int64_t{10} << 30);
  EXPECT_EQ(n1.FreeBytes(), int64_t{3072} << 20);
  EXPECT_EQ(n1.optimizer, OptimizerPlacement::kHost);
  EXPECT_EQ((*inv)[1].optimizer, std::nullopt) << "n2's --optimizer is auto";
  EXPECT_EQ((*inv)[1].devices[0].dcgm_free_bytes, -1) << "n2's CPU device has no UUID";
  EXPECT_EQ((*inv)[1].FreeBytes(), 0) << "an unreadable value counts as nothing free";
  EXPECT_EQ(n1.devices[1].process_bytes, -1) << "no allocator series (the query got a 500)";
  // With the agents' allocator series: cuda:1's cache of 4 GiB is the agent's, not another
  // process's (the allocator's reserved bytes).
  for (int i = 0; i < 3; ++i) prom.Push(200, prom_replies[i]);
  prom.Push(200,
            result(R"({"metric":{"Hostname":"n1","gpu":"1","UUID":"GPU-b"},"value":[1,"1024"]})"));
  prom.Push(
      200,
      result(
          R"({"metric":{"node":"n1","device":"cuda:1","gpu":"1","UUID":"GPU-b"},"value":[1,"4294967296"]})"));
  auto with_cache = FetchInventory(PrometheusClient(prom.url()), "hydra-agent");
  ASSERT_TRUE(with_cache.ok()) << with_cache.status();
  const auto& cuda1 = (*with_cache)[0].devices[1];
  EXPECT_EQ(cuda1.process_bytes, int64_t{4} << 30);
  EXPECT_EQ(cuda1.UsableBytes(), int64_t{5} << 30);
  EXPECT_THAT(prom.requests().back(),
              HasSubstr("hydra_gpu_allocator_reserved_bytes%7Bjob%3D%22hydra-agent%22%7D"));
  prom.Push(503, R"({"status":"error","error":"query timed out"})");
  auto down = FetchInventory(PrometheusClient(prom.url()), "hydra-agent");
  EXPECT_EQ(down.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(down.status().message(), HasSubstr("query timed out"));
}

TEST(InventoryTest, SamplesOfTheWrongTypeOrOutOfRangeAreSkipped) {
  fakes::ScriptedServer prom;
  auto result = [](const std::string& series) {
    return R"({"status":"success","data":{"resultType":"vector","result":[)" + series + "]}}";
  };
  // A non-string label, a value that is no number, a value past int64, a negative one, a
  // result that is not an object: each skipped, the good agent kept, nothing thrown.
  prom.Push(200, result(R"({"metric":{"node":"n1","grpc_endpoint":"n1:9443"},"value":[1,"1"]},
                          {"metric":{"node":7,"grpc_endpoint":"n7:9443"},"value":[1,"1"]},
                          "garbage",
                          {"metric":{"node":"n2","grpc_endpoint":"n2:9443"},"value":[1,"1"]})"));
  prom.Push(200, result(R"({"metric":{"node":"n1","device":"cpu:0"},"value":[1,"1073741824"]},
                          {"metric":{"node":"n2","device":"cpu:0"},"value":[1,"1e300"]},
                          {"metric":{"node":"n2","device":"cpu:1"},"value":[1,"-5"]},
                          {"metric":{"node":"n2","device":"cpu:2"},"value":[1,"lots"]},
                          {"metric":{"node":"n2","device":"cpu:3"},"value":[1]})"));
  prom.Push(200, result(R"({"metric":{"node":"n1","device":"cpu:0"},"value":[1,"1073741824"]})"));
  prom.Push(200, R"({"status":"success","data":"not an object"})");  // DCGM: unusable
  auto inv = FetchInventory(PrometheusClient(prom.url()), "hydra-agent");
  ASSERT_TRUE(inv.ok()) << inv.status();
  ASSERT_EQ(inv->size(), 1u) << "n2 has no usable device series";
  EXPECT_EQ((*inv)[0].node, "n1");
  EXPECT_EQ((*inv)[0].MaxDeviceBytes(), int64_t{1} << 30);
  EXPECT_EQ((*inv)[0].devices[0].dcgm_free_bytes, -1);
  prom.Push(200, R"([1, 2, 3])");
  EXPECT_EQ(FetchInventory(PrometheusClient(prom.url()), "").status().code(),
            StatusCode::kUnavailable);
}

}  // namespace
}  // namespace hydra::controller
