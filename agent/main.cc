// hydra-agent: the node agent. Trains the trials hydra-controller assigns over gRPC on this
// node's devices, with the shard-spilling executor and the Sharded-LRTF device loop; serves
// Prometheus metrics and Kubernetes health probes; checkpoints every trial on SIGTERM.
#include <grpcpp/grpcpp.h>
#include <grpcpp/resource_quota.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <iostream>
#include <optional>
#include <thread>

#include "agent/executor/gpus.h"
#include "agent/executor/pilot.h"
#include "agent/executor/spilling_executor.h"
#include "agent/metrics/agent_metrics.h"
#include "agent/rpc/addresses.h"
#include "agent/rpc/agent_service.h"
#include "agent/rpc/tls.h"
#include "common/devices.h"
#include "common/host_memory.h"
#include "common/http/http_server.h"
#include "common/partitioner.h"
#include "common/units.h"

namespace {

namespace fs = std::filesystem;

std::atomic<bool> g_stop{false}, g_second_signal{false};

constexpr int kMaxRequestBytes = 4 << 20;  // a trial spec is a few KiB
constexpr int kMaxStreamsPerConnection = 32;
constexpr int kMaxServerThreads = 64;  // > AgentConfig::max_watchers: streams hold one each

void OnSignal(int) {
  if (g_stop.exchange(true)) g_second_signal = true;
}

std::string Hostname() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "localhost";
  return buf;
}

/// Canonical absolute forms of the roots; each must exist and be a directory.
bool CanonicalRoots(const std::string& flag, std::vector<std::string>* roots) {
  for (auto& root : *roots) {
    std::error_code ec;
    fs::path canon = fs::canonical(root, ec);
    if (ec || !fs::is_directory(canon)) {
      std::cerr << "error: " << flag << " " << root << ": not an existing directory"
                << (ec ? " (" + ec.message() + ")" : std::string()) << "\n";
      return false;
    }
    root = canon.string();
  }
  return true;
}

/// "host:port" with the port the server really bound (for port 0).
std::string WithPort(const std::string& address, int port) {
  auto colon = address.rfind(':');
  std::string host = colon == std::string::npos ? address : address.substr(0, colon);
  if (host.empty()) host = "0.0.0.0";
  return host + ":" + std::to_string(port);
}

}  // namespace

