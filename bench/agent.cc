// bench/agent: what hydra-agent's observability costs with 100 trials.
//  1. A Prometheus scrape: the /metrics body of an agent holding 100 trials (render time, bytes,
//     and a real HTTP GET on loopback through the agent's HTTP server).
//  2. The progress stream: 100 trials stepping on 2 devices (a fake executor whose steps
//     sleep --step-ms, so the devices' time is known) with 0, 1 and 10 WatchProgress clients
//     over real gRPC on loopback, side by side in one run: wall time, the process's CPU time,
//     events delivered, and the ratios against no watcher.
#define _TURN_OFF_PLATFORM_STRING
#include <cpprest/http_client.h>
#include <grpcpp/grpcpp.h>
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "agent/metrics/agent_metrics.h"
#include "agent/rpc/agent_service.h"
#include "common/http/http_server.h"
#include "proto/trial_proto.h"
#include "tests/fakes/fake_executor.h"
#include "tests/fakes/subprocess.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
namespace v1 = ::hydra::agent::v1;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

struct StreamRun {
  int watchers = 0;
  double wall = 0, cpu = 0;
  int64_t steps = 0, events = 0;
};

StreamRun RunStream(const fs::path& dir, int trials, int64_t steps, int step_ms, int watchers) {
  fs::remove_all(dir / "ckpt");
  fs::create_directories(dir / "ckpt");
  hydra::fakes::FakeExecutorFactory factory;
  factory.step_delay = std::chrono::milliseconds(step_ms);
  hydra::agent::AgentConfig config;
  config.node_name = "bench";
  config.devices = {hydra::CpuDevice(0, int64_t{1} << 30), hydra::CpuDevice(1, int64_t{1} << 30)};
  config.data_roots = {fs::canonical(dir).string()};
  config.checkpoint_roots = {fs::canonical(dir / "ckpt").string()};
  hydra::agent::AgentMetrics metrics("bench", "bench");
  hydra::agent::AgentService service(config, &factory, &metrics);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  auto server = builder.BuildAndStart();
  auto channel =
      grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials());
  auto stub = v1::AgentService::NewStub(channel);

  std::atomic<int64_t> events{0};
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::thread> readers;
  std::atomic<int> connected{0};
  for (int w = 0; w < watchers; ++w) {
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    grpc::ClientContext* ctx = contexts.back().get();
    readers.emplace_back([&, ctx] {
      auto s = v1::AgentService::NewStub(channel);
      auto reader = s->WatchProgress(ctx, {});
      ++connected;
      v1::TrialEvent e;
      while (reader->Read(&e)) ++events;
    });
  }
  while (connected < watchers) std::this_thread::sleep_for(std::chrono::milliseconds(1));

  StreamRun run;
  run.watchers = watchers;
  const double cpu0 = CpuSeconds();
  const auto t0 = Clock::now();
  for (int i = 0; i < trials; ++i) {
    hydra::Trial t;
    t.name = "trial-" + std::to_string(i);
    t.namespace_ = "bench";
    t.job = "bench";
    t.job_uid = "bench-uid";
    t.model = {hydra::ModelFamily::kGpt2, 1, 8, 2, 8, 256};
    t.training.steps = steps;
    t.training.batch_size = 2;
    t.training.eval_every_steps = 10;
    t.training.checkpoint_every_steps = 0;
    t.dataset.path = t.dataset.resolved_path = (dir / "corpus.txt").string();
    v1::AssignTrialRequest req;
    hydra::wire::TrialToProto(t, req.mutable_trial());
    req.set_checkpoint_dir((dir / "ckpt" / "bench" / "bench" / t.name).string());
    grpc::ClientContext ctx;
    v1::AssignTrialResponse resp;
    grpc::Status s = stub->AssignTrial(&ctx, req, &resp);
    if (!s.ok()) {
      std::fprintf(stderr, "assign failed: %s\n", s.error_message().c_str());
      std::exit(1);
    }
  }
  // Until every trial succeeded.
  while (true) {
    grpc::ClientContext ctx;
    v1::GetStatusResponse st;
    stub->GetStatus(&ctx, {}, &st);
    int done = 0;
    for (const auto& t : st.trials()) done += t.state() == v1::SUCCEEDED;
    if (done == trials) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  run.wall = Seconds(Clock::now() - t0);
  // Let the streams drain their last events before counting.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  run.cpu = CpuSeconds() - cpu0;
  run.steps = static_cast<int64_t>(trials) * steps;
  run.events = events.load();
  for (auto& c : contexts) c->TryCancel();
  for (auto& r : readers) r.join();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  return run;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Cost of hydra-agent's metrics scrape and progress stream with many trials"};
  int trials = 100, step_ms = 2, scrapes = 200;
  int64_t steps = 40;
  bool smoke = false;
  app.add_option("--trials", trials)->capture_default_str();
  app.add_option("--steps", steps, "optimizer steps per trial")->capture_default_str();
  app.add_option("--step-ms", step_ms, "duration of one fake step")->capture_default_str();
  app.add_option("--scrapes", scrapes)->capture_default_str();
  app.add_flag("--smoke", smoke, "tiny sizes, to check that it runs");
  CLI11_PARSE(app, argc, argv);
  if (smoke) {
    trials = 10;
    steps = 5;
    scrapes = 5;
  }
  const fs::path dir =
      fs::temp_directory_path() / ("hydra_bench_agent_" + std::to_string(getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "corpus.txt") << std::string(4000, 'a');

  // 1. Scrape.
  hydra::agent::AgentMetrics metrics("bench-node", "0.1.0");
  metrics.SetInfo({"bench-node:9443", "", "auto"});
  for (int d = 0; d < 4; ++d) {
    metrics.SetDevice(hydra::CpuDevice(d, int64_t{16} << 30), int64_t{16} << 30, int64_t{8} << 30,
                      int64_t{8} << 30, 0.97);
  }
  for (int i = 0; i < trials; ++i) {
    hydra::Trial t;
    t.namespace_ = "default";
    t.job = "sweep";
    t.job_uid = "0b9f2c1e-5d3a-4f6e-9a7b-1c2d3e4f5a6b";
    t.name = "sweep-trial-" + std::to_string(i);
    metrics.SetTrialProgress(t, 1234 + i, 3.2, 3.4, 15000.0 + i);
  }
  metrics.AddSpillBytes("disk", "read", 1 << 30);
  metrics.AddSpillBytes("disk", "write", 1 << 30);
  for (const char* phase : {"forward", "backward", "optimizer", "evaluate"}) {
    metrics.AddShardTasks(phase, 100000);
  }
  for (int i = 0; i < 50; ++i) metrics.ObserveCheckpoint(0.1 * i);
  std::string body;
  auto t0 = Clock::now();
  for (int i = 0; i < scrapes; ++i) body = metrics.Render();
  const double render_ms = 1e3 * Seconds(Clock::now() - t0) / scrapes;
  hydra::http::HttpServer http(
      {{"/metrics", [&] {
          return hydra::http::HttpReply{200, "text/plain", metrics.Render()};
        }}});
  const int port = hydra::fakes::FreePort();
  if (auto s = http.Serve("127.0.0.1:" + std::to_string(port)); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.message().c_str());
    return 1;
  }
  web::http::client::http_client client("http://127.0.0.1:" + std::to_string(port));
  size_t got = 0;
  t0 = Clock::now();
  for (int i = 0; i < scrapes; ++i) {
    got = client.request(web::http::methods::GET, "/metrics")
              .get()
              .extract_utf8string(true)
              .get()
              .size();
  }
  const double get_ms = 1e3 * Seconds(Clock::now() - t0) / scrapes;
  http.Stop();
  std::printf(
      "scrape with %d trials: %zu series lines, %.1f KiB; render %.3f ms; HTTP GET %.3f ms "
      "(mean of %d)\n",
      trials, static_cast<size_t>(std::count(body.begin(), body.end(), '\n')),
      static_cast<double>(got) / 1024.0, render_ms, get_ms, scrapes);

  // 2. Progress stream.
  std::printf("\nprogress stream: %d trials x %lld steps of %d ms on 2 devices\n", trials,
              static_cast<long long>(steps), step_ms);
  std::printf("%-9s %9s %9s %10s %12s %14s %12s\n", "watchers", "wall s", "cpu s", "events",
              "events/s", "cpu us/event", "wall ratio");
  StreamRun base;
  for (int watchers : {0, 1, 10}) {
    StreamRun r = RunStream(dir, trials, steps, step_ms, watchers);
    if (watchers == 0) base = r;
    const double per_event =
        r.events > 0 ? 1e6 * (r.cpu - base.cpu) / static_cast<double>(r.events) : 0.0;
    std::printf("%-9d %9.3f %9.3f %10lld %12.0f %14.1f %12.3f\n", watchers, r.wall, r.cpu,
                static_cast<long long>(r.events), static_cast<double>(r.events) / r.wall, per_event,
                r.wall / base.wall);
  }
  std::printf("(ideal wall: %.3f s = trials x steps x step / 2 devices)\n",
              static_cast<double>(trials) * static_cast<double>(steps) * step_ms / 2e3);
  fs::remove_all(dir);
  return 0;
}
