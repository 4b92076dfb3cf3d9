// AgentService over real gRPC on loopback, with the torch-free fake executor: the request
// checks, progress streams, cancel/drain and TLS.
#include "agent/rpc/agent_service.h"

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include "agent/executor/checkpoint.h"
#include "agent/rpc/tls.h"
#include "proto/trial_proto.h"
#include "tests/fakes/fake_executor.h"
#include "tests/fakes/subprocess.h"
#include "tests/fakes/test_certs.h"

namespace hydra::agent {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr int64_t kDeviceBytes = int64_t{1} << 30;

class AgentServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("hydra_agent_svc_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    for (const char* d : {"data", "ckpt", "outside"}) fs::create_directories(dir_ / d);
    std::ofstream(dir_ / "data" / "corpus.txt") << std::string(4000, 'a');
    std::ofstream(dir_ / "outside" / "secret.txt") << std::string(4000, 's');
    fs::create_directory_symlink(dir_ / "outside", dir_ / "data" / "escape");
  }
  void TearDown() override {
    server_.reset();
    service_.reset();
    fs::remove_all(dir_);
  }

  void StartServer(std::shared_ptr<grpc::ServerCredentials> creds = nullptr,
                   const std::string& identity = "",
                   std::optional<DedicatedJob> dedicated = std::nullopt) {
    AgentConfig config;
    config.dedicated_job = dedicated;
    config.node_name = "node-a";
    config.version = "test";
    config.devices = {CpuDevice(0, kDeviceBytes), CpuDevice(1, kDeviceBytes)};
    config.data_roots = {fs::canonical(dir_ / "data").string()};
    config.checkpoint_roots = {fs::canonical(dir_ / "ckpt").string()};
    config.required_client_identity = identity;
    metrics_ = std::make_unique<AgentMetrics>("node-a", "test");
    service_ = std::make_unique<AgentService>(config, &factory_, metrics_.get());
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", creds ? creds : grpc::InsecureServerCredentials(),
                             &port_);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_TRUE(server_ != nullptr);
    ASSERT_GT(port_, 0);
  }

  std::unique_ptr<v1::AgentService::Stub> Client(
      std::shared_ptr<grpc::ChannelCredentials> creds = nullptr) {
    const std::string target = (creds ? "localhost:" : "127.0.0.1:") + std::to_string(port_);
    return v1::AgentService::NewStub(
        grpc::CreateChannel(target, creds ? creds : grpc::InsecureChannelCredentials()));
  }

  Trial MakeTrial(const std::string& name, int64_t steps, const std::string& ns = "ns") {
    Trial t;
    t.namespace_ = ns;
    t.job = "job-1";
    t.job_uid = "uid-1";
    t.name = name;
    t.model = {ModelFamily::kGpt2, 1, 8, 2, 8, 256};
    t.training.steps = steps;
    t.training.batch_size = 2;
    t.training.eval_every_steps = 5;
    t.training.checkpoint_every_steps = 4;
    t.dataset.path = t.dataset.resolved_path = (dir_ / "data" / "corpus.txt").string();
    return t;
  }
  /// The checkpoint directory the controller names: <root>/<namespace>/<job>/<trial>.
  fs::path TrialDir(const std::string& name, const std::string& ns = "ns") {
    return dir_ / "ckpt" / ns / "job-1" / name;
  }
  v1::AssignTrialRequest Request(const std::string& name, int64_t steps = 10,
                                 const std::string& ns = "ns") {
    v1::AssignTrialRequest req;
    wire::TrialToProto(MakeTrial(name, steps, ns), req.mutable_trial());
    req.set_checkpoint_dir(TrialDir(name, ns).string());
    return req;
  }
  static v1::TrialRef Ref(const std::string& name, const std::string& ns = "ns",
                          const std::string& uid = "uid-1") {
    v1::TrialRef ref;
    ref.set_namespace_(ns);
    ref.set_job("job-1");
    ref.set_job_uid(uid);
    ref.set_name(name);
    return ref;
  }
  grpc::Status Cancel(v1::AgentService::Stub& stub, const v1::TrialRef& ref, bool delete_files,
                      v1::CancelTrialResponse* resp = nullptr) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    v1::CancelTrialRequest req;
    *req.mutable_trial() = ref;
    req.set_delete_checkpoints(delete_files);
    v1::CancelTrialResponse ignored;
    return stub.CancelTrial(&ctx, req, resp ? resp : &ignored);
  }
  grpc::Status Assign(v1::AgentService::Stub& stub, const v1::AssignTrialRequest& req,
                      v1::AssignTrialResponse* resp = nullptr) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::AssignTrialResponse ignored;
    return stub.AssignTrial(&ctx, req, resp ? resp : &ignored);
  }
  v1::GetStatusResponse StatusOf(v1::AgentService::Stub& stub) {
    grpc::ClientContext ctx;
    v1::GetStatusResponse resp;
    EXPECT_TRUE(stub.GetStatus(&ctx, {}, &resp).ok());
    return resp;
  }
  /// Polls GetStatus until `pred` holds (at most about `seconds`).
  bool WaitFor(v1::AgentService::Stub& stub,
               const std::function<bool(const v1::GetStatusResponse&)>& pred, int seconds = 10) {
    for (int i = 0; i < seconds * 100; ++i) {
      if (pred(StatusOf(stub))) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }

  fs::path dir_;
  fakes::FakeExecutorFactory factory_;
  std::unique_ptr<AgentMetrics> metrics_;
  std::unique_ptr<AgentService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

TEST_F(AgentServiceTest, AssignedTrialsTrainAndReportThroughStatusAndMetrics) {
  StartServer();
  auto stub = Client();
  v1::AssignTrialResponse resp;
  ASSERT_TRUE(Assign(*stub, Request("t-a", 12), &resp).ok());
  EXPECT_EQ(resp.trial().name(), "t-a");
  EXPECT_EQ(resp.trial().job(), "job-1");
  EXPECT_EQ(resp.trial().shard_plan().shards_size(), 1);
  ASSERT_TRUE(Assign(*stub, Request("t-b", 8)).ok());
  ASSERT_TRUE(WaitFor(*stub, [](const v1::GetStatusResponse& s) {
    int done = 0;
    for (const auto& t : s.trials()) done += t.state() == v1::SUCCEEDED;
    return done == 2;
  }));
  auto status = StatusOf(*stub);
  EXPECT_EQ(status.node_name(), "node-a");
  ASSERT_EQ(status.devices_size(), 2);
  EXPECT_EQ(status.devices(0).memory_total_bytes(), kDeviceBytes);
  EXPECT_EQ(status.devices(0).memory_free_bytes(), kDeviceBytes);
  for (const auto& t : status.trials()) {
    EXPECT_EQ(t.step(), t.steps());
    EXPECT_EQ(t.last_checkpoint_step(), t.steps());
    EXPECT_TRUE(std::isfinite(t.final_validation_loss()));
    EXPECT_EQ(t.checkpoint_dir(), fs::canonical(TrialDir(t.name())).string());
    EXPECT_EQ(t.namespace_(), "ns");
    EXPECT_EQ(t.job_uid(), "uid-1");
  }
  service_->Tick();
  const std::string text = metrics_->Render();
  EXPECT_THAT(
      text,
      HasSubstr("hydra_trial_step{node=\"node-a\",job=\"job-1\",job_uid=\"uid-1\",namespace=\"ns\","
                "trial=\"t-a\"} 12"));
  EXPECT_THAT(text, HasSubstr("split=\"validation\""));
  EXPECT_THAT(text, HasSubstr("hydra_shard_tasks_total{node=\"node-a\",phase=\"forward\"} 20"));
  EXPECT_THAT(text, HasSubstr("hydra_agent_trials{node=\"node-a\",state=\"Succeeded\"} 2"));
  EXPECT_THAT(text, HasSubstr("hydra_device_memory_free_bytes{node=\"node-a\",device=\"cpu:0\"} "
                              "1073741824"));
  EXPECT_THAT(text, HasSubstr("hydra_checkpoint_duration_seconds_count{node=\"node-a\"}"));
}

/// On a GPU, the agent exports the caching allocator's bytes with dcgm-exporter's labels and
/// says once when the allocator holds more than the trials' ledger accounts, in tensors or only
/// in its cache.
TEST(AgentServiceGpuTest, AllocatorBytesAreExportedAndCheckedAgainstTheLedger) {
  DeviceSpec gpu;
  gpu.kind = DeviceKind::kCuda;
  gpu.index = 0;
  gpu.name = "cuda:0";
  gpu.uuid = "GPU-11111111-2222-3333-4444-555555555555";
  gpu.model = "NVIDIA H100 80GB HBM3";
  gpu.memory_bytes = int64_t{70} << 30;
  AgentConfig config;
  config.node_name = "node-a";
  config.version = "test";
  config.devices = {gpu, CpuDevice(1, kDeviceBytes)};
  fakes::FakeExecutorFactory factory;
  factory.allocator[0] = {int64_t{3} << 30, int64_t{4} << 30};  // no trial: ledger 0
  AgentMetrics metrics("node-a", "test");
  ::testing::internal::CaptureStderr();
  AgentService service(config, &factory, &metrics);  // ticks once
  service.Tick();
  const std::string said = ::testing::internal::GetCapturedStderr();
  const std::string text = metrics.Render();
  EXPECT_THAT(text, HasSubstr("hydra_gpu_allocator_allocated_bytes{node=\"node-a\","
                              "UUID=\"GPU-11111111-2222-3333-4444-555555555555\",device=\"cuda:0\","
                              "gpu=\"0\"} 3221225472"));
  EXPECT_THAT(text, HasSubstr("hydra_gpu_allocator_reserved_bytes{node=\"node-a\","
                              "UUID=\"GPU-11111111-2222-3333-4444-555555555555\",device=\"cuda:0\","
                              "gpu=\"0\"} 4294967296"));
  EXPECT_THAT(text, Not(HasSubstr("device=\"cpu:1\",gpu")));  // a CPU device has no allocator
  // Said once over two ticks.
  const std::string line =
      "hydra-agent: cuda:0 (GPU-11111111-2222-3333-4444-555555555555): "
      "LibTorch's caching allocator holds 3.00 GiB in tensors";
  ASSERT_THAT(said, HasSubstr(line));
  EXPECT_EQ(said.find(line), said.rfind(line)) << said;
  {
    std::lock_guard<std::mutex> lock(factory.mu);
    factory.allocator[0] = {0, int64_t{4} << 30};
  }
  ::testing::internal::CaptureStderr();
  service.Tick();
  // The tensors are gone, the cache is not.
  EXPECT_THAT(::testing::internal::GetCapturedStderr(),
              HasSubstr("LibTorch's caching allocator reserves more than the trials' ledger (0 B "
                        "in tensors, 4.00 GiB reserved, ledger 0 B)"));
  {
    std::lock_guard<std::mutex> lock(factory.mu);
    factory.allocator[0] = {0, int64_t{256} << 20};
  }
  ::testing::internal::CaptureStderr();
  service.Tick();
  EXPECT_THAT(::testing::internal::GetCapturedStderr(),
              HasSubstr("back within the trials' ledger"));
}

struct BadRequest {
  std::string name;
  std::function<void(v1::AssignTrialRequest*, const fs::path& dir)> mutate;
  grpc::StatusCode code;
  std::string message;
};

TEST_F(AgentServiceTest, AFailedDeviceInterruptsItsTrialsAndTheAgentSaysSo) {
  // A step that leaves its GPU lost (simulated: the fake factory's DeviceFailure): the trial is
  // Interrupted (the controller places it again, from its checkpoint), the device reports why,
  // no free memory and hydra_device_failed 1; the agent stays ready while a device works, and
  // once none does it is neither ready nor live and refuses assignments.
  factory_.bind_to_devices = true;
  factory_.tasks.failures_lose_devices = true;
  factory_.step_delay = std::chrono::milliseconds(2);
  factory_.fail_at["first"] = 3;
  factory_.fail_at["second"] = 3;
  StartServer();
  auto stub = Client();
  const auto ended = [&](const std::string& name) {
    return WaitFor(*stub, [&](const v1::GetStatusResponse& r) {
      for (const auto& t : r.trials()) {
        if (t.name() == name) return t.state() == v1::INTERRUPTED;
      }
      return false;
    });
  };
  const auto failed_devices = [&] {
    std::vector<std::string> failed;
    for (const auto& d : service_->Devices()) {
      if (!d.failure().empty()) {
        EXPECT_EQ(d.memory_free_bytes(), 0) << d.name();
        failed.push_back(d.name());
      }
    }
    return failed;
  };
  ASSERT_TRUE(Assign(*stub, Request("first")).ok());
  ASSERT_TRUE(ended("first"));
  const v1::GetStatusResponse status = StatusOf(*stub);
  for (const auto& t : status.trials()) {
    EXPECT_THAT(t.message(), HasSubstr("failed (cudaErrorIllegalAddress")) << t.message();
    EXPECT_THAT(t.message(), HasSubstr("resumes from its last checkpoint"));
  }
  const auto one = failed_devices();
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(service_->NotReadyReason(), "");
  EXPECT_EQ(service_->NotLiveReason(), "");
  service_->Tick();
  EXPECT_THAT(metrics_->Render(),
              HasSubstr("hydra_device_failed{node=\"node-a\",device=\"" + one[0] + "\"} 1"));

  ASSERT_TRUE(Assign(*stub, Request("second")).ok());  // on the device that still works
  ASSERT_TRUE(ended("second"));
  EXPECT_EQ(failed_devices().size(), 2u);
  EXPECT_THAT(service_->NotLiveReason(), HasSubstr("every device failed: cpu:0: "));
  EXPECT_THAT(service_->NotReadyReason(), HasSubstr("every device failed"));
  const grpc::Status refused = Assign(*stub, Request("third"));
  EXPECT_EQ(refused.error_code(), grpc::UNAVAILABLE);
  EXPECT_THAT(refused.error_message(), HasSubstr("restart the agent"));
}

TEST_F(AgentServiceTest, BadRequestsGetTheRightCodeAndChangeNothing) {
  factory_.refuse["refused"] = true;
  StartServer();
  auto stub = Client();
  const std::vector<BadRequest> cases = {
      {"no trial", [](auto* r, auto&) { r->clear_trial(); }, grpc::INVALID_ARGUMENT,
       "trial: required"},
      {"unknown family",
       [](auto* r, auto&) { r->mutable_trial()->mutable_model()->set_family("rnn"); },
       grpc::INVALID_ARGUMENT, "trial.model.family"},
      {"negative steps",
       [](auto* r, auto&) { r->mutable_trial()->mutable_training()->set_steps(-5); },
       grpc::INVALID_ARGUMENT, "trial.training.steps"},
      {"negative device budget",
       [](auto* r, auto&) {
         r->mutable_trial()->mutable_resources()->set_device_memory_budget_bytes(-1);
       },
       grpc::INVALID_ARGUMENT, "trial.resources.deviceMemoryBudget"},
      {"negative host budget",
       [](auto* r, auto&) {
         r->mutable_trial()->mutable_resources()->set_host_memory_budget_bytes(-4096);
       },
       grpc::INVALID_ARGUMENT, "trial.resources.hostMemoryBudget"},
      {"nHead does not divide nEmbd",
       [](auto* r, auto&) { r->mutable_trial()->mutable_model()->set_n_head(3); },
       grpc::INVALID_ARGUMENT, "nHead"},
      {"bad trial name", [](auto* r, auto&) { r->mutable_trial()->set_name("Bad_Name"); },
       grpc::INVALID_ARGUMENT, "trial.name"},
      {"relative dataset path",
       [](auto* r, auto&) { r->mutable_trial()->mutable_dataset()->set_path("data/corpus.txt"); },
       grpc::INVALID_ARGUMENT, "absolute"},
      {"dataset outside the roots by ..",
       [](auto* r, const fs::path& d) {
         r->mutable_trial()->mutable_dataset()->set_path(
             (d / "data/../outside/secret.txt").string());
       },
       grpc::PERMISSION_DENIED, "outside the allowed roots"},
      {"dataset outside the roots by a symlink",
       [](auto* r, const fs::path& d) {
         r->mutable_trial()->mutable_dataset()->set_path((d / "data/escape/secret.txt").string());
       },
       grpc::PERMISSION_DENIED, "outside the allowed roots"},
      {"model init outside the roots by a symlink",
       [](auto* r, const fs::path& d) {
         auto* init = r->mutable_trial()->mutable_model()->mutable_init();
         init->set_format(hydra::wire::v1::INIT_FORMAT_SAFETENSORS);
         init->set_path((d / "data/escape/secret.txt").string());
       },
       grpc::PERMISSION_DENIED, "trial.model.init.path"},
      {"relative model init path",
       [](auto* r, auto&) {
         auto* init = r->mutable_trial()->mutable_model()->mutable_init();
         init->set_format(hydra::wire::v1::INIT_FORMAT_SAFETENSORS);
         init->set_path("gpt2/model.safetensors");
       },
       grpc::INVALID_ARGUMENT, "trial.model.init.path: must be an absolute path"},
      {"checkpoint dir outside the roots",
       [](auto* r, const fs::path& d) {
         r->set_checkpoint_dir((d / "ckpt/x/../../outside").string());
       },
       grpc::PERMISSION_DENIED, "checkpoint_dir"},
      {"checkpoint dir missing", [](auto* r, auto&) { r->clear_checkpoint_dir(); },
       grpc::INVALID_ARGUMENT, "checkpoint_dir: required"},
      {"checkpoint dir is the checkpoint root",
       [](auto* r, const fs::path& d) { r->set_checkpoint_dir((d / "ckpt").string()); },
       grpc::INVALID_ARGUMENT, "is not the directory of trial ns/job-1/good"},
      {"checkpoint dir is the job's directory (every trial's parent)",
       [](auto* r, const fs::path& d) { r->set_checkpoint_dir((d / "ckpt/ns/job-1").string()); },
       grpc::INVALID_ARGUMENT, "is not the directory of trial"},
      {"checkpoint dir of another trial",
       [](auto* r, const fs::path& d) {
         r->set_checkpoint_dir((d / "ckpt/ns/job-1/other").string());
       },
       grpc::INVALID_ARGUMENT, "ckpt/ns/job-1/good"},
      {"checkpoint dir of another namespace",
       [](auto* r, const fs::path& d) {
         r->set_checkpoint_dir((d / "ckpt/a/job-1/good").string());
       },
       grpc::INVALID_ARGUMENT, "is not the directory of trial"},
      {"no namespace", [](auto* r, auto&) { r->mutable_trial()->clear_namespace_(); },
       grpc::INVALID_ARGUMENT, "trial.namespace: required"},
      {"no job uid", [](auto* r, auto&) { r->mutable_trial()->clear_job_uid(); },
       grpc::INVALID_ARGUMENT, "trial.jobUid: required"},
      {"trial name longer than a DNS label",
       [](auto* r, auto&) { r->mutable_trial()->set_name(std::string(64, 'a')); },
       grpc::INVALID_ARGUMENT, "more than a DNS-1123 label's 63"},
      {"dataset is a FIFO",
       [](auto* r, const fs::path& d) {
         r->mutable_trial()->mutable_dataset()->set_path((d / "data/pipe.txt").string());
       },
       grpc::INVALID_ARGUMENT, "not a regular file"},
      {"dataset missing",
       [](auto* r, const fs::path& d) {
         r->mutable_trial()->mutable_dataset()->set_path((d / "data/none.txt").string());
       },
       grpc::NOT_FOUND, "none.txt"},
      {"device budget over the device's memory",
       [](auto* r, auto&) {
         r->mutable_trial()->mutable_resources()->set_device_memory_budget_bytes(int64_t{8} << 30);
       },
       grpc::RESOURCE_EXHAUSTED,
       "8589934592 bytes); the devices of node node-a have 1.00 GiB "
       "(1073741824 bytes)"},
      {"refused by the executor (cannot fit)",
       [](auto* r, const fs::path& d) {
         r->mutable_trial()->set_name("refused");
         r->set_checkpoint_dir((d / "ckpt/ns/job-1/refused").string());
       },
       grpc::RESOURCE_EXHAUSTED, "refused"},
      {"shard plan with a gap",
       [](auto* r, auto&) {
         auto* a = r->mutable_shard_plan()->add_shards();
         a->set_first_layer(0);
         a->set_last_layer(0);
         auto* b = r->mutable_shard_plan()->add_shards();
         b->set_first_layer(2);
         b->set_last_layer(2);
       },
       grpc::INVALID_ARGUMENT, "shard_plan.shards[1]"},
      {"resume from a checkpoint that is not there",
       [](auto* r, auto&) { r->set_resume_from_step(40); }, grpc::FAILED_PRECONDITION,
       "resume_from_step 40"},
  };
  ASSERT_EQ(::mkfifo((dir_ / "data" / "pipe.txt").c_str(), 0600), 0);
  for (const auto& c : cases) {
    auto req = Request("good");
    c.mutate(&req, dir_);
    grpc::Status s = Assign(*stub, req);
    EXPECT_EQ(s.error_code(), c.code) << c.name << ": " << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr(c.message)) << c.name;
    EXPECT_EQ(StatusOf(*stub).trials_size(), 0) << c.name << " changed the agent's state";
    EXPECT_TRUE(fs::is_empty(dir_ / "ckpt")) << c.name << " wrote under the checkpoint root";
  }
  EXPECT_EQ(Cancel(*stub, Ref("nobody"), false).error_code(), grpc::NOT_FOUND);
  for (auto clear : std::vector<std::function<void(v1::TrialRef*)>>{
           [](v1::TrialRef* r) { r->clear_name(); }, [](v1::TrialRef* r) { r->clear_job(); },
           [](v1::TrialRef* r) { r->clear_namespace_(); },
           [](v1::TrialRef* r) { r->clear_job_uid(); }}) {
    v1::TrialRef ref = Ref("nobody");
    clear(&ref);
    EXPECT_EQ(Cancel(*stub, ref, true).error_code(), grpc::INVALID_ARGUMENT) << ref.DebugString();
  }
  // Still serving.
  EXPECT_TRUE(Assign(*stub, Request("good")).ok());
}