int main(int argc, char** argv) {
  // Before anything touches a GPU: the caching allocator reads its settings once.
  hydra::executor::ConfigureCudaAllocator();
  CLI::App app{
      "hydra-agent: the Hydra node agent. Trains the trials hydra-controller assigns over gRPC "
      "on this node's devices (shard spilling + Sharded-LRTF), checkpoints them to shared "
      "storage, and serves Prometheus metrics and health probes."};
  app.set_version_flag("--version", std::string("hydra-agent ") + HYDRA_VERSION);
  std::string node_name = Hostname(), grpc_bind = "0.0.0.0:9443", metrics_bind = ":8080",
              health_bind = ":8081", devices_flag = "cpu:1", spill_dir = "/var/lib/hydra/spill",
              host_memory, advertise, tls_cert, tls_key, tls_client_ca,
              tls_client_identity = "hydra-controller";
  std::string dedicated_job;
  bool insecure = false;
  std::vector<std::string> data_roots, checkpoint_roots;
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  size_t max_trials = 1000;
  double linger_s = 3;
  app.add_option("--node-name", node_name, "This node's name in metrics and status")
      ->capture_default_str();
  app.add_option("--grpc-bind-address", grpc_bind, "Where the gRPC service listens (port 0: any)")
      ->capture_default_str();
  app.add_option("--grpc-advertise-address", advertise,
                 "The endpoint hydra_agent_info advertises to the controller (default: the bind "
                 "address when it names one host, else <node-name>:<bound gRPC port>)");
  app.add_option("--metrics-bind-address", metrics_bind,
                 "Where /metrics is served, [host]:port (\"0\" disables)")
      ->capture_default_str();
  app.add_option("--health-probe-bind-address", health_bind,
                 "Where /healthz and /readyz are served, [host]:port (\"0\" disables)")
      ->capture_default_str();
  app.add_option("--devices", devices_flag,
                 "Devices and their memory budget: cpu:N or cpu:N,budget=4Gi (default budget: "
                 "the host memory for trials); cuda, cuda:0,2 or cuda:0,budget=20Gi name GPUs "
                 "(the CUDA build, scripts/build-cuda.sh)")
      ->capture_default_str();
  std::string optimizer = "auto";
  app.add_option("--optimizer", optimizer, hydra::kOptimizerFlagHelp)
      ->check(CLI::IsMember(hydra::kOptimizerFlagChoices))
      ->capture_default_str();
  app.add_option("--threads", threads, "CPU threads for training, shared by the devices")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  app.add_option("--host-memory", host_memory,
                 "Host memory the trials' state may use, e.g. 16Gi (default: 75% of the RAM or "
                 "of the container's cgroup memory limit, whichever is less)");
  app.add_option("--spill-dir", spill_dir, "Local directory for spilled shard state")
      ->capture_default_str();
  app.add_option("--data-root", data_roots,
                 "Directory trials may read datasets from (repeatable; required)")
      ->required();
  app.add_option("--checkpoint-root", checkpoint_roots,
                 "Directory trials may write checkpoints under (repeatable; required)")
      ->required();
  app.add_option(
         "--max-trials", max_trials,
         "Trials this agent trains at once (pending or running; finished ones do not count)")
      ->capture_default_str();
  app.add_option("--shutdown-linger-seconds", linger_s,
                 "After SIGTERM's checkpoints, keep answering GetStatus this long so that the "
                 "controller sees the trials INTERRUPTED and moves them at once")
      ->capture_default_str();
  app.add_option("--tls-cert-file", tls_cert, "PEM certificate of the gRPC server (enables TLS)");
  app.add_option("--tls-key-file", tls_key, "PEM private key of --tls-cert-file");
  app.add_option("--tls-client-ca-file", tls_client_ca,
                 "PEM CA: require client certificates it signed (mutual TLS)");
  auto* identity_flag =
      app.add_option("--tls-client-identity", tls_client_identity,
                     "With mutual TLS: the name a client certificate must carry, in its SANs "
                     "(or its CN when it has none); '*' accepts any certificate the CA signed")
          ->capture_default_str();
  app.add_option("--dedicated-job", dedicated_job,
                 "NAMESPACE/NAME/UID: serve only this MultiModelJob's trials (the controller sets "
                 "it on the agent pods it creates for a job's spec.agents); every other trial is "
                 "refused PERMISSION_DENIED. Default: any job's");
  app.add_flag("--insecure", insecure,
               "Allow plaintext gRPC on an address other than loopback (anyone who reaches the "
               "port can then assign, cancel and read trials)");
  CLI11_PARSE(app, argc, argv);

  if (!CanonicalRoots("--data-root", &data_roots) ||
      !CanonicalRoots("--checkpoint-root", &checkpoint_roots)) {
    return 2;
  }
  if (identity_flag->count() > 0 && tls_client_ca.empty()) {
    std::cerr << "error: --tls-client-identity needs mutual TLS (--tls-client-ca-file)\n";
    return 2;
  }
  if (tls_client_ca.empty() || tls_client_identity == "*") tls_client_identity.clear();
  std::optional<hydra::agent::DedicatedJob> dedicated;
  if (!dedicated_job.empty()) {
    auto parsed = hydra::agent::ParseDedicatedJob(dedicated_job);
    if (!parsed.ok()) {
      std::cerr << "error: " << parsed.status().message() << "\n";
      return 2;
    }
    dedicated = *parsed;
  }
  if (tls_cert.empty()) {
    const std::string host = hydra::agent::HostOf(grpc_bind);
    if (!hydra::agent::IsLoopbackHost(host) && !insecure) {
      std::cerr << "error: --grpc-bind-address " << grpc_bind
                << " is reachable from other machines, and without --tls-cert-file the gRPC "
                   "service would be plaintext: anyone who reaches it could assign, cancel and "
                   "read trials. Give --tls-cert-file/--tls-key-file (and "
                   "--tls-client-ca-file), bind to 127.0.0.1, or pass --insecure.\n";
      return 2;
    }
    std::cerr << "hydra-agent: WARNING: gRPC is plaintext (no --tls-cert-file): anyone who "
                 "reaches "
              << grpc_bind << " can assign, cancel and read trials\n";
  }
  int64_t host_bytes = hydra::DefaultHostMemoryBytes();
  if (!host_memory.empty()) {
    auto parsed = hydra::ParseByteQuantity(host_memory);
    if (!parsed.ok() || *parsed <= 0) {
      std::cerr << "error: --host-memory: expected a byte quantity such as 16Gi, got '"
                << host_memory << "'\n";
      return 2;
    }
    host_bytes = *parsed;
  }
  auto devices = [&]() -> hydra::StatusOr<std::vector<hydra::DeviceSpec>> {
    ASSIGN_OR_RETURN(auto request, hydra::ParseDevicesRequest(devices_flag));
    ASSIGN_OR_RETURN(auto found, hydra::executor::FindDevices(request, host_bytes));
    RETURN_IF_ERROR(hydra::executor::CheckExecutorsCanUse(found));
    return found;
  }();
  if (!devices.ok()) {
    std::cerr << "error: " << devices.status().message() << "\n";
    return 2;
  }
  auto creds = hydra::agent::MakeServerCredentials({tls_cert, tls_key, tls_client_ca});
  if (!creds.ok()) {
    std::cerr << "error: " << creds.status().message() << "\n";
    return 2;
  }

  const int per_device_threads = std::max(1, threads / static_cast<int>(devices->size()));
  hydra::executor::ExecutorOptions exec_options;
  exec_options.threads = per_device_threads;
  exec_options.devices.devices = *devices;
  exec_options.optimizer_placement = *hydra::ParseOptimizerFlag(optimizer);  // checked by CLI11
  if (auto capped = hydra::executor::CapGpuMemory(*devices); !capped.ok()) {
    std::cerr << "error: " << capped.message() << "\n";
    return 2;
  }
  if (const std::string rates = hydra::executor::UseMeasuredLinkRates(&exec_options);
      !rates.empty()) {
    std::cerr << "hydra-agent: " << rates << "\n";
  }
  exec_options.spill_dir = spill_dir;
  auto factory = hydra::executor::MakeExecutorFactory(exec_options);

  hydra::agent::AgentConfig config;
  config.node_name = node_name;
  config.version = HYDRA_VERSION;
  config.devices = *devices;
  config.data_roots = data_roots;
  config.checkpoint_roots = checkpoint_roots;
  config.host_memory_bytes = host_bytes;
  config.spill_dir = spill_dir;
  config.max_trials = max_trials;
  config.threads_per_device = per_device_threads;
  config.required_client_identity = tls_client_identity;
  config.dedicated_job = dedicated;
  hydra::agent::AgentMetrics metrics(node_name, HYDRA_VERSION);
  hydra::agent::AgentService service(config, factory.get(), &metrics);
  grpc::ServerBuilder builder;
  int grpc_port = 0;
  builder.AddListeningPort(grpc_bind, *creds, &grpc_port);
  // Bounds on what callers can make the agent hold: request size, streams per connection and
  // the threads serving calls (a call past them is refused RESOURCE_EXHAUSTED).
  builder.SetMaxReceiveMessageSize(kMaxRequestBytes);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, kMaxStreamsPerConnection);
  grpc::ResourceQuota quota("hydra-agent");
  quota.SetMaxThreads(kMaxServerThreads);
  builder.SetResourceQuota(quota);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || grpc_port == 0) {
    std::cerr << "error: --grpc-bind-address " << grpc_bind << ": cannot listen\n";
    return 1;
  }
  const std::string endpoint =
      advertise.empty() ? hydra::agent::DefaultAdvertiseAddress(grpc_bind, grpc_port, node_name)
                        : advertise;
  metrics.SetInfo({endpoint, dedicated ? dedicated->uid : "", optimizer});
  std::cout << "hydra-agent " << HYDRA_VERSION << " on node " << node_name << ": gRPC on "
            << WithPort(grpc_bind, grpc_port) << " ("
            << (tls_cert.empty()        ? "plaintext"
                : tls_client_ca.empty() ? "TLS"
                                        : "mutual TLS")
            << "), advertised as " << endpoint << "\n";
  hydra::http::ProbeAndMetricsServers endpoints;
  if (auto s = endpoints.Start(
          metrics_bind, [&] { return metrics.Render(); }, health_bind,
          [&] { return service.NotReadyReason(); }, [&] { return service.NotLiveReason(); });
      !s.ok()) {
    std::cerr << "error: " << s.message() << "\n";
    return 1;
  }
  std::cout << "hydra-agent: metrics on " << metrics_bind << "/metrics, probes on " << health_bind
            << "/healthz and /readyz\n";
  std::cout << "hydra-agent: " << devices->size() << " device(s) of "
            << hydra::FormatBytes(devices->front().memory_bytes) << ", "
            << hydra::FormatBytes(host_bytes) << " host memory for trials, spill dir " << spill_dir
            << ", spilled trials' optimizers on "
            << (optimizer == "auto" ? "the cost model's choice" : "the " + optimizer)
            << " (--optimizer)\n"
            << std::flush;

  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  while (!g_stop.load()) {
    service.Tick();
    for (int i = 0; i < 10 && !g_stop.load(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  std::cout << "hydra-agent: shutting down: checkpointing every unfinished trial\n" << std::flush;
  hydra::Status s = service.Shutdown("agent shut down");
  if (!s.ok()) std::cerr << "hydra-agent: " << s.message() << "\n";
  std::cout << "hydra-agent: trials checkpointed; serving status for " << linger_s << " s more\n"
            << std::flush;
  for (int i = 0; i < static_cast<int>(linger_s * 10) && !g_second_signal.load(); ++i) {
    service.Tick();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  server->Wait();
  std::cout << "hydra-agent: stopped\n";
  return s.ok() ? 0 : 1;
}
