// Two real hydra-agent processes on loopback, driven over gRPC, scraped by a real Prometheus
// server (Debian's `prometheus`); the test reads device memory and training progress back
// through Prometheus's HTTP query API, as the controller will.
// cpprestsdk defines a macro U() that breaks GoogleTest unless told not to.
#define _TURN_OFF_PLATFORM_STRING
#include <cpprest/http_client.h>
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "hydra/agent/v1/agent.grpc.pb.h"
#include "proto/trial_proto.h"
#include "tests/fakes/agent_process.h"

namespace hydra {
namespace {

namespace fs = std::filesystem;
namespace v1 = ::hydra::agent::v1;
using fakes::Proc;
using ::testing::HasSubstr;

const std::string kPrometheus = "/usr/bin/prometheus";

/// GET http://127.0.0.1:port/path; {status, body}, status 0 if nothing answered.
std::pair<int, std::string> HttpGet(int port, const std::string& path_and_query) {
  try {
    web::http::client::http_client_config config;
    config.set_timeout(std::chrono::seconds(5));
    web::http::client::http_client client("http://127.0.0.1:" + std::to_string(port), config);
    auto response = client.request(web::http::methods::GET, path_and_query).get();
    return {response.status_code(), response.extract_utf8string(true).get()};
  } catch (const std::exception&) {
    return {0, ""};
  }
}

using Agent = fakes::AgentProcess;

class AgentPrometheusTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("hydra_agent_prom_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    for (const char* d : {"data", "ckpt", "prom"}) fs::create_directories(dir_ / d);
    fs::copy_file(std::string(HYDRA_SOURCE_DIR) + "/examples/data/corpus.txt",
                  dir_ / "data" / "corpus.txt");
  }
  void TearDown() override {
    for (auto& a : agents_) fakes::Stop(a.proc, SIGKILL, std::chrono::seconds(5));
    fakes::Stop(prometheus_, SIGTERM, std::chrono::seconds(10));
    fs::remove_all(dir_);
  }

  void StartAgent(const std::string& node, const std::string& devices,
                  const std::vector<std::string>& extra_args = {}) {
    Agent a =
        fakes::StartAgentProcess(node, devices, dir_, dir_ / "data", dir_ / "ckpt", extra_args);
    ASSERT_GT(a.proc.pid, 0);
    agents_.push_back(std::move(a));
    stubs_.push_back(v1::AgentService::NewStub(
        grpc::CreateChannel(agents_.back().endpoint(), grpc::InsecureChannelCredentials())));
  }

  v1::AgentService::Stub* Stub(const Agent& a) { return stubs_[&a - agents_.data()].get(); }

