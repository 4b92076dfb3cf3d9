// The controller's inventory and placement against a real Prometheus that scrapes an agent's
// GPU series (job hydra-agent) and dcgm-exporter's (another job): both synthetic exporters,
// since this machine has no GPU. A GPU whose framebuffer another process fills refuses a trial
// that no longer fits, naming DCGM; once the memory is back, the trial is placed. The agent's
// own allocator cache, which DCGM counts as used, does not count against the trial.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <mutex>

#include "common/http/http_server.h"
#include "controller/placement/placement.h"
#include "tests/fakes/agent_process.h"
#include "tests/fakes/control_plane.h"

namespace hydra::controller {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

constexpr char kUuid[] = "GPU-5f6c0f5e-1b1e-3c0a-9b4e-0a1b2c3d4eff";

/// An HTTP /metrics endpoint whose text the test can change.
class Exporter {
 public:
  Exporter() : server_({{"/metrics", [this] { return Reply(); }}}) {}
  ~Exporter() { server_.Stop(); }
  Status Serve() {
    port_ = fakes::FreePort();
    return server_.Serve("127.0.0.1:" + std::to_string(port_));
  }
  void Set(std::string text) {
    std::lock_guard<std::mutex> lock(mu_);
    text_ = std::move(text);
  }
  std::string target() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  http::HttpReply Reply() {
    std::lock_guard<std::mutex> lock(mu_);
    return {200, "text/plain; version=0.0.4", text_};
  }
  std::mutex mu_;
  std::string text_;
  int port_ = 0;
  http::HttpServer server_;
};

/// dcgm-exporter's series for one H100 with `free_mib` of its 81559 MiB free.
std::string Dcgm(int free_mib) {
  return "DCGM_FI_DEV_FB_FREE{gpu=\"0\",UUID=\"" + std::string(kUuid) +
         "\",device=\"nvidia0\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"gpu-node\"} " +
         std::to_string(free_mib) + "\n";
}

Trial Asking(int64_t gib) {
  Trial t;
  t.name = "big";
  t.model = {ModelFamily::kGpt2, 2, 64, 4, 64, 256};
  t.training.steps = 10;
  t.training.batch_size = 8;
  t.dataset.path = t.dataset.resolved_path = "/data/corpus.txt";
  t.resources.device_memory_budget = gib << 30;
  return t;
}

TEST(DcgmPlacementTest, AGpuFilledByAnotherProcessRefusesATrialThatNoLongerFits) {
  const fs::path work = fs::temp_directory_path() / ("hydra_dcgm_" + std::to_string(getpid()));
  fs::remove_all(work);
  fs::create_directories(work);
  Exporter agent, dcgm;
  ASSERT_TRUE(agent.Serve().ok());
  ASSERT_TRUE(dcgm.Serve().ok());
  // The agent's series as hydra-agent writes them for a GPU (labels gpu and UUID), 70 GiB budget.
  const std::string labels =
      "{node=\"gpu-node\",device=\"cuda:0\",gpu=\"0\",UUID=\"" + std::string(kUuid) + "\"} ";
  agent.Set(
      "hydra_agent_info{node=\"gpu-node\",grpc_endpoint=\"gpu-node:9443\",version=\"0.1.0\"} 1\n"
      "hydra_device_memory_total_bytes" +
      labels + std::to_string(int64_t{70} << 30) + "\n" + "hydra_device_memory_free_bytes" +
      labels + std::to_string(int64_t{70} << 30) + "\n");
  dcgm.Set(Dcgm(81000));
  int prom_port = 0;
  fakes::Proc prometheus =
      fakes::StartPrometheus(work, {agent.target()}, &prom_port, {dcgm.target()});
  ASSERT_GT(prometheus.pid, 0);
  struct Cleanup {
    fakes::Proc p;
    fs::path dir;
    ~Cleanup() {
      fakes::Stop(p, SIGTERM, std::chrono::seconds(10));
      fs::remove_all(dir);
    }
  } cleanup{prometheus, work};
  const PrometheusClient client("http://127.0.0.1:" + std::to_string(prom_port));

  // Reads the inventory until the GPU's DCGM free memory is `mib`; then places the trial.
  auto place = [&](int mib, std::map<std::string, std::string>* waiting, int64_t gib = 40) {
    std::vector<AgentInventory> inventory;
    const bool seen = fakes::Eventually(
        [&] {
          auto inv = FetchInventory(client, "hydra-agent");
          if (!inv.ok() || inv->size() != 1 || inv->front().devices.size() != 1) return false;
          inventory = *inv;
          return inv->front().devices[0].dcgm_free_bytes == (int64_t{mib} << 20);
        },
        60);
    EXPECT_TRUE(seen) << "Prometheus never had DCGM free = " << mib
                      << " MiB; log: " << fakes::Slurp(prometheus.out_path);
    std::map<std::string, int> load;
    return PlaceTrials({{Asking(gib), 1}}, inventory, &load, waiting);
  };

  std::map<std::string, std::string> waiting;
  auto placed = place(81000, &waiting);
  ASSERT_EQ(placed.size(), 1u) << waiting["big"];
  EXPECT_EQ(placed[0].node, "gpu-node");

  // Another process takes all but 2 GiB of the GPU: 40 GiB no longer fits anywhere.
  dcgm.Set(Dcgm(2048));
  waiting.clear();
  EXPECT_TRUE(place(2048, &waiting).empty());
  EXPECT_THAT(waiting["big"], HasSubstr("deviceMemoryBudget 40.0 GiB is more than"));
  EXPECT_THAT(waiting["big"], HasSubstr("DCGM_FI_DEV_FB_FREE"));

  // It exits: the trial fits again.
  dcgm.Set(Dcgm(81000));
  waiting.clear();
  EXPECT_EQ(place(81000, &waiting).size(), 1u) << waiting["big"];

  // The agent trained a 50 GiB trial and is idle now, but LibTorch's caching allocator kept
  // the blocks: DCGM sees them (and the agent's CUDA context) as used. The blocks are the
  // agent's own, so the 40 GiB trial still fits.
  agent.Set(
      "hydra_agent_info{node=\"gpu-node\",grpc_endpoint=\"gpu-node:9443\",version=\"0.1.0\"} 1\n"
      "hydra_device_memory_total_bytes" +
      labels + std::to_string(int64_t{70} << 30) + "\n" + "hydra_device_memory_free_bytes" +
      labels + std::to_string(int64_t{70} << 30) + "\n" + "hydra_gpu_allocator_reserved_bytes" +
      labels + std::to_string(int64_t{50} << 30) + "\n");
  dcgm.Set(Dcgm(81000 - 50 * 1024 - 512));
  waiting.clear();
  ASSERT_TRUE(fakes::Eventually(
      [&] {
        auto inv = FetchInventory(client, "hydra-agent");
        return inv.ok() && inv->size() == 1 && inv->front().devices.size() == 1 &&
               inv->front().devices[0].process_bytes > 0;
      },
      60));
  EXPECT_EQ(place(81000 - 50 * 1024 - 512, &waiting).size(), 1u) << waiting["big"];
  EXPECT_EQ(place(81000 - 50 * 1024 - 512, &waiting, 60).size(), 1u) << waiting["big"];
  // Another process takes 20 GiB beside the agent's cache: 58.6 GiB are left to the agent's
  // trials, so a 60 GiB trial waits and the 40 GiB one still fits.
  dcgm.Set(Dcgm(81000 - 70 * 1024 - 512));
  waiting.clear();
  EXPECT_TRUE(place(81000 - 70 * 1024 - 512, &waiting, 60).empty());
  EXPECT_THAT(waiting["big"], HasSubstr("DCGM_FI_DEV_FB_FREE"));
  EXPECT_EQ(place(81000 - 70 * 1024 - 512, &waiting).size(), 1u) << waiting["big"];
}

}  // namespace
}  // namespace hydra::controller