TEST_F(AgentServiceTest, DuplicateAndForeignCheckpointDirectoriesAreRefused) {
  factory_.step_delay = std::chrono::milliseconds(10);
  StartServer();
  auto stub = Client();
  ASSERT_TRUE(Assign(*stub, Request("t1", 1000)).ok());
  EXPECT_EQ(Assign(*stub, Request("t1", 1000)).error_code(), grpc::ALREADY_EXISTS);
  auto other = Request("t2", 1000);
  other.set_checkpoint_dir(TrialDir("t1").string());
  grpc::Status s = Assign(*stub, other);
  EXPECT_EQ(s.error_code(), grpc::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("is not the directory of trial ns/job-1/t2"));
  // A directory below the trial's own is its own, but not while the trial runs in its parent.
  auto nested = Request("t1", 1000);
  nested.set_checkpoint_dir((TrialDir("t1") / "deeper").string());
  EXPECT_EQ(Assign(*stub, nested).error_code(), grpc::ALREADY_EXISTS);
  EXPECT_EQ(StatusOf(*stub).trials_size(), 1);
}

TEST_F(AgentServiceTest, TheSameTrialNameInTwoNamespacesAreTwoTrials) {
  factory_.step_delay = std::chrono::milliseconds(5);
  StartServer();
  auto stub = Client();
  ASSERT_TRUE(Assign(*stub, Request("t1", 100000, "team-a")).ok());
  // Team b's trial of the same name (and job name) is another trial, not ALREADY_EXISTS.
  ASSERT_TRUE(Assign(*stub, Request("t1", 100000, "team-b")).ok());
  ASSERT_TRUE(WaitFor(*stub, [](const v1::GetStatusResponse& s) {
    int stepped = 0;
    for (const auto& t : s.trials()) stepped += t.step() >= 4 && t.last_checkpoint_step() >= 4;
    return stepped == 2;
  }));
  // Team b cancels its t1 and deletes its checkpoints; a cancel naming team a's job uid wrongly
  // touches nothing.
  EXPECT_EQ(Cancel(*stub, Ref("t1", "team-a", "uid-2"), true).error_code(), grpc::NOT_FOUND);
  v1::CancelTrialResponse resp;
  ASSERT_TRUE(Cancel(*stub, Ref("t1", "team-b"), true, &resp).ok());
  EXPECT_EQ(resp.trial().state(), v1::CANCELLED);
  EXPECT_EQ(resp.trial().namespace_(), "team-b");
  EXPECT_FALSE(fs::exists(TrialDir("t1", "team-b")));
  auto status = StatusOf(*stub);
  ASSERT_EQ(status.trials_size(), 2);
  for (const auto& t : status.trials()) {
    EXPECT_EQ(t.state(), t.namespace_() == "team-a" ? v1::RUNNING : v1::CANCELLED)
        << t.namespace_();
  }
  EXPECT_FALSE(executor::CheckpointStore(TrialDir("t1", "team-a").string()).Steps()->empty())
      << "team a's checkpoints are intact";
  EXPECT_TRUE(fs::exists(TrialDir("t1", "team-a") / "ATTEMPT") ||
              fs::exists(TrialDir("t1", "team-a")));
}