  bool WaitReady(const Agent& a) {
    for (int i = 0; i < 300; ++i) {
      if (HttpGet(a.health, "/readyz").first == 200) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  }

  void StartPrometheus() {
    prometheus_ = fakes::StartPrometheus(dir_, agents_, &prom_port_);
    ASSERT_GT(prometheus_.pid, 0) << "cannot start " << kPrometheus;
    bool ready = false;
    for (int i = 0; i < 300 && !ready; ++i) {
      ready = HttpGet(prom_port_, "/-/ready").first == 200;
      if (!ready) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ASSERT_TRUE(ready) << fakes::Slurp((dir_ / "prometheus.log").string());
  }

  /// Runs an instant query; the result vector.
  nlohmann::json Query(const std::string& promql) {
    auto [code, body] =
        HttpGet(prom_port_, "/api/v1/query?query=" + web::uri::encode_data_string(promql));
    if (code != 200) return nlohmann::json::array();
    auto j = nlohmann::json::parse(body, nullptr, false);
    if (j.is_discarded() || j.value("status", "") != "success") return nlohmann::json::array();
    return j["data"]["result"];
  }

  /// Polls `promql` until `pred` holds on its result (at most 30 s, Prometheus scrapes every
  /// second).
  nlohmann::json QueryUntil(const std::string& promql,
                            const std::function<bool(const nlohmann::json&)>& pred) {
    nlohmann::json result;
    for (int i = 0; i < 150; ++i) {
      result = Query(promql);
      if (pred(result)) return result;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    ADD_FAILURE() << "timed out waiting for " << promql << "; last result: " << result.dump();
    return result;
  }

  v1::AssignTrialRequest Request(const std::string& name, int64_t steps) {
    Trial t;
    t.namespace_ = "default";
    t.job = "sweep";
    t.job_uid = "3c1d9e2a-7b44-4f0e-9d1a-5e6f7a8b9c0d";
    t.name = name;
    t.model = {ModelFamily::kGpt2, 2, 32, 2, 32, 256};
    t.training.steps = steps;
    t.training.batch_size = 8;
    t.training.eval_every_steps = 10;
    t.training.checkpoint_every_steps = 10;
    t.dataset.path = t.dataset.resolved_path = (dir_ / "data" / "corpus.txt").string();
    v1::AssignTrialRequest req;
    wire::TrialToProto(t, req.mutable_trial());
    req.set_checkpoint_dir((dir_ / "ckpt" / "default" / "sweep" / name).string());
    return req;
  }

  grpc::Status Assign(Agent& a, const v1::AssignTrialRequest& req) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    v1::AssignTrialResponse resp;
    return Stub(a)->AssignTrial(&ctx, req, &resp);
  }

  fs::path dir_;
  std::vector<Agent> agents_;
  std::vector<std::unique_ptr<v1::AgentService::Stub>> stubs_;
  Proc prometheus_;
  int prom_port_ = 0;
};

double Value(const nlohmann::json& series) {
  return std::stod(series["value"][1].get<std::string>());
}

TEST_F(AgentPrometheusTest, TwoAgentsTrainAndPrometheusSeesTheirMemoryAndProgress) {
  ASSERT_TRUE(fs::exists(kPrometheus)) << "Debian's prometheus package is required";
  StartAgent("node-a", "cpu:1,budget=512Mi");
  StartAgent("node-b", "cpu:2,budget=256Mi", {"--optimizer", "host"});
  for (auto& a : agents_) ASSERT_TRUE(WaitReady(a)) << fakes::Slurp(a.proc.out_path);
  StartPrometheus();

  // Assign: two short trials on node-a, one short and one long one on node-b.
  Agent& a = agents_[0];
  Agent& b = agents_[1];
  ASSERT_TRUE(Assign(a, Request("sweep-lr1", 30)).ok());
  ASSERT_TRUE(Assign(a, Request("sweep-lr2", 30)).ok());
  ASSERT_TRUE(Assign(b, Request("sweep-lr3", 20)).ok());
  ASSERT_TRUE(Assign(b, Request("sweep-long", 100000)).ok());

  // Watch node-a's progress until both trials end.
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    v1::WatchProgressRequest req;
    req.set_job("sweep");
    auto reader = Stub(a)->WatchProgress(&ctx, req);
    std::map<std::string, v1::TrialState> state;
    std::map<std::string, int64_t> steps_seen;
    v1::TrialEvent e;
    while (reader->Read(&e)) {
      state[e.trial().name()] = e.trial().state();
      if (e.kind() == v1::TrialEvent::STEP) steps_seen[e.trial().name()] = e.trial().step();
      if (state["sweep-lr1"] == v1::SUCCEEDED && state["sweep-lr2"] == v1::SUCCEEDED) break;
    }
    ctx.TryCancel();
    EXPECT_EQ(state["sweep-lr1"], v1::SUCCEEDED);
    EXPECT_EQ(state["sweep-lr2"], v1::SUCCEEDED);
    EXPECT_GT(steps_seen["sweep-lr1"], 0) << "the stream carried step events";
  }

  // Device memory, per node and device, through Prometheus.
  auto free = QueryUntil("hydra_device_memory_free_bytes",
                         [](const nlohmann::json& r) { return r.size() == 3; });
  std::map<std::string, double> free_by;
  for (const auto& s : free) {
    free_by[s["metric"]["node"].get<std::string>() + "/" +
            s["metric"]["device"].get<std::string>()] = Value(s);
  }
  EXPECT_EQ(free_by["node-a/cpu:0"], 512.0 * 1024 * 1024);
  EXPECT_LE(free_by["node-b/cpu:0"], 256.0 * 1024 * 1024);
  EXPECT_EQ(free_by.count("node-b/cpu:1"), 1u);
  auto total = Query("sum by (node) (hydra_device_memory_total_bytes)");
  ASSERT_EQ(total.size(), 2u);

  // The controller's join: free memory per agent endpoint.
  auto joined = QueryUntil(
      "max by (node, grpc_endpoint) (hydra_device_memory_free_bytes * on (node) "
      "group_left (grpc_endpoint) hydra_agent_info)",
      [](const nlohmann::json& r) { return r.size() == 2; });
  std::set<std::string> endpoints;
  for (const auto& s : joined) endpoints.insert(s["metric"]["grpc_endpoint"].get<std::string>());
  EXPECT_EQ(endpoints, (std::set<std::string>{a.endpoint(), b.endpoint()}));
  // Where each agent lets spilled trials' optimizers step, for the controller's placement.
  std::map<std::string, std::string> optimizer;
  for (const auto& s : Query("hydra_agent_info")) {
    optimizer[s["metric"]["node"].get<std::string>()] = s["metric"].value("optimizer", "");
  }
  EXPECT_EQ(optimizer,
            (std::map<std::string, std::string>{{"node-a", "auto"}, {"node-b", "host"}}));

  // Progress, through Prometheus.
  auto steps =
      QueryUntil("hydra_trial_step{job=\"sweep\",node=\"node-a\"}", [](const nlohmann::json& r) {
        if (r.size() != 2) return false;
        for (const auto& s : r) {
          if (Value(s) != 30) return false;
        }
        return true;
      });
  EXPECT_EQ(steps.size(), 2u);
  auto losses = QueryUntil("hydra_trial_loss{split=\"validation\",node=\"node-a\"}",
                           [](const nlohmann::json& r) { return r.size() == 2; });
  for (const auto& s : losses) {
    EXPECT_GT(Value(s), 0.5);
    EXPECT_LT(Value(s), 6.0) << "a byte-level model starts near ln(256) = 5.5";
  }
  QueryUntil("hydra_trial_step{trial=\"sweep-long\"}",
             [](const nlohmann::json& r) { return r.size() == 1 && Value(r[0]) >= 2; });
  QueryUntil("sum(hydra_shard_tasks_total{phase=\"forward\"})",
             [](const nlohmann::json& r) { return r.size() == 1 && Value(r[0]) >= 80; });
  QueryUntil("hydra_agent_trials{state=\"Succeeded\",node=\"node-a\"}",
             [](const nlohmann::json& r) { return r.size() == 1 && Value(r[0]) == 2; });

  // Cancel one trial on node-b, drain the other node-b work, and SIGTERM node-a.
  {
    grpc::ClientContext ctx;
    v1::CancelTrialRequest req;
    const auto spec = Request("sweep-long", 1).trial();
    req.mutable_trial()->set_namespace_(spec.namespace_());
    req.mutable_trial()->set_job(spec.job());
    req.mutable_trial()->set_job_uid(spec.job_uid());
    req.mutable_trial()->set_name(spec.name());
    v1::CancelTrialResponse resp;
    ASSERT_TRUE(Stub(b)->CancelTrial(&ctx, req, &resp).ok());
    EXPECT_EQ(resp.trial().state(), v1::CANCELLED);
  }
  ASSERT_TRUE(Assign(b, Request("sweep-drained", 100000)).ok());
  for (int i = 0; i < 300; ++i) {
    grpc::ClientContext ctx;
    v1::GetStatusResponse st;
    ASSERT_TRUE(Stub(b)->GetStatus(&ctx, {}, &st).ok());
    bool going = false;
    for (const auto& t : st.trials())
      going = going || (t.name() == "sweep-drained" && t.step() >= 3);
    if (going) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  {
    grpc::ClientContext ctx;
    v1::DrainResponse resp;
    ASSERT_TRUE(Stub(b)->Drain(&ctx, {}, &resp).ok());
    bool found = false;
    for (const auto& t : resp.trials()) {
      if (t.name() != "sweep-drained") continue;
      found = true;
      EXPECT_EQ(t.state(), v1::INTERRUPTED);
      EXPECT_GE(t.step(), 3);
      EXPECT_EQ(t.last_checkpoint_step(), t.step());
    }
    EXPECT_TRUE(found);
    EXPECT_EQ(HttpGet(b.health, "/readyz").first, 503) << "a drained agent is not ready";
    EXPECT_EQ(HttpGet(b.health, "/healthz").first, 200);
  }
  // The drained trial resumes on node-a from its checkpoint (the spot-recovery path).
  auto moved = Request("sweep-drained", 100000);
  {
    grpc::ClientContext ctx;
    v1::GetStatusResponse st;
    ASSERT_TRUE(Stub(b)->GetStatus(&ctx, {}, &st).ok());
    for (const auto& t : st.trials()) {
      if (t.name() == "sweep-drained") moved.set_resume_from_step(t.last_checkpoint_step());
    }
  }
  ASSERT_TRUE(Assign(a, moved).ok());
  int64_t resumed_from = 0;
  for (int i = 0; i < 300 && resumed_from == 0; ++i) {
    grpc::ClientContext ctx;
    v1::GetStatusResponse st;
    ASSERT_TRUE(Stub(a)->GetStatus(&ctx, {}, &st).ok());
    for (const auto& t : st.trials()) {
      if (t.name() == "sweep-drained") resumed_from = t.resumed_from_step();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(resumed_from, moved.resume_from_step());

  EXPECT_EQ(fakes::Stop(a.proc, SIGTERM), 0) << fakes::Slurp(a.proc.out_path);
  const std::string log = fakes::Slurp(a.proc.out_path);
  EXPECT_THAT(log, HasSubstr("checkpointing every unfinished trial"));
  EXPECT_THAT(log, HasSubstr("stopped"));
  const fs::path spill = dir_ / "spill-node-a";
  EXPECT_TRUE(!fs::exists(spill) || fs::is_empty(spill)) << "spill files removed";
  EXPECT_EQ(fakes::Stop(b.proc, SIGTERM), 0) << fakes::Slurp(b.proc.out_path);
}

}  // namespace
}  // namespace hydra
