// hydra-agent's command line: --help, flag mistakes that must stop it with a clear error, and
// flags that change how it trains.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <thread>

#include "hydra/agent/v1/agent.grpc.pb.h"
#include "proto/trial_proto.h"
#include "tests/fakes/agent_process.h"
#include "tests/fakes/subprocess.h"

namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

const std::string kAgent = std::string(HYDRA_BINARY_DIR) + "/agent/hydra-agent";

class AgentFlagsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("hydra_agent_flags_" + std::to_string(::getpid()));
    fs::create_directories(dir_ / "data");
    fs::create_directories(dir_ / "ckpt");
  }
  void TearDown() override {
    for (const auto& p : started_) hydra::fakes::Stop(p, SIGKILL, std::chrono::seconds(5));
    fs::remove_all(dir_);
  }

  int Run(std::vector<std::string> args, std::string* out) {
    auto p = hydra::fakes::Start(kAgent, args, (dir_ / "out.txt").string());
    const int rc = hydra::fakes::Wait(p);
    *out = hydra::fakes::Slurp(p.out_path);
    return rc;
  }
  std::vector<std::string> Roots() {
    return {"--data-root",
            (dir_ / "data").string(),
            "--checkpoint-root",
            (dir_ / "ckpt").string(),
            "--metrics-bind-address",
            "0",
            "--health-probe-bind-address",
            "0",
            "--grpc-bind-address",
            "127.0.0.1:0"};
  }

  fs::path dir_;
  std::vector<hydra::fakes::Proc> started_;  // agents a test started, stopped after it
};

TEST_F(AgentFlagsTest, HelpListsTheKubernetesStyleFlags) {
  std::string out;
  EXPECT_EQ(Run({"--help"}, &out), 0);
  for (const char* flag :
       {"--grpc-bind-address", "--metrics-bind-address", "--health-probe-bind-address",
        "--node-name", "--spill-dir", "--devices", "--data-root", "--checkpoint-root",
        "--tls-cert-file", "--tls-client-ca-file", "--optimizer"}) {
    EXPECT_THAT(out, HasSubstr(flag));
  }
}

TEST_F(AgentFlagsTest, MistakesStopTheAgentWithTheFlagNamed) {
  std::string out;
  EXPECT_NE(Run({"--data-root", (dir_ / "data").string()}, &out), 0);
  EXPECT_THAT(out, HasSubstr("--checkpoint-root"));

  auto args = Roots();
  args[1] = (dir_ / "missing").string();
  EXPECT_EQ(Run(args, &out), 2);
  EXPECT_THAT(out, HasSubstr("--data-root"));
  EXPECT_THAT(out, HasSubstr("not an existing directory"));

  args = Roots();
  args.insert(args.end(), {"--devices", "gpu:3"});
  EXPECT_EQ(Run(args, &out), 2);
  EXPECT_THAT(out, HasSubstr("--devices"));

  // GPUs: this (CPU) build says it has no CUDA; never trains on the CPU instead.
  args = Roots();
  args.insert(args.end(), {"--devices", "cuda:0,budget=20Gi"});
  EXPECT_EQ(Run(args, &out), 2);
  EXPECT_THAT(out, HasSubstr("--devices: this build has no CUDA"));

  args = Roots();
  args.insert(args.end(), {"--devices", "cpu:2,budget=lots"});
  EXPECT_EQ(Run(args, &out), 2);
  EXPECT_THAT(out, HasSubstr("budget"));

  args = Roots();
  args.insert(args.end(), {"--tls-cert-file", (dir_ / "none.pem").string(), "--tls-key-file",
                           (dir_ / "none.key").string()});
  EXPECT_EQ(Run(args, &out), 2);
  EXPECT_THAT(out, HasSubstr("--tls-cert-file"));

  args = Roots();
  args.insert(args.end(), {"--tls-client-identity", "hydra-controller"});
  EXPECT_EQ(Run(args, &out), 2);
  EXPECT_THAT(out, HasSubstr("mutual TLS"));

  // Plaintext gRPC on every interface: refused unless asked for by name.
  args = Roots();
  args.back() = "0.0.0.0:0";
  EXPECT_EQ(Run(args, &out), 2);
  EXPECT_THAT(out, HasSubstr("--insecure"));
  EXPECT_THAT(out, HasSubstr("reachable from other machines"));

  args = Roots();
  args.insert(args.end(), {"--host-memory", "-3Gi"});
  EXPECT_EQ(Run(args, &out), 2);
  EXPECT_THAT(out, HasSubstr("--host-memory"));

  args = Roots();
  args.insert(args.end(), {"--optimizer", "cpu"});
  EXPECT_NE(Run(args, &out), 0);
  EXPECT_THAT(out, HasSubstr("--optimizer"));
}

