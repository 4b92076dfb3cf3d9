// GrpcAgentPool against real gRPC servers on loopback: a cut-off agent (calls that hang) reads
// UNAVAILABLE instead of its last answer and holds up no other agent; TLS checks every agent's
// certificate against one fixed name when asked to.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "common/file_util.h"
#include "controller/agentclient/agent_client.h"
#include "controller/agents/agent_certs.h"
#include "tests/fakes/subprocess.h"
#include "tests/fakes/test_certs.h"

namespace hydra::controller {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

/// GetStatus answers with the node name (counting the calls), or hangs while `cut` is set.
class StatusOnlyAgent final : public v1::AgentService::Service {
 public:
  explicit StatusOnlyAgent(std::string node) : node_(std::move(node)) {}
  grpc::Status GetStatus(grpc::ServerContext* ctx, const v1::GetStatusRequest*,
                         v1::GetStatusResponse* out) override {
    status_calls += 1;
    while (cut && !ctx->IsCancelled()) std::this_thread::sleep_for(10ms);
    out->set_node_name(node_);
    return grpc::Status::OK;
  }
  std::atomic<bool> cut{false};
  std::atomic<int> status_calls{0};

 private:
  std::string node_;
};

struct Server {
  explicit Server(const std::string& node, std::shared_ptr<grpc::ServerCredentials> creds = nullptr)
      : agent(node) {
    grpc::ServerBuilder b;
    int port = 0;
    b.AddListeningPort("127.0.0.1:0", creds ? creds : grpc::InsecureServerCredentials(), &port);
    b.RegisterService(&agent);
    server = b.BuildAndStart();
    endpoint = "127.0.0.1:" + std::to_string(port);
  }
  ~Server() {
    agent.cut = false;
    server->Shutdown(std::chrono::system_clock::now() + 1s);
  }
  StatusOnlyAgent agent;
  std::unique_ptr<grpc::Server> server;
  std::string endpoint;
};

TEST(GrpcAgentPoolTest, ACutOffAgentReadsUnavailableAndHoldsUpNoOther) {
  Server a("node-a"), b("node-b");
  auto pool = GrpcAgentPool::Create({}, /*refresh=*/100ms, /*rpc_timeout=*/2s,
                                    /*status_timeout=*/300ms);
  ASSERT_TRUE(pool.ok());
  (*pool)->Track({a.endpoint, b.endpoint});
  auto both_fresh = [&] {
    return (*pool)->LastStatus(a.endpoint).ok() && (*pool)->LastStatus(b.endpoint).ok();
  };
  for (int i = 0; i < 100 && !both_fresh(); ++i) std::this_thread::sleep_for(20ms);
  ASSERT_TRUE(both_fresh());
  EXPECT_EQ((*pool)->LastStatus(b.endpoint)->node_name(), "node-b");

  // Packets to node-b are dropped: its calls hang until their deadline, no error comes back.
  b.agent.cut = true;
  std::this_thread::sleep_for(1200ms);
  auto last = (*pool)->LastStatus(b.endpoint);
  EXPECT_EQ(last.status().code(), StatusCode::kUnavailable);
  EXPECT_GE((*pool)->SecondsSinceContact(b.endpoint), 0.9);
  // node-a's copy stays fresh although every round also calls node-b.
  EXPECT_TRUE((*pool)->LastStatus(a.endpoint).ok());
  EXPECT_LT((*pool)->SecondsSinceContact(a.endpoint), 0.5);

  b.agent.cut = false;  // the link is back
  for (int i = 0; i < 100 && !(*pool)->LastStatus(b.endpoint).ok(); ++i) {
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_TRUE((*pool)->LastStatus(b.endpoint).ok());
}

// An agent just tracked is awaited until it first answers, or, silent, for as long as a first
// answer may take (a call's deadline and a retry: 2 x (refresh + status timeout)).
TEST(GrpcAgentPoolTest, AnAgentsFirstAnswerIsDueUntilItAnswersOrForAWhileAtMost) {
  Server a("node-a"), b("node-b");
  b.agent.cut = true;
  auto pool = GrpcAgentPool::Create({}, /*refresh=*/100ms, /*rpc_timeout=*/2s,
                                    /*status_timeout=*/900ms);
  ASSERT_TRUE(pool.ok());
  EXPECT_FALSE((*pool)->FirstAnswerDue(a.endpoint)) << "not tracked";
  const auto tracked = std::chrono::steady_clock::now();
  (*pool)->Track({a.endpoint, b.endpoint});
  for (int i = 0; i < 100 && !(*pool)->LastStatus(a.endpoint).ok(); ++i) {
    std::this_thread::sleep_for(5ms);
  }
  ASSERT_TRUE((*pool)->LastStatus(a.endpoint).ok());
  EXPECT_FALSE((*pool)->FirstAnswerDue(a.endpoint)) << "it answered";
  if (std::chrono::steady_clock::now() - tracked < 1500ms) {  // not on a starved machine
    EXPECT_TRUE((*pool)->FirstAnswerDue(b.endpoint)) << "silent for less than 2 s";
  }
  std::this_thread::sleep_for(2000ms - (std::chrono::steady_clock::now() - tracked) + 100ms);
  EXPECT_FALSE((*pool)->FirstAnswerDue(b.endpoint)) << "silent for longer than 2 s";
  EXPECT_EQ((*pool)->LastStatus(b.endpoint).status().code(), StatusCode::kNotFound);
}

// Each job's pass tracks the endpoints it needs; one job's pass must not stop the polling of
// an agent only another job uses (nor restart its silence clock). Endpoints no pass names for
// `forget_after` are dropped with their pollers.
TEST(GrpcAgentPoolTest, AnEndpointIsForgottenOnlyWhenNoPassNamedItForAWhile) {
  Server a("node-a"), b("node-b");
  auto pool = GrpcAgentPool::Create({}, /*refresh=*/50ms, /*rpc_timeout=*/2s,
                                    /*status_timeout=*/300ms, /*forget_after=*/1500ms);
  ASSERT_TRUE(pool.ok());
  (*pool)->Track({a.endpoint, b.endpoint});
  b.agent.cut = true;  // b never answers: its silence must keep growing
  std::this_thread::sleep_for(400ms);
  (*pool)->Track({a.endpoint});  // another job's pass, which does not use b
  EXPECT_EQ((*pool)->pollers(), 2u);
  std::this_thread::sleep_for(300ms);
  EXPECT_GE((*pool)->SecondsSinceContact(b.endpoint), 0.6) << "b's silence was reset";
  (*pool)->Track({b.endpoint});  // b's job
  (*pool)->Track({a.endpoint});
  std::this_thread::sleep_for(1600ms);
  (*pool)->Track({a.endpoint});  // nobody named b for longer than forget_after
  b.agent.cut = false;
  for (int i = 0; i < 100 && (*pool)->pollers() != 1; ++i) {
    std::this_thread::sleep_for(20ms);
    (*pool)->Track({a.endpoint});  // reaps the stopped poller once it has finished
  }
  EXPECT_EQ((*pool)->pollers(), 1u);
  EXPECT_TRUE((*pool)->LastStatus(a.endpoint).ok());
  EXPECT_EQ((*pool)->LastStatus(b.endpoint).status().code(), StatusCode::kNotFound);
}

// A job's own pod is gone: its address is polled no more at once (not after forget_after).
TEST(GrpcAgentPoolTest, AForgottenEndpointIsPolledNoMore) {
  Server a("node-a"), b("node-b");
  auto pool = GrpcAgentPool::Create({}, /*refresh=*/50ms, /*rpc_timeout=*/2s,
                                    /*status_timeout=*/300ms, /*forget_after=*/60s);
  ASSERT_TRUE(pool.ok());
  (*pool)->Track({a.endpoint, b.endpoint});
  for (int i = 0; i < 100 && !(*pool)->LastStatus(b.endpoint).ok(); ++i) {
    std::this_thread::sleep_for(20ms);
  }
  ASSERT_TRUE((*pool)->LastStatus(b.endpoint).ok());
  (*pool)->Forget({b.endpoint, "127.0.0.1:1"});  // one never tracked: nothing to do
  EXPECT_EQ((*pool)->LastStatus(b.endpoint).status().code(), StatusCode::kNotFound);
  for (int i = 0; i < 100 && (*pool)->pollers() != 1; ++i) {
    std::this_thread::sleep_for(20ms);
    (*pool)->Track({a.endpoint});
  }
  EXPECT_EQ((*pool)->pollers(), 1u);
  const int calls = b.agent.status_calls.load();
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(b.agent.status_calls.load(), calls) << "b is still polled";
  EXPECT_EQ((*pool)->LastStatus(b.endpoint).status().code(), StatusCode::kNotFound);
  (*pool)->Track({b.endpoint});  // named again: polled afresh
  for (int i = 0; i < 100 && !(*pool)->LastStatus(b.endpoint).ok(); ++i) {
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_TRUE((*pool)->LastStatus(b.endpoint).ok());
}

/// Not a test of its own: the agent process TlsAgentsThatComeUpAfterTheFirstDialAnswerWithin-
/// Seconds starts (a server in the pool's process would drive gRPC's shared polling and hide
/// what that test shows). Serves TLS on HYDRA_TEST_AGENT_PORT with HYDRA_TEST_CERT_DIR's
/// server.pem until killed.
TEST(GrpcAgentPoolTest, DISABLED_TlsAgentProcess) {
  const char* port = std::getenv("HYDRA_TEST_AGENT_PORT");
  const char* dir = std::getenv("HYDRA_TEST_CERT_DIR");
  if (port == nullptr || dir == nullptr) GTEST_SKIP() << "started by another test";
  auto read = [&](const std::string& f) { return *ReadPemFile(f, std::string(dir) + "/" + f); };
  grpc::SslServerCredentialsOptions o;
  o.pem_key_cert_pairs.push_back({read("server.key"), read("server.pem")});
  StatusOnlyAgent agent(std::string("node-") + port);
  grpc::ServerBuilder b;
  b.AddListeningPort(std::string("127.0.0.1:") + port, grpc::SslServerCredentials(o));
  b.RegisterService(&agent);
  auto server = b.BuildAndStart();
  ASSERT_NE(server, nullptr);
  std::this_thread::sleep_for(1h);
}

TEST(GrpcAgentPoolTest, TlsAgentsThatComeUpAfterTheFirstDialAnswerWithinSeconds) {
  // A new agent pod's address is dialled before its agent listens. gRPC then reconnects in the
  // background, where a TLS handshake advanced only on its backup poller's ticks (seconds
  // apart) and ran past the connect deadline again and again: with CI's load, the controller
  // reached no agent for minutes. The pool has to drive the connection itself.
  const fs::path dir =
      fs::temp_directory_path() / ("agent-pool-late-" + std::to_string(::getpid()));
  ASSERT_TRUE(fakes::MakeTestCertificates(dir));
  auto pool = GrpcAgentPool::Create({(dir / "ca.pem").string(), "", "", "", ""}, 1s, 10s, 3s);
  ASSERT_TRUE(pool.ok());
  std::vector<std::string> endpoints;
  for (int i = 0; i < 3; ++i) endpoints.push_back("127.0.0.1:" + std::to_string(fakes::FreePort()));
  (*pool)->Track(endpoints);
  auto all = [&](auto&& pred) {
    return std::all_of(endpoints.begin(), endpoints.end(),
                       [&](const std::string& e) { return pred((*pool)->LastStatus(e)); });
  };
  auto refused = [](const StatusOr<v1::GetStatusResponse>& s) {  // dialled, nobody there
    return !s.ok() && s.status().message().find("refused") != std::string::npos;
  };
  for (int i = 0; i < 100 && !all(refused); ++i) std::this_thread::sleep_for(50ms);
  ASSERT_TRUE(all(refused));
  char self[4096] = {};
  ASSERT_GT(::readlink("/proc/self/exe", self, sizeof(self) - 1), 0);
  setenv("HYDRA_TEST_CERT_DIR", dir.c_str(), 1);
  std::vector<fakes::Proc> agents;
  for (const auto& e : endpoints) {
    setenv("HYDRA_TEST_AGENT_PORT", e.substr(e.rfind(':') + 1).c_str(), 1);
    agents.push_back(fakes::Start(self,
                                  {"--gtest_filter=GrpcAgentPoolTest.DISABLED_TlsAgentProcess",
                                   "--gtest_also_run_disabled_tests"},
                                  (dir / (e.substr(e.rfind(':') + 1) + ".log")).string()));
  }
  unsetenv("HYDRA_TEST_AGENT_PORT");
  unsetenv("HYDRA_TEST_CERT_DIR");
  const auto started = std::chrono::steady_clock::now();
  auto answered = [](const StatusOr<v1::GetStatusResponse>& s) { return s.ok(); };
  while (!all(answered) && std::chrono::steady_clock::now() - started < 10s) {
    std::this_thread::sleep_for(50ms);
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  for (const auto& e : endpoints) {
    EXPECT_TRUE((*pool)->LastStatus(e).ok())
        << e << " after " << seconds << " s: " << (*pool)->LastStatus(e).status().message();
  }
  for (const auto& a : agents) fakes::Stop(a, SIGKILL, 5s);
  fs::remove_all(dir);
}

TEST(GrpcAgentPoolTest, TlsChecksEveryAgentAgainstOneFixedNameWhenAsked) {
  const fs::path dir = fs::temp_directory_path() / ("agent-pool-tls-" + std::to_string(::getpid()));
  ASSERT_TRUE(fakes::MakeTestCertificates(dir));
  auto read = [&](const std::string& f) { return *ReadPemFile(f, (dir / f).string()); };
  grpc::SslServerCredentialsOptions o;
  o.pem_key_cert_pairs.push_back({read("named.key"), read("named.pem")});
  Server agent("node-a", grpc::SslServerCredentials(o));  // no SAN for 127.0.0.1

  // Checked against the host it dials (127.0.0.1): the certificate does not name it.
  auto by_host = GrpcAgentPool::Create({(dir / "ca.pem").string(), "", "", "", ""}, 100ms, 2s, 1s);
  ASSERT_TRUE(by_host.ok());
  auto refused = (*by_host)->FreshStatus(agent.endpoint);
  EXPECT_FALSE(refused.ok());

  // Checked against the fixed name the certificate carries.
  auto by_name = GrpcAgentPool::Create(
      {(dir / "ca.pem").string(), "", "", "hydra-agent.hydra.svc", ""}, 100ms, 2s, 1s);
  ASSERT_TRUE(by_name.ok());
  auto answered = (*by_name)->FreshStatus(agent.endpoint);
  ASSERT_TRUE(answered.ok()) << answered.status().message();
  EXPECT_EQ(answered->node_name(), "node-a");

  // Any other fixed name is refused.
  auto wrong = GrpcAgentPool::Create({(dir / "ca.pem").string(), "", "", "other.hydra.svc", ""},
                                     100ms, 2s, 1s);
  ASSERT_TRUE(wrong.ok());
  EXPECT_FALSE((*wrong)->FreshStatus(agent.endpoint).ok());
  // A name without a CA is a configuration error.
  EXPECT_EQ(GrpcAgentPool::Create({"", "", "", "x", ""}).status().code(),
            StatusCode::kInvalidArgument);
  fs::remove_all(dir);
}

TEST(GrpcAgentPoolTest, AJobsAgentPodIsCheckedAgainstTheJobsOwnName) {
  const fs::path dir = fs::temp_directory_path() / ("agent-pool-job-" + std::to_string(::getpid()));
  ASSERT_TRUE(fakes::MakeTestCertificates(dir));
  auto ca = LoadCertificateAuthority((dir / "ca.pem").string(), (dir / "ca.key").string());
  ASSERT_TRUE(ca.ok()) << ca.status().message();
  auto mine = IssueServerCertificate(*ca, AgentServerName("team-a", "sweep"), 24h);
  ASSERT_TRUE(mine.ok()) << mine.status().message();
  grpc::SslServerCredentialsOptions o;
  o.pem_key_cert_pairs.push_back({mine->key_pem, mine->cert_pem});
  Server agent("node-a", grpc::SslServerCredentials(o));

  // The pool trusts the job agents' CA (given as PEM, beside no --agent-tls-ca-file); its
  // default name (none: the host) does not pass, the job's own name does.
  auto pool = GrpcAgentPool::Create({"", "", "", "", ca->cert_pem}, 100ms, 2s, 1s);
  ASSERT_TRUE(pool.ok());
  EXPECT_FALSE((*pool)->FreshStatus(agent.endpoint).ok());
  (*pool)->SetServerName(agent.endpoint, "sweep.team-a.agents.hydra.dev");
  auto answered = (*pool)->FreshStatus(agent.endpoint);
  ASSERT_TRUE(answered.ok()) << answered.status().message();
  EXPECT_EQ(answered->node_name(), "node-a");
  // Another namespace's job of the same name expects its own name: this agent fails it, and
  // the pool forgets what the address answered before.
  (*pool)->SetServerName(agent.endpoint, AgentServerName("team-b", "sweep"));
  EXPECT_FALSE((*pool)->FreshStatus(agent.endpoint).ok());
  EXPECT_FALSE((*pool)->LastStatus(agent.endpoint).ok());
  fs::remove_all(dir);
}

}  // namespace
}  // namespace hydra::controller