TEST_F(AgentServiceTest, DeletingAnEndedTrialsFilesSparesThoseALaterOwnerHolds) {
  factory_.step_delay = std::chrono::milliseconds(5);
  StartServer();
  auto stub = Client();
  // Job uid-1's trial is cancelled; the job is created again (uid-2) under the same name and
  // its trial takes the same directory (<root>/<namespace>/<job>/<trial>).
  auto first = Request("t", 100000);
  first.set_attempt(1);
  ASSERT_TRUE(Assign(*stub, first).ok());
  ASSERT_TRUE(Cancel(*stub, Ref("t"), false).ok());
  auto second = Request("t", 100000);
  second.mutable_trial()->set_job_uid("uid-2");
  second.set_attempt(1);
  ASSERT_TRUE(Assign(*stub, second).ok());
  auto second_checkpointed = [](const v1::GetStatusResponse& s) {
    for (const auto& t : s.trials()) {
      if (t.job_uid() == "uid-2" && t.last_checkpoint_step() >= 8) return true;
    }
    return false;
  };
  ASSERT_TRUE(WaitFor(*stub, second_checkpointed));
  // A late delete of uid-1's files (an old leader's pass, say) is refused: they are uid-2's
  // now. It once removed them, and uid-2's fence then stopped it ("... is gone").
  grpc::Status late = Cancel(*stub, Ref("t"), true);
  EXPECT_EQ(late.error_code(), grpc::FAILED_PRECONDITION) << late.error_message();
  EXPECT_THAT(late.error_message(), HasSubstr("assigned later"));
  EXPECT_TRUE(fs::exists(TrialDir("t") / "ATTEMPT"));
  EXPECT_FALSE(executor::CheckpointStore(TrialDir("t").string()).Steps()->empty());
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const auto status = StatusOf(*stub);
  for (const auto& t : status.trials()) {
    if (t.job_uid() == "uid-2") {
      EXPECT_EQ(t.state(), v1::RUNNING) << t.message();
    }
  }
  // uid-2's own delete, once it ends, removes them.
  ASSERT_TRUE(Cancel(*stub, Ref("t", "ns", "uid-2"), false).ok());
  EXPECT_TRUE(Cancel(*stub, Ref("t", "ns", "uid-2"), true).ok());
  EXPECT_TRUE(executor::CheckpointStore(TrialDir("t").string()).Steps()->empty());
}