/// The shard plan of `name` on the agent at `endpoint` once its trial has one, naming where each
/// shard's optimizer steps ("dd", "h"); "" if none came within 30 s.
std::string OptimizerPlacements(const std::string& endpoint, const std::string& name) {
  auto stub = hydra::agent::v1::AgentService::NewStub(
      grpc::CreateChannel(endpoint, grpc::InsecureChannelCredentials()));
  for (int i = 0; i < 300; ++i) {
    grpc::ClientContext ctx;
    hydra::agent::v1::GetStatusResponse st;
    if (stub->GetStatus(&ctx, {}, &st).ok()) {
      for (const auto& t : st.trials()) {
        if (t.name() != name || t.shard_plan().shards().empty()) continue;
        std::string placements;
        for (const auto& s : t.shard_plan().shards()) placements += s.optimizer()[0];
        return placements;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return "";
}

TEST_F(AgentFlagsTest, OptimizerHostStepsEveryShardsOptimizerOnTheHost) {
  // A trial that spills at its device budget (13.4 MiB unsharded, 9 MiB given): on a CPU device
  // the cost model keeps its shards' optimizers on the device (the link is free), in 4 shards;
  // the operator's --optimizer host keeps the state in host memory, for every spilled trial the
  // agent trains, and the budget then holds the trial in 1 shard (hydra_cli_test trains it).
  std::filesystem::copy_file(std::string(HYDRA_SOURCE_DIR) + "/examples/data/corpus.txt",
                             dir_ / "data" / "corpus.txt");
  for (const std::string choice : {"auto", "host"}) {
    auto agent = hydra::fakes::StartAgentProcess("node-" + choice, "cpu:1", dir_, dir_ / "data",
                                                 dir_ / "ckpt", {"--optimizer", choice});
    ASSERT_GT(agent.proc.pid, 0) << hydra::fakes::Slurp(
        (dir_ / ("node-" + choice + ".log")).string());
    started_.push_back(agent.proc);
    hydra::Trial t;
    t.namespace_ = "default";
    t.job = "sweep";
    t.job_uid = "3c1d9e2a-7b44-4f0e-9d1a-5e6f7a8b9c0d";
    t.name = "placed-" + choice;
    t.model = {hydra::ModelFamily::kGpt2, 4, 128, 2, 16, 256};
    t.training.steps = 3;
    t.training.batch_size = 4;
    t.resources.device_memory_budget = int64_t{9} << 20;
    t.dataset.path = t.dataset.resolved_path = (dir_ / "data" / "corpus.txt").string();
    hydra::agent::v1::AssignTrialRequest req;
    hydra::wire::TrialToProto(t, req.mutable_trial());
    req.set_checkpoint_dir((dir_ / "ckpt" / "default" / "sweep" / t.name).string());
    {
      auto stub = hydra::agent::v1::AgentService::NewStub(
          grpc::CreateChannel(agent.endpoint(), grpc::InsecureChannelCredentials()));
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
      hydra::agent::v1::AssignTrialResponse resp;
      const grpc::Status assigned = stub->AssignTrial(&ctx, req, &resp);
      ASSERT_TRUE(assigned.ok()) << assigned.error_message();
    }
    const std::string placements = OptimizerPlacements(agent.endpoint(), t.name);
    EXPECT_EQ(hydra::fakes::Stop(agent.proc, SIGTERM), 0);
    started_.pop_back();  // reaped: its pid may be another process's by TearDown
    ASSERT_FALSE(placements.empty()) << hydra::fakes::Slurp(agent.proc.out_path);
    EXPECT_EQ(placements, choice == "host" ? "h" : "dddd") << "--optimizer " << choice;
    EXPECT_THAT(hydra::fakes::Slurp(agent.proc.out_path),
                HasSubstr(choice == "host" ? "optimizers on the host (--optimizer)"
                                           : "optimizers on the cost model's choice"));
  }
}

}  // namespace
