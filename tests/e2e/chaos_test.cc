// Chaos: one job of 6 trials on 3 agents (one in its own network namespace) under a seeded
// random schedule of agent kills (SIGKILL and SIGTERM mixed), a controller kill and a network
// cut. Every trial must succeed with exactly the losses of an undisturbed `hydra run` of the
// same manifest, and no kill may cost more than one checkpoint interval of work.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <utility>
#include <vector>

#include "hydra/agent/v1/agent.grpc.pb.h"
#include "tests/fakes/agent_process.h"
#include "tests/fakes/control_plane.h"

namespace {

namespace fs = std::filesystem;
namespace v1 = ::hydra::agent::v1;
using hydra::fakes::Eventually;
using hydra::fakes::Proc;
using hydra::fakes::Sh;
using Json = nlohmann::json;

const std::string kSource = HYDRA_SOURCE_DIR;
const std::string kBinary = HYDRA_BINARY_DIR;
constexpr int kCheckpointEvery = 10;
constexpr unsigned kSeed = 20261122;

const char* kManifest = R"(apiVersion: hydra.dev/v1alpha1
kind: MultiModelJob
metadata: {name: chaos}
spec:
  model: {family: gpt2, nLayer: 2, nEmbd: 64, nHead: 2, contextLength: 64, vocabSize: 256}
  dataset: {format: text, path: data/corpus.txt}
  search:
    grid:
      learningRate: [1.0e-3, 2.0e-3, 3.0e-3]
      batchSize: [4, 8]
  training: {steps: 1600, seed: 7, evalEverySteps: 400, checkpointEverySteps: 10}
  resources: {deviceMemoryBudget: 256Mi}
  maxRestarts: 30
)";

/// An agent that can be killed and brought back (a spot node replaced under the same name).
struct Node {
  std::string name;
  std::string address = "127.0.0.1";  // the agent's IP (its own network namespace for one)
  std::string netns;                  // empty: the host's
  int grpc = 0, metrics = 0;
  Proc proc;
  std::string endpoint() const { return address + ":" + std::to_string(grpc); }
};

class ChaosTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("hydra-envtest-chaos-" + std::to_string(::getpid()));
    const std::string error = hydra::fakes::StartControlPlaneWithCrd(dir_);
    ASSERT_EQ(error, "");
    work_ = dir_ / "work";
    fs::create_directories(work_ / "data");
    fs::create_directories(work_ / "ckpt");
    fs::copy_file(kSource + "/examples/data/corpus.txt", work_ / "data" / "corpus.txt");
    std::ofstream(work_ / "chaos.yaml") << kManifest;
  }
  void TearDown() override {
    for (auto& n : nodes_) hydra::fakes::Stop(n.proc, SIGKILL, std::chrono::seconds(5));
    hydra::fakes::Stop(controller_, SIGKILL, std::chrono::seconds(5));
    hydra::fakes::Stop(prometheus_, SIGTERM, std::chrono::seconds(10));
    if (!netns_.empty()) Sh("ip netns delete " + netns_);
    hydra::fakes::StopControlPlane(dir_);
  }

  void StartNode(Node& n) {
    std::vector<std::string> args = {
        "--node-name", n.name, "--grpc-bind-address", n.endpoint(), "--grpc-advertise-address",
        n.endpoint(), "--metrics-bind-address", n.address + ":" + std::to_string(n.metrics),
        "--health-probe-bind-address", "0", "--devices", "cpu:1,budget=512Mi", "--threads", "1",
        "--data-root", (work_ / "data").string(), "--checkpoint-root", (work_ / "ckpt").string(),
        "--spill-dir", (work_ / ("spill-" + n.name)).string(), "--shutdown-linger-seconds", "2",
        // node-c listens on its veth address: plaintext there is
        // refused unless asked for.
        "--insecure"};
    const std::string agent = kBinary + "/agent/hydra-agent";
    if (n.netns.empty()) {
      n.proc = hydra::fakes::Start(agent, args, (work_ / (n.name + ".log")).string());
    } else {
      // `ip netns exec` execs the agent: the pid is the agent's.
      args.insert(args.begin(), {"netns", "exec", n.netns, agent});
      n.proc = hydra::fakes::Start("/usr/sbin/ip", args, (work_ / (n.name + ".log")).string());
    }
    ASSERT_GT(n.proc.pid, 0);
  }

  v1::GetStatusResponse StatusOf(const Node& n) {
    auto stub = v1::AgentService::NewStub(
        grpc::CreateChannel(n.endpoint(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
    v1::GetStatusResponse resp;
    stub->GetStatus(&ctx, {}, &resp);
    return resp;
  }

  void StartController() {
    controller_ = hydra::fakes::Start(
        kBinary + "/controller/hydra-controller",
        {"--prometheus-url", "http://127.0.0.1:" + std::to_string(prom_port_), "--data-root",
         work_.string(), "--checkpoint-root", (work_ / "ckpt").string(), "--metrics-bind-address",
         "0", "--health-probe-bind-address", "0", "--resync-seconds", "0.5", "--inventory-seconds",
         "0.5", "--agent-lost-seconds", "3"},
        (work_ / "controller.log").string());
    ASSERT_GT(controller_.pid, 0);
  }

  /// kManifest cut to one trial (lr 1e-3, batch 4) named `name`, with more edits, written to
  /// <work>/<name>.yaml; returns the path.
  std::string OneTrialManifest(const std::string& name,
                               const std::vector<std::pair<std::string, std::string>>& edits) {
    std::string m = kManifest;
    auto replace = [&](const std::string& from, const std::string& to) {
      m.replace(m.find(from), from.size(), to);
    };
    replace("name: chaos", "name: " + name);
    replace("learningRate: [1.0e-3, 2.0e-3, 3.0e-3]", "learningRate: [1.0e-3]");
    replace("batchSize: [4, 8]", "batchSize: [4]");
    for (const auto& [from, to] : edits) replace(from, to);
    const fs::path path = work_ / (name + ".yaml");
    std::ofstream(path) << m;
    return path.string();
  }

  /// One agent (node-a), a Prometheus scraping it and the controller.
  Node& StartOneNode() {
    nodes_.resize(1);
    Node& n = nodes_[0];
    n.name = "node-a";
    n.grpc = hydra::fakes::FreePort();
    n.metrics = hydra::fakes::FreePort();
    StartNode(n);
    prometheus_ = hydra::fakes::StartPrometheus(
        work_, std::vector<std::string>{"127.0.0.1:" + std::to_string(n.metrics)}, &prom_port_);
    StartController();
    return n;
  }

  fs::path dir_, work_;
  std::vector<Node> nodes_;
  Proc controller_, prometheus_;
  int prom_port_ = 0;
  std::string netns_;
};

TEST_F(ChaosTest, EveryTrialSucceedsWithTheUndisturbedLossesAndBoundedRework) {
  // The reference: the same manifest, undisturbed, with `hydra run`.
  auto [ref_rc, ref_out] =
      Sh(kBinary + "/cli/hydra run " + (work_ / "chaos.yaml").string() + " -o " +
         (work_ / "ref").string() + " --threads 2 --devices cpu:2 --progress quiet");
  ASSERT_EQ(ref_rc, 0) << ref_out;
  const Json ref = Json::parse(hydra::fakes::Slurp((work_ / "ref" / "results.json").string()));

  // Three nodes; node-c lives in its own network namespace behind a veth pair.
  const int subnet = 10 + static_cast<int>(::getpid() % 200);
  netns_ = "hydra-chaos-" + std::to_string(::getpid());
  const std::string host_if = "hc" + std::to_string(::getpid() % 100000) + "h";
  const std::string ns_if = "hc" + std::to_string(::getpid() % 100000) + "n";
  const std::string host_ip = "10.213." + std::to_string(subnet) + ".1";
  const std::string ns_ip = "10.213." + std::to_string(subnet) + ".2";
  for (const std::string& cmd :
       {"ip netns add " + netns_, "ip link add " + host_if + " type veth peer name " + ns_if,
        "ip link set " + ns_if + " netns " + netns_,
        "ip addr add " + host_ip + "/24 dev " + host_if, "ip link set " + host_if + " up",
        "ip netns exec " + netns_ + " ip addr add " + ns_ip + "/24 dev " + ns_if,
        "ip netns exec " + netns_ + " ip link set " + ns_if + " up",
        "ip netns exec " + netns_ + " ip link set lo up"}) {
    auto [rc, out] = Sh(cmd);
    ASSERT_EQ(rc, 0) << cmd << ": " << out;
  }
  nodes_.resize(3);
  for (int i = 0; i < 3; ++i) {
    Node& n = nodes_[i];
    n.name = std::string("node-") + static_cast<char>('a' + i);
    if (i == 2) {
      n.address = ns_ip;
      n.netns = netns_;
    }
    n.grpc = hydra::fakes::FreePort();
    n.metrics = hydra::fakes::FreePort();
    StartNode(n);
  }
  {
    std::vector<std::string> targets;
    for (const auto& n : nodes_) targets.push_back(n.address + ":" + std::to_string(n.metrics));
    prometheus_ = hydra::fakes::StartPrometheus(work_, targets, &prom_port_);
    ASSERT_GT(prometheus_.pid, 0);
  }
  ASSERT_TRUE(Eventually(
      [&] { return hydra::fakes::PrometheusCountIs(prom_port_, "hydra_agent_info", 3); }, 60))
      << hydra::fakes::Slurp((work_ / "prometheus.log").string());
  StartController();

  // Watch the agents: every (trial, attempt) and the step it resumed from.
  std::mutex mu;
  std::map<std::pair<std::string, int64_t>, int64_t> resumed_from;
  std::atomic<bool> watching{true};
  std::thread watcher([&] {
    while (watching) {
      for (const auto& n : nodes_) {
        const auto st = StatusOf(n);
        std::lock_guard<std::mutex> lock(mu);
        for (const auto& t : st.trials()) {
          if (t.state() == v1::RUNNING || t.state() == v1::SUCCEEDED) {
            resumed_from[{t.name(), t.attempt()}] = t.resumed_from_step();
          }
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });

  auto [rc, out] = Sh("kubectl apply -f " + (work_ / "chaos.yaml").string());
  ASSERT_EQ(rc, 0) << out;
  ASSERT_TRUE(Eventually(
      [&] {
        int running = 0;
        for (const auto& n : nodes_) {
          const auto st = StatusOf(n);
          for (const auto& t : st.trials()) running += t.state() == v1::RUNNING && t.step() > 20;
        }
        return running >= 3;
      },
      90))
      << hydra::fakes::Slurp((work_ / "controller.log").string());

  // The seeded schedule: 6 agent kills (SIGKILL / SIGTERM), a controller kill after the
  // third, a network cut of node-c after the fifth.
  struct Kill {
    std::string what;
    std::map<std::pair<std::string, int64_t>, int64_t> steps;  // (trial, attempt) -> step
  };
  std::vector<Kill> kills;
  std::mt19937 rng(kSeed);
  int sigkills = 0, sigterms = 0;
  for (int k = 0; k < 6; ++k) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1500 + rng() % 1500));
    Node& n = nodes_[rng() % 3];
    const bool hard = k == 0 ? true : k == 1 ? false : (rng() % 2 == 0);
    Kill kill{std::string(hard ? "SIGKILL " : "SIGTERM ") + n.name, {}};
    const auto before = StatusOf(n);
    for (const auto& t : before.trials()) {
      if (t.state() == v1::RUNNING) kill.steps[{t.name(), t.attempt()}] = t.step();
    }
    hydra::fakes::Stop(n.proc, hard ? SIGKILL : SIGTERM, std::chrono::seconds(30));
    (hard ? sigkills : sigterms)++;
    kills.push_back(kill);
    std::this_thread::sleep_for(std::chrono::milliseconds(1000 + rng() % 1000));
    StartNode(n);  // the node is replaced
    if (k == 2) {
      hydra::fakes::Stop(controller_, SIGKILL, std::chrono::seconds(5));
      kills.push_back({"SIGKILL controller", {}});
      std::this_thread::sleep_for(std::chrono::milliseconds(1500));
      StartController();
    }
    if (k == 4) {
      Node& c = nodes_[2];
      Kill cut{"network cut of " + c.name, {}};
      // Cut it while it trains something, so that a stale copy exists when it comes back.
      EXPECT_TRUE(Eventually(
          [&] {
            const auto st = StatusOf(c);
            for (const auto& t : st.trials()) {
              if (t.state() == v1::RUNNING) return true;
            }
            return false;
          },
          30))
          << "node-c never got a trial to cut off";
      const auto before_cut = StatusOf(c);
      for (const auto& t : before_cut.trials()) {
        if (t.state() == v1::RUNNING) cut.steps[{t.name(), t.attempt()}] = t.step();
      }
      Sh("ip link set " + host_if + " down");
      std::this_thread::sleep_for(std::chrono::seconds(7));  // lost after 3 s; trials move
      Sh("ip link set " + host_if + " up");
      EXPECT_FALSE(cut.steps.empty());
      kills.push_back(cut);
    }
  }
  EXPECT_GE(sigkills, 1);
  EXPECT_GE(sigterms, 1);

  Json job;
  const bool complete = hydra::fakes::WaitJobComplete("chaos", 300, &job);
  watching = false;
  watcher.join();
  ASSERT_TRUE(complete) << job["status"].dump(2) << "\n"
                        << hydra::fakes::Slurp((work_ / "controller.log").string());

  // Same losses as the undisturbed run.
  std::map<std::string, Json> reference;
  for (const auto& t : ref["trials"]) reference[t["name"]] = t;
  int restarts = 0;
  for (const auto& t : job["status"]["trials"]) {
    const std::string name = t["name"];
    SCOPED_TRACE(name);
    EXPECT_EQ(t["state"], "Succeeded");
    EXPECT_EQ(t["step"], 1600);
    ASSERT_TRUE(reference.count(name));
    EXPECT_EQ(t["validationLoss"].get<double>(), reference[name]["finalValLoss"].get<double>());
    EXPECT_EQ(t["trainLoss"].get<double>(), reference[name]["trainLoss"].back()[1].get<double>());
    restarts += t.value("restarts", 0);
  }
  EXPECT_GE(restarts, 3) << "the kills moved trials";

  // Work redone per kill: the step a trial had reached minus the step its next attempt
  // resumed from.
  std::printf("\nchaos schedule (seed %u), work redone per kill (checkpoint interval %d):\n", kSeed,
              kCheckpointEvery);
  for (const auto& k : kills) {
    int64_t worst = 0;
    int moved = 0;
    std::string detail;
    for (const auto& [key, step] : k.steps) {
      int64_t next_resume = -1;
      std::lock_guard<std::mutex> lock(mu);
      for (const auto& [rk, from] : resumed_from) {
        if (rk.first == key.first && rk.second > key.second &&
            (next_resume < 0 || rk.second < next_resume)) {
          next_resume = from;
        }
      }
      if (next_resume < 0) {  // it stayed (finished there, or the node came back in time)
        detail += " " + key.first + ":stayed";
        continue;
      }
      ++moved;
      const int64_t redone = std::max<int64_t>(0, step - next_resume);
      worst = std::max(worst, redone);
      detail += " " + key.first + ":" + std::to_string(redone);
      EXPECT_LE(redone, kCheckpointEvery) << k.what << " " << key.first;
    }
    std::printf("  %-24s max %3lld steps redone;%s\n", k.what.c_str(),
                static_cast<long long>(worst),
                k.steps.empty() ? " (no trial was running there)" : detail.c_str());
    if (k.what.rfind("network cut", 0) == 0) {
      // Cut for longer than --agent-lost-seconds: the controller must have moved its trials.
      EXPECT_GT(moved, 0) << "no trial moved off the cut-off node:" << detail;
      // The cut-off node came back with its old copies: none may have run to the end.
      const auto back = StatusOf(nodes_[2]);
      for (const auto& t : back.trials()) {
        if (k.steps.count({t.name(), t.attempt()})) {
          EXPECT_NE(t.state(), v1::SUCCEEDED) << t.name() << " finished on the stale node";
        }
      }
    }
  }
  // The stale node-c copies stopped: nothing but the final attempts ran to the end.
  for (const auto& n : nodes_) {
    const auto after = StatusOf(n);
    for (const auto& t : after.trials()) {
      EXPECT_NE(t.state(), v1::RUNNING) << n.name << " still runs " << t.name();
    }
  }
}

TEST_F(ChaosTest, ATrialThatKeepsLosingItsAgentFailsAfterMaxRestarts) {
  Node& n = StartOneNode();
  const std::string manifest = OneTrialManifest(
      "fragile", {{"steps: 1600", "steps: 100000"}, {"maxRestarts: 30", "maxRestarts: 1"}});
  auto applied = Sh("kubectl apply -f " + manifest);
  ASSERT_EQ(applied.first, 0) << applied.second;
  auto trial = [&] {
    auto [rc, text] = Sh("kubectl get mmj fragile -o json");
    auto j = Json::parse(text, nullptr, false);
    if (rc != 0 || j.is_discarded() || !j["status"].contains("trials")) return Json();
    return j["status"]["trials"][0];
  };
  for (int preemption = 1; preemption <= 2; ++preemption) {
    ASSERT_TRUE(Eventually(
        [&] {
          const auto st = StatusOf(n);
          for (const auto& t : st.trials()) {
            if (t.state() == v1::RUNNING && t.step() > 0) return true;
          }
          return false;
        },
        60))
        << hydra::fakes::Slurp((work_ / "controller.log").string());
    EXPECT_EQ(hydra::fakes::Stop(n.proc, SIGTERM), 0);  // a spot reclaim with notice
    StartNode(n);
    if (preemption == 1) {
      ASSERT_TRUE(Eventually([&] { return trial().value("restarts", 0) == 1; }, 30));
    }
  }
  Json t;
  ASSERT_TRUE(Eventually(
      [&] {
        t = trial();
        return t.value("state", "") == "Failed";
      },
      30))
      << t.dump(2);
  EXPECT_EQ(t["restarts"], 2);
  EXPECT_THAT(t.value("message", ""), ::testing::HasSubstr("more than spec.maxRestarts (1)"));
  auto events = Sh("kubectl get events --field-selector involvedObject.name=fragile");
  EXPECT_THAT(events.second, ::testing::HasSubstr("TrialRequeued"));
}

TEST_F(ChaosTest, ACorruptNewestCheckpointFallsBackToThePreviousOneWithAnEvent) {
  const std::string manifest = OneTrialManifest("scarred", {{"steps: 1600", "steps: 400"}});
  auto [ref_rc, ref_out] = Sh(kBinary + "/cli/hydra run " + manifest + " -o " +
                              (work_ / "ref").string() + " --threads 1 --progress quiet");
  ASSERT_EQ(ref_rc, 0) << ref_out;
  const Json ref =
      Json::parse(hydra::fakes::Slurp((work_ / "ref" / "results.json").string()))["trials"][0];

  Node& n = StartOneNode();
  auto applied = Sh("kubectl apply -f " + manifest);
  ASSERT_EQ(applied.first, 0) << applied.second;
  ASSERT_TRUE(Eventually(
      [&] {
        const auto st = StatusOf(n);
        for (const auto& t : st.trials()) {
          if (t.state() == v1::RUNNING && t.last_checkpoint_step() >= 3 * kCheckpointEvery) {
            return true;
          }
        }
        return false;
      },
      90))
      << hydra::fakes::Slurp((work_ / "controller.log").string());
  // The node dies; its newest checkpoint on the shared storage is damaged (a torn write
  // that a checksum catches, bit rot).
  hydra::fakes::Stop(n.proc, SIGKILL, std::chrono::seconds(5));
  const fs::path dir = work_ / "ckpt" / "default" / "scarred" / ref["name"].get<std::string>();
  std::vector<fs::path> files;
  for (const auto& f : fs::directory_iterator(dir)) {
    if (f.path().extension() == ".hck") files.push_back(f.path());
  }
  std::sort(files.begin(), files.end());
  ASSERT_GE(files.size(), 2u) << "two checkpoints are kept";
  {
    std::fstream f(files.back(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(fs::file_size(files.back()) / 2));
    f.put('\x5a').put('\xa5');
  }
  StartNode(n);

  Json job;
  ASSERT_TRUE(hydra::fakes::WaitJobComplete("scarred", 120, &job))
      << job.dump(2) << hydra::fakes::Slurp((work_ / "controller.log").string());
  const Json& t = job["status"]["trials"][0];
  EXPECT_EQ(t["restarts"], 1);
  // Resumed from the previous checkpoint, the trial ends exactly as if nothing happened.
  EXPECT_EQ(t["validationLoss"].get<double>(), ref["finalValLoss"].get<double>());
  EXPECT_EQ(t["trainLoss"].get<double>(), ref["trainLoss"].back()[1].get<double>());
  auto events =
      Sh("kubectl get events --field-selector involvedObject.name=scarred,reason=AgentNotice "
         "-o jsonpath='{.items[*].message}'");
  EXPECT_THAT(events.second, ::testing::HasSubstr(files.back().string() + " is corrupt"));
  EXPECT_THAT(events.second, ::testing::HasSubstr("falling back to an older checkpoint"));
}

}  // namespace