TEST_F(AgentServiceTest, ASlowWatcherGetsTheEndOfEachTrialOfOneNameInTwoNamespaces) {
  // A watcher that reads slowly gets the latest event of each trial, coalesced. Two trials of
  // one name in two namespaces are two trials: each one's end reaches it. Events were once
  // coalesced by the trial's name alone, and one's SUCCEEDED was replaced by the other's
  // later step.
  StartServer();
  auto stub = Client();
  // On a channel of its own with a small receive window, so that unread events soon wait in
  // the agent's queue (gRPC's window would otherwise grow to take many of them).
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 1024);
  auto watch_channel = grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(port_),
                                                 grpc::InsecureChannelCredentials(), args);
  auto watcher = v1::AgentService::NewStub(watch_channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  auto reader = watcher->WatchProgress(&ctx, {});
  auto fast = [&](const std::string& ns, int64_t steps) {
    auto req = Request("t", steps, ns);
    req.mutable_trial()->mutable_training()->set_checkpoint_every_steps(0);
    req.mutable_trial()->mutable_training()->set_eval_every_steps(0);
    return req;
  };
  // Team b's trial steps fast while nobody reads: the stream's window fills and events wait.
  ASSERT_TRUE(Assign(*stub, fast("team-b", 20000)).ok());
  ASSERT_TRUE(WaitFor(*stub, [](const v1::GetStatusResponse& s) {
    return s.trials_size() == 1 && s.trials(0).step() >= 2000;
  }));
  ASSERT_TRUE(Assign(*stub, fast("team-a", 5)).ok());
  ASSERT_TRUE(WaitFor(
      *stub,
      [](const v1::GetStatusResponse& s) {
        int ended = 0;
        for (const auto& t : s.trials()) ended += t.state() == v1::SUCCEEDED;
        return ended == 2;
      },
      60));
  std::map<std::string, v1::TrialState> last;  // by namespace
  v1::TrialEvent e;
  while (reader->Read(&e)) {
    last[e.trial().namespace_()] = e.trial().state();
    if (last["team-a"] == v1::SUCCEEDED && last["team-b"] == v1::SUCCEEDED) break;
  }
  ctx.TryCancel();
  EXPECT_EQ(last["team-a"], v1::SUCCEEDED);
  EXPECT_EQ(last["team-b"], v1::SUCCEEDED);
}

