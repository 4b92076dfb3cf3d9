// hydra-agent's command line: --help, and flag mistakes that must stop it with a clear error.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

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
  void TearDown() override { fs::remove_all(dir_); }

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
};

TEST_F(AgentFlagsTest, HelpListsTheKubernetesStyleFlags) {
  std::string out;
  EXPECT_EQ(Run({"--help"}, &out), 0);
  for (const char* flag :
       {"--grpc-bind-address", "--metrics-bind-address", "--health-probe-bind-address",
        "--node-name", "--spill-dir", "--devices", "--data-root", "--checkpoint-root",
        "--tls-cert-file", "--tls-client-ca-file"}) {
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
}

}  // namespace