TEST_F(AgentServiceTest, AnAgentDedicatedToAJobRefusesEveryOtherJobsTrials) {
  factory_.step_delay = std::chrono::milliseconds(5);
  StartServer(nullptr, "", DedicatedJob{"team-a", "job-1", "uid-1"});
  auto stub = Client();
  EXPECT_EQ(StatusOf(*stub).dedicated_job().uid(), "uid-1");
  ASSERT_TRUE(Assign(*stub, Request("t1", 100000, "team-a")).ok());
  // Another namespace's job of the same name and uid-looking identity: refused, nothing kept.
  const grpc::Status other = Assign(*stub, Request("t1", 100000, "team-b"));
  EXPECT_EQ(other.error_code(), grpc::PERMISSION_DENIED);
  EXPECT_NE(other.error_message().find("serves only MultiModelJob team-a/job-1 (uid uid-1)"),
            std::string::npos)
      << other.error_message();
  EXPECT_FALSE(fs::exists(TrialDir("t1", "team-b")));
  // Nor can another job cancel or limit this job's trial through it.
  EXPECT_EQ(Cancel(*stub, Ref("t1", "team-b"), true).error_code(), grpc::PERMISSION_DENIED);
  grpc::ClientContext ctx;
  v1::LimitTrialRequest limit;
  *limit.mutable_trial() = Ref("t1", "team-a", "uid-2");
  limit.set_stop(true);
  v1::LimitTrialResponse resp;
  EXPECT_EQ(stub->LimitTrial(&ctx, limit, &resp).error_code(), grpc::PERMISSION_DENIED);
  const auto status = StatusOf(*stub);
  ASSERT_EQ(status.trials_size(), 1);
  EXPECT_EQ(status.trials(0).namespace_(), "team-a");
  EXPECT_NE(status.trials(0).state(), v1::CANCELLED);
}

TEST_F(AgentServiceTest, PlantedSymlinksAreNeverWrittenThrough) {
  StartServer();
  auto stub = Client();
  // Someone with write access to the shared storage plants symlinks where the trial's
  // checkpoint and temporary files will go, pointing at a file they want overwritten.
  const fs::path victim = dir_ / "outside" / "victim.txt";
  std::ofstream(victim) << "precious";
  fs::create_directories(TrialDir("trap"));
  for (const char* name : {"ckpt-0000000004.hck", "ckpt-0000000004.hck.tmp",
                           "ckpt-0000000008.hck.tmp", "ATTEMPT.tmp"}) {
    fs::create_symlink(victim, TrialDir("trap") / name);
  }
  auto req = Request("trap", 8);
  req.set_attempt(1);
  ASSERT_TRUE(Assign(*stub, req).ok());
  ASSERT_TRUE(WaitFor(*stub, [](const v1::GetStatusResponse& s) {
    return s.trials_size() == 1 && s.trials(0).state() != v1::PENDING &&
           s.trials(0).state() != v1::RUNNING;
  }));
  EXPECT_EQ(fakes::Slurp(victim.string()), "precious");
  auto t = StatusOf(*stub).trials(0);
  // Either the trial went on (the links were replaced, not followed) or it stopped with an
  // error naming the file; it never wrote through.
  if (t.state() != v1::SUCCEEDED) {
    EXPECT_THAT(t.message(), HasSubstr(TrialDir("trap").string()));
  }
}

TEST_F(AgentServiceTest, AMillionStepsKeepTheCheckpointTheSameSize) {
  StartServer();
  auto stub = Client();
  auto req = Request("long-run", 1000000);
  req.mutable_trial()->mutable_training()->set_checkpoint_every_steps(200000);
  req.mutable_trial()->mutable_training()->set_eval_every_steps(1000);
  ASSERT_TRUE(Assign(*stub, req).ok());
  // A bound against a hang, not a speed check: under ASan on a loaded 2-core machine the
  // million steps take minutes.
  ASSERT_TRUE(WaitFor(
      *stub,
      [](const v1::GetStatusResponse& s) {
        return s.trials_size() == 1 &&
               IsFinalTrialState(wire::TrialStateFromProto(s.trials(0).state()));
      },
      600));
  ASSERT_EQ(StatusOf(*stub).trials(0).state(), v1::SUCCEEDED)
      << StatusOf(*stub).trials(0).message();
  const auto dir = TrialDir("long-run");
  const auto size = [&](int64_t step) {
    char name[32];
    std::snprintf(name, sizeof(name), "ckpt-%010lld.hck", static_cast<long long>(step));
    return static_cast<int64_t>(fs::file_size(dir / name));
  };
  // The store keeps the two newest: steps 800000 and 1000000. The curves inside are bounded,
  // so the later checkpoint is no larger but for a few more digits per step number.
  const int64_t at_800k = size(800000), at_1m = size(1000000);
  EXPECT_LE(at_1m, at_800k + 4096) << at_800k << " -> " << at_1m;
  EXPECT_LT(at_1m, 200 * 1024) << "curves of a million points would be megabytes";
}

TEST_F(AgentServiceTest, WatchStreamsSnapshotThenStepsAndStatesInOrder) {
  factory_.step_delay = std::chrono::milliseconds(2);
  StartServer();
  auto stub = Client();
  ASSERT_TRUE(Assign(*stub, Request("first", 6)).ok());
  grpc::ClientContext ctx;
  v1::WatchProgressRequest watch;
  auto reader = stub->WatchProgress(&ctx, watch);
  ASSERT_TRUE(Assign(*stub, Request("second", 15)).ok());
  std::map<std::string, int64_t> last_step;
  std::map<std::string, std::string> last_state;
  bool saw_snapshot = false;
  v1::TrialEvent e;
  while (reader->Read(&e)) {
    const auto& t = e.trial();
    saw_snapshot = saw_snapshot || (e.kind() == v1::TrialEvent::SNAPSHOT && t.name() == "first");
    EXPECT_GE(t.step(), last_step[t.name()]) << t.name() << " went backwards";
    last_step[t.name()] = t.step();
    last_state[t.name()] = wire::TrialStateFromProto(t.state());
    if (last_state["first"] == kTrialSucceeded && last_state["second"] == kTrialSucceeded) break;
  }
  ctx.TryCancel();
  EXPECT_TRUE(saw_snapshot);
  EXPECT_EQ(last_step["second"], 15);
  EXPECT_EQ(last_state["second"], kTrialSucceeded);
}

TEST_F(AgentServiceTest, ClientsThatVanishMidStreamDoNotHurtTheAgent) {
  factory_.step_delay = std::chrono::milliseconds(5);
  StartServer();
  auto stub = Client();
  ASSERT_TRUE(Assign(*stub, Request("long", 400)).ok());
  for (int i = 0; i < 10; ++i) {
    // A client on its own channel that reads one event and disappears without a goodbye.
    auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(port_),
                                       grpc::InsecureChannelCredentials());
    auto gone = v1::AgentService::NewStub(channel);
    auto ctx = std::make_unique<grpc::ClientContext>();
    auto reader = gone->WatchProgress(ctx.get(), {});
    v1::TrialEvent e;
    ASSERT_TRUE(reader->Read(&e));
    if (i % 2) ctx->TryCancel();
    reader.reset();
    ctx.reset();
    gone.reset();
  }
  // The agent keeps serving: status, new watches and new trials.
  EXPECT_EQ(StatusOf(*stub).trials_size(), 1);
  grpc::ClientContext ctx;
  auto reader = stub->WatchProgress(&ctx, {});
  v1::TrialEvent e;
  ASSERT_TRUE(reader->Read(&e));
  EXPECT_EQ(e.trial().name(), "long");
  ctx.TryCancel();
  ASSERT_TRUE(Assign(*stub, Request("after", 3)).ok());
}

TEST_F(AgentServiceTest, CancelAndDrain) {
  factory_.step_delay = std::chrono::milliseconds(5);
  StartServer();
  auto stub = Client();
  ASSERT_TRUE(Assign(*stub, Request("c1", 1000)).ok());
  ASSERT_TRUE(Assign(*stub, Request("c2", 1000)).ok());
  ASSERT_TRUE(WaitFor(*stub, [](const v1::GetStatusResponse& s) {
    for (const auto& t : s.trials()) {
      if (t.step() < 5) return false;
    }
    return true;
  }));
  v1::CancelTrialResponse cancelled;
  ASSERT_TRUE(Cancel(*stub, Ref("c1"), false, &cancelled).ok());
  EXPECT_EQ(cancelled.trial().state(), v1::CANCELLED);
  EXPECT_EQ(service_->NotReadyReason(), "");

  grpc::ClientContext dctx;
  v1::DrainResponse drained;
  ASSERT_TRUE(stub->Drain(&dctx, {}, &drained).ok());
  ASSERT_EQ(drained.trials_size(), 2);
  for (const auto& t : drained.trials()) {
    if (t.name() == "c2") {
      EXPECT_EQ(t.state(), v1::INTERRUPTED);
      EXPECT_EQ(t.last_checkpoint_step(), t.step());
      EXPECT_TRUE(fs::exists(TrialDir("c2")));
    }
  }
  EXPECT_THAT(service_->NotReadyReason(), HasSubstr("draining"));
  EXPECT_EQ(Assign(*stub, Request("late")).error_code(), grpc::UNAVAILABLE);
}

TEST_F(AgentServiceTest, StepLimitsHoldATrialAtItsRungAndLimitTrialRaisesOrStopsIt) {
  StartServer();
  auto stub = Client();
  auto limit = [&](const v1::TrialRef& ref, int64_t step, bool stop,
                   v1::LimitTrialResponse* resp = nullptr) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::LimitTrialRequest req;
    *req.mutable_trial() = ref;
    req.set_step_limit(step);
    req.set_stop(stop);
    req.set_reason("asha: not in the top 1/3 of its rung");
    v1::LimitTrialResponse ignored;
    return stub->LimitTrial(&ctx, req, resp ? resp : &ignored);
  };
  auto bad = Request("a1", 60);
  bad.set_step_limit(-1);
  EXPECT_EQ(Assign(*stub, bad).error_code(), grpc::INVALID_ARGUMENT);
  for (const char* name : {"a1", "a2"}) {
    auto req = Request(name, 60);
    req.set_step_limit(8);  // evaluates there (eval_every_steps is 5) and waits
    ASSERT_TRUE(Assign(*stub, req).ok()) << name;
  }
  auto at = [&](const std::string& name, int64_t step, v1::TrialState state) {
    return WaitFor(*stub, [&](const v1::GetStatusResponse& s) {
      for (const auto& t : s.trials()) {
        if (t.name() == name) return t.step() == step && t.state() == state;
      }
      return false;
    });
  };
  ASSERT_TRUE(at("a1", 8, v1::RUNNING));
  ASSERT_TRUE(at("a2", 8, v1::RUNNING));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const auto waiting = StatusOf(*stub);
  for (const auto& t : waiting.trials()) {
    EXPECT_EQ(t.step(), 8) << t.name() << " trained past its limit";
    EXPECT_EQ(t.step_limit(), 8);
    ASSERT_GE(t.evaluations_size(), 2);  // steps 5 and 8 (the limit)
    EXPECT_EQ(t.evaluations(t.evaluations_size() - 1).step(), 8);
  }
  // Only the exact identity; a negative limit is refused.
  EXPECT_EQ(limit(Ref("a1", "ns", "uid-2"), 20, false).error_code(), grpc::NOT_FOUND);
  EXPECT_EQ(limit(Ref("a1", "other"), 0, true).error_code(), grpc::NOT_FOUND);
  auto no_name = Ref("a1");
  no_name.clear_job_uid();
  EXPECT_EQ(limit(no_name, 20, false).error_code(), grpc::INVALID_ARGUMENT);
  EXPECT_EQ(limit(Ref("a1"), -3, false).error_code(), grpc::INVALID_ARGUMENT);
  // a1 goes on to 20; a2 stops early, keeping its checkpoints.
  ASSERT_TRUE(limit(Ref("a1"), 20, false).ok());
  ASSERT_TRUE(limit(Ref("a2"), 0, true).ok());
  ASSERT_TRUE(at("a1", 20, v1::RUNNING));
  ASSERT_TRUE(at("a2", 8, v1::EARLY_STOPPED));
  const auto stopped = StatusOf(*stub);
  for (const auto& t : stopped.trials()) {
    if (t.name() != "a2") continue;
    EXPECT_THAT(t.message(), HasSubstr("asha"));
    EXPECT_EQ(t.last_checkpoint_step(), 8);
  }
  EXPECT_FALSE(executor::CheckpointStore(TrialDir("a2").string()).Steps()->empty());
  EXPECT_EQ(limit(Ref("a2"), 30, false).error_code(), grpc::FAILED_PRECONDITION);
  // 0 lifts the limit: a1 trains to the end.
  ASSERT_TRUE(limit(Ref("a1"), 0, false).ok());
  ASSERT_TRUE(at("a1", 60, v1::SUCCEEDED));
}

TEST_F(AgentServiceTest, CancelWithCheckpointSuspendsATrialWhereItIs) {
  factory_.step_delay = std::chrono::milliseconds(5);
  StartServer();
  auto stub = Client();
  ASSERT_TRUE(Assign(*stub, Request("s1", 100000)).ok());
  ASSERT_TRUE(WaitFor(*stub, [](const v1::GetStatusResponse& s) {
    return s.trials_size() == 1 && s.trials(0).step() >= 3;
  }));
  auto suspend = [&](const v1::TrialRef& ref, bool delete_files) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::CancelTrialRequest req;
    *req.mutable_trial() = ref;
    req.set_checkpoint(true);
    req.set_delete_checkpoints(delete_files);
    v1::CancelTrialResponse resp;
    return stub->CancelTrial(&ctx, req, &resp);
  };
  EXPECT_EQ(suspend(Ref("s1"), true).error_code(), grpc::INVALID_ARGUMENT);
  EXPECT_EQ(suspend(Ref("s1", "other"), false).error_code(), grpc::NOT_FOUND);
  ASSERT_TRUE(suspend(Ref("s1"), false).ok());
  ASSERT_TRUE(WaitFor(*stub, [](const v1::GetStatusResponse& s) {
    return s.trials(0).state() == v1::INTERRUPTED;
  }));
  const auto status = StatusOf(*stub);
  const auto& t = status.trials(0);
  EXPECT_TRUE(IsSuspendedMessage(t.message())) << t.message();
  EXPECT_EQ(t.last_checkpoint_step(), t.step());
  EXPECT_EQ(executor::CheckpointStore(TrialDir("s1").string()).Steps()->back(), t.step());
  // Assigned again, it resumes there.
  ASSERT_TRUE(Assign(*stub, Request("s1", 100000)).ok());
  ASSERT_TRUE(WaitFor(*stub, [&](const v1::GetStatusResponse& s) {
    return s.trials_size() == 1 && s.trials(0).state() == v1::RUNNING &&
           s.trials(0).resumed_from_step() == t.step() && s.trials(0).step() > t.step();
  }));
}

TEST_F(AgentServiceTest, MutualTlsRefusesCallersWithoutTheControllersCertificate) {
  const fs::path certs = dir_ / "certs";
  ASSERT_TRUE(fakes::MakeTestCertificates(certs)) << "openssl failed";
  auto p = [&](const char* f) { return (certs / f).string(); };
  auto server_creds = MakeServerCredentials({p("server.pem"), p("server.key"), p("ca.pem")});
  ASSERT_TRUE(server_creds.ok()) << server_creds.status();
  StartServer(*server_creds, "hydra-controller");
  auto call = [&](std::shared_ptr<grpc::ChannelCredentials> creds) {
    auto stub = Client(creds);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::GetStatusResponse resp;
    return stub->GetStatus(&ctx, {}, &resp);
  };
  auto creds = [&](const std::string& cert) {
    auto c = MakeChannelCredentials(p("ca.pem"), cert.empty() ? "" : p((cert + ".pem").c_str()),
                                    cert.empty() ? "" : p((cert + ".key").c_str()));
    EXPECT_TRUE(c.ok()) << c.status();
    return *c;
  };
  EXPECT_TRUE(call(creds("controller")).ok());
  EXPECT_EQ(call(creds("")).error_code(), grpc::UNAVAILABLE) << "no client certificate";
  EXPECT_EQ(call(creds("rogue")).error_code(), grpc::UNAVAILABLE) << "signed by another CA";
  grpc::Status intruder = call(creds("intruder"));
  EXPECT_EQ(intruder.error_code(), grpc::PERMISSION_DENIED);
  EXPECT_THAT(intruder.error_message(), HasSubstr("hydra-controller"));
  EXPECT_EQ(call(grpc::InsecureChannelCredentials()).error_code(), grpc::UNAVAILABLE)
      << "plaintext";
  // The intruder cannot assign either, and nothing changed.
  auto stub = Client(creds("intruder"));
  EXPECT_EQ(Assign(*stub, Request("sneaky")).error_code(), grpc::PERMISSION_DENIED);
  EXPECT_EQ(StatusOf(*Client(creds("controller"))).trials_size(), 0);
}

TEST(TlsFilesTest, MissingOrBrokenFilesAreNamed) {
  auto missing = MakeServerCredentials({"/nonexistent/server.pem", "/nonexistent/key", ""});
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(), HasSubstr("--tls-cert-file"));
  auto no_key = MakeServerCredentials({"/x.pem", "", ""});
  EXPECT_EQ(no_key.status().code(), StatusCode::kInvalidArgument);
  auto ca_only = MakeServerCredentials({"", "", "/ca.pem"});
  EXPECT_EQ(ca_only.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(MakeServerCredentials({"", "", ""}).ok());
}

}  // namespace
}  // namespace hydra::agent

namespace hydra::agent {
namespace {

TEST_F(AgentServiceTest, FencingStopsTheOlderHolderAndRefusesOlderAssignments) {
  factory_.step_delay = std::chrono::milliseconds(5);
  StartServer();
  auto stub = Client();
  auto first = Request("moving", 100000);
  first.set_attempt(1);
  ASSERT_TRUE(Assign(*stub, first).ok());
  ASSERT_TRUE(WaitFor(*stub, [](const v1::GetStatusResponse& s) {
    return s.trials_size() == 1 && s.trials(0).step() >= 3;
  }));
  EXPECT_EQ(StatusOf(*stub).trials(0).attempt(), 1);
  // Another agent takes the trial over (attempt 2 in the same shared checkpoint directory):
  // this one stops before its next step and never writes another checkpoint.
  // Written as the agents write it: a complete file renamed into place.
  std::ofstream(TrialDir("moving") / "ATTEMPT.tmp") << "2\n";
  fs::rename(TrialDir("moving") / "ATTEMPT.tmp", TrialDir("moving") / "ATTEMPT");
  ASSERT_TRUE(WaitFor(
      *stub, [](const v1::GetStatusResponse& s) { return s.trials(0).state() == v1::CANCELLED; }));
  EXPECT_THAT(StatusOf(*stub).trials(0).message(), HasSubstr("superseded: attempt 2"));
  // An assignment older than the recorded attempt is refused, and changes nothing.
  auto stale = Request("moving", 100000);
  stale.set_attempt(1);
  grpc::Status s = Assign(*stub, stale);
  EXPECT_EQ(s.error_code(), grpc::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("stale assignment"));
  EXPECT_EQ(StatusOf(*stub).trials(0).state(), v1::CANCELLED);
  // The current attempt may come here.
  auto current = Request("moving", 100000);
  current.set_attempt(2);
  EXPECT_TRUE(Assign(*stub, current).ok());
  EXPECT_EQ(fakes::Slurp((TrialDir("moving") / "ATTEMPT").string()), "2\n");
}

TEST_F(AgentServiceTest, ANewerAttemptOfATrialStillHereStopsTheOldCopyFirst) {
  // The controller lost this node (a network cut), moved the trial away and, later, back here
  // while the old copy still runs: ALREADY_EXISTS would make it believe the new attempt runs.
  factory_.step_delay = std::chrono::milliseconds(5);
  StartServer();
  auto stub = Client();
  auto first = Request("returning", 100000);
  first.set_attempt(1);
  ASSERT_TRUE(Assign(*stub, first).ok());
  ASSERT_TRUE(WaitFor(*stub, [](const v1::GetStatusResponse& s) {
    return s.trials_size() == 1 && s.trials(0).step() >= 3;
  }));
  auto again = Request("returning", 100000);
  again.set_attempt(3);
  grpc::Status s = Assign(*stub, again);
  EXPECT_EQ(s.error_code(), grpc::UNAVAILABLE);
  EXPECT_THAT(s.error_message(), HasSubstr("attempt 1 is still stopping"));
  ASSERT_TRUE(WaitFor(
      *stub, [](const v1::GetStatusResponse& s) { return s.trials(0).state() == v1::CANCELLED; }));
  // The retry lands, and what runs is the new attempt.
  ASSERT_TRUE(Assign(*stub, again).ok());
  ASSERT_TRUE(WaitFor(*stub, [](const v1::GetStatusResponse& s) {
    return s.trials_size() == 1 && s.trials(0).attempt() == 3 && s.trials(0).state() == v1::RUNNING;
  }));
  // The same attempt again is the idempotent retry of a lost answer.
  EXPECT_EQ(Assign(*stub, again).error_code(), grpc::ALREADY_EXISTS);
}

}  // namespace
}  // namespace hydra::agent
