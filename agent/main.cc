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

/// hydra-agent's flags as given.
struct Flags {
  std::string node_name = Hostname(), grpc_bind = "0.0.0.0:9443", metrics_bind = ":8080",
              health_bind = ":8081", devices = "cpu:1", spill_dir = "/var/lib/hydra/spill",
              host_memory, advertise, tls_cert, tls_key, tls_client_ca,
              tls_client_identity = "hydra-controller", dedicated_job, optimizer = "auto";
  bool insecure = false;
  std::vector<std::string> data_roots, checkpoint_roots;
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  size_t max_trials = 1000;
  double linger_s = 3;
};

void AddServingFlags(CLI::App& app, Flags* f) {
  app.add_option("--node-name", f->node_name, "This node's name in metrics and status")
      ->capture_default_str();
  app.add_option("--grpc-bind-address", f->grpc_bind,
                 "Where the gRPC service listens (port 0: any)")
      ->capture_default_str();
  app.add_option("--grpc-advertise-address", f->advertise,
                 "The endpoint hydra_agent_info advertises to the controller (default: the bind "
                 "address when it names one host, else <node-name>:<bound gRPC port>)");
  app.add_option("--metrics-bind-address", f->metrics_bind,
                 "Where /metrics is served, [host]:port (\"0\" disables)")
      ->capture_default_str();
  app.add_option("--health-probe-bind-address", f->health_bind,
                 "Where /healthz and /readyz are served, [host]:port (\"0\" disables)")
      ->capture_default_str();
  app.add_option("--shutdown-linger-seconds", f->linger_s,
                 "After SIGTERM's checkpoints, keep answering GetStatus this long so that the "
                 "controller sees the trials INTERRUPTED and moves them at once")
      ->capture_default_str();
  app.add_option("--tls-cert-file", f->tls_cert,
                 "PEM certificate of the gRPC server (enables TLS)");
  app.add_option("--tls-key-file", f->tls_key, "PEM private key of --tls-cert-file");
  app.add_option("--tls-client-ca-file", f->tls_client_ca,
                 "PEM CA: require client certificates it signed (mutual TLS)");
  app.add_option("--tls-client-identity", f->tls_client_identity,
                 "With mutual TLS: the name a client certificate must carry, in its SANs "
                 "(or its CN when it has none); '*' accepts any certificate the CA signed")
      ->capture_default_str();
  app.add_option("--dedicated-job", f->dedicated_job,
                 "NAMESPACE/NAME/UID: serve only this MultiModelJob's trials (the controller sets "
                 "it on the agent pods it creates for a job's spec.agents); every other trial is "
                 "refused PERMISSION_DENIED. Default: any job's");
  app.add_flag("--insecure", f->insecure,
               "Allow plaintext gRPC on an address other than loopback (anyone who reaches the "
               "port can then assign, cancel and read trials)");
}

void AddTrainingFlags(CLI::App& app, Flags* f) {
  app.add_option("--devices", f->devices,
                 "Devices and their memory budget: cpu:N or cpu:N,budget=4Gi (default budget: "
                 "the host memory for trials); cuda, cuda:0,2 or cuda:0,budget=20Gi name GPUs "
                 "(the CUDA build, scripts/build-cuda.sh)")
      ->capture_default_str();
  app.add_option("--optimizer", f->optimizer, hydra::kOptimizerFlagHelp)
      ->check(CLI::IsMember(hydra::kOptimizerFlagChoices))
      ->capture_default_str();
  app.add_option("--threads", f->threads, "CPU threads for training, shared by the devices")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  app.add_option("--host-memory", f->host_memory,
                 "Host memory the trials' state may use, e.g. 16Gi (default: 75% of the RAM or "
                 "of the container's cgroup memory limit, whichever is less)");
  app.add_option("--spill-dir", f->spill_dir, "Local directory for spilled shard state")
      ->capture_default_str();
  app.add_option("--data-root", f->data_roots,
                 "Directory trials may read datasets from (repeatable; required)")
      ->required();
  app.add_option("--checkpoint-root", f->checkpoint_roots,
                 "Directory trials may write checkpoints under (repeatable; required)")
      ->required();
  app.add_option(
         "--max-trials", f->max_trials,
         "Trials this agent trains at once (pending or running; finished ones do not count)")
      ->capture_default_str();
}

/// What the flags resolve to, once checked.
struct Settings {
  std::optional<hydra::agent::DedicatedJob> dedicated;
  int64_t host_bytes = 0;
  std::vector<hydra::DeviceSpec> devices;
  std::shared_ptr<grpc::ServerCredentials> creds;
};

/// Whether --tls-client-identity comes with mutual TLS; clears the identity where none is
/// checked. Says why not on stderr.
bool CheckClientIdentity(const CLI::App& app, Flags* f) {
  if (app.count("--tls-client-identity") > 0 && f->tls_client_ca.empty()) {
    std::cerr << "error: --tls-client-identity needs mutual TLS (--tls-client-ca-file)\n";
    return false;
  }
  if (f->tls_client_ca.empty() || f->tls_client_identity == "*") f->tls_client_identity.clear();
  return true;
}

/// Whether gRPC may be plaintext where it binds (loopback, or --insecure); warns when it is.
bool CheckPlaintext(const Flags& f) {
  if (!f.tls_cert.empty()) return true;
  const std::string host = hydra::agent::HostOf(f.grpc_bind);
  if (!hydra::agent::IsLoopbackHost(host) && !f.insecure) {
    std::cerr << "error: --grpc-bind-address " << f.grpc_bind
              << " is reachable from other machines, and without --tls-cert-file the gRPC "
                 "service would be plaintext: anyone who reaches it could assign, cancel and "
                 "read trials. Give --tls-cert-file/--tls-key-file (and "
                 "--tls-client-ca-file), bind to 127.0.0.1, or pass --insecure.\n";
    return false;
  }
  std::cerr << "hydra-agent: WARNING: gRPC is plaintext (no --tls-cert-file): anyone who "
               "reaches "
            << f.grpc_bind << " can assign, cancel and read trials\n";
  return true;
}

/// The flags checked and resolved (roots made canonical in `f`); problems are said on stderr
/// and give nullopt.
std::optional<Settings> Resolve(const CLI::App& app, Flags* f) {
  if (!CanonicalRoots("--data-root", &f->data_roots) ||
      !CanonicalRoots("--checkpoint-root", &f->checkpoint_roots) || !CheckClientIdentity(app, f)) {
    return std::nullopt;
  }
  Settings s;
  if (!f->dedicated_job.empty()) {
    auto parsed = hydra::agent::ParseDedicatedJob(f->dedicated_job);
    if (!parsed.ok()) {
      std::cerr << "error: " << parsed.status().message() << "\n";
      return std::nullopt;
    }
    s.dedicated = *parsed;
  }
  if (!CheckPlaintext(*f)) return std::nullopt;
  hydra::Status resolved = [&]() -> hydra::Status {
    s.host_bytes = hydra::DefaultHostMemoryBytes();
    if (!f->host_memory.empty()) {
      auto parsed = hydra::ParseByteQuantity(f->host_memory);
      if (!parsed.ok() || *parsed <= 0) {
        return hydra::InvalidArgumentError(
            "--host-memory: expected a byte quantity such as 16Gi, got '" + f->host_memory + "'");
      }
      s.host_bytes = *parsed;
    }
    ASSIGN_OR_RETURN(auto request, hydra::ParseDevicesRequest(f->devices));
    ASSIGN_OR_RETURN(s.devices, hydra::executor::FindDevices(request, s.host_bytes));
    RETURN_IF_ERROR(hydra::executor::CheckExecutorsCanUse(s.devices));
    ASSIGN_OR_RETURN(
        s.creds, hydra::agent::MakeServerCredentials({f->tls_cert, f->tls_key, f->tls_client_ca}));
    return hydra::executor::CapGpuMemory(s.devices);
  }();
  if (!resolved.ok()) {
    std::cerr << "error: " << resolved.message() << "\n";
    return std::nullopt;
  }
  return s;
}

hydra::agent::AgentConfig ConfigOf(const Flags& f, const Settings& s, int per_device_threads) {
  hydra::agent::AgentConfig config;
  config.node_name = f.node_name;
  config.version = HYDRA_VERSION;
  config.devices = s.devices;
  config.data_roots = f.data_roots;
  config.checkpoint_roots = f.checkpoint_roots;
  config.host_memory_bytes = s.host_bytes;
  config.spill_dir = f.spill_dir;
  config.max_trials = f.max_trials;
  config.threads_per_device = per_device_threads;
  config.required_client_identity = f.tls_client_identity;
  config.dedicated_job = s.dedicated;
  return config;
}

/// The gRPC server on --grpc-bind-address (`*port`: the port it bound), bounded in what
/// callers can make the agent hold: request size, streams per connection and the threads
/// serving calls (a call past them is refused RESOURCE_EXHAUSTED). Null if it cannot listen.
std::unique_ptr<grpc::Server> StartGrpc(const Flags& f, const Settings& s,
                                        hydra::agent::AgentService* service, int* port) {
  grpc::ServerBuilder builder;
  builder.AddListeningPort(f.grpc_bind, s.creds, port);
  builder.SetMaxReceiveMessageSize(kMaxRequestBytes);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, kMaxStreamsPerConnection);
  grpc::ResourceQuota quota("hydra-agent");
  quota.SetMaxThreads(kMaxServerThreads);
  builder.SetResourceQuota(quota);
  builder.RegisterService(service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  return server && *port != 0 ? std::move(server) : nullptr;
}

/// Ticks the service until SIGTERM or SIGINT; then checkpoints every unfinished trial, keeps
/// answering for --shutdown-linger-seconds (unless signalled again) and stops the server.
int ServeUntilSignalled(hydra::agent::AgentService& service, grpc::Server& server,
                        double linger_s) {
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
  server.Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  server.Wait();
  std::cout << "hydra-agent: stopped\n";
  return s.ok() ? 0 : 1;
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
  Flags f;
  AddServingFlags(app, &f);
  AddTrainingFlags(app, &f);
  CLI11_PARSE(app, argc, argv);
  std::optional<Settings> settings = Resolve(app, &f);
  if (!settings) return 2;
  const Settings& s = *settings;

  const int per_device_threads = std::max(1, f.threads / static_cast<int>(s.devices.size()));
  hydra::executor::ExecutorOptions exec_options;
  exec_options.threads = per_device_threads;
  exec_options.devices.devices = s.devices;
  exec_options.optimizer_placement = *hydra::ParseOptimizerFlag(f.optimizer);  // checked by CLI11
  if (const std::string rates = hydra::executor::UseMeasuredLinkRates(&exec_options);
      !rates.empty()) {
    std::cerr << "hydra-agent: " << rates << "\n";
  }
  exec_options.spill_dir = f.spill_dir;
  auto factory = hydra::executor::MakeExecutorFactory(exec_options);

  hydra::agent::AgentMetrics metrics(f.node_name, HYDRA_VERSION);
  hydra::agent::AgentService service(ConfigOf(f, s, per_device_threads), factory.get(), &metrics);
  int grpc_port = 0;
  std::unique_ptr<grpc::Server> server = StartGrpc(f, s, &service, &grpc_port);
  if (!server) {
    std::cerr << "error: --grpc-bind-address " << f.grpc_bind << ": cannot listen\n";
    return 1;
  }
  const std::string endpoint = f.advertise.empty() ? hydra::agent::DefaultAdvertiseAddress(
                                                         f.grpc_bind, grpc_port, f.node_name)
                                                   : f.advertise;
  metrics.SetInfo({endpoint, s.dedicated ? s.dedicated->uid : "", f.optimizer});
  std::cout << "hydra-agent " << HYDRA_VERSION << " on node " << f.node_name << ": gRPC on "
            << WithPort(f.grpc_bind, grpc_port) << " ("
            << (f.tls_cert.empty()        ? "plaintext"
                : f.tls_client_ca.empty() ? "TLS"
                                          : "mutual TLS")
            << "), advertised as " << endpoint << "\n";
  hydra::http::ProbeAndMetricsServers endpoints;
  if (auto st = endpoints.Start(
          f.metrics_bind, [&] { return metrics.Render(); }, f.health_bind,
          [&] { return service.NotReadyReason(); }, [&] { return service.NotLiveReason(); });
      !st.ok()) {
    std::cerr << "error: " << st.message() << "\n";
    return 1;
  }
  std::cout << "hydra-agent: metrics on " << f.metrics_bind << "/metrics, probes on "
            << f.health_bind << "/healthz and /readyz\n";
  std::cout << "hydra-agent: " << s.devices.size() << " device(s) of "
            << hydra::FormatBytes(s.devices.front().memory_bytes) << ", "
            << hydra::FormatBytes(s.host_bytes) << " host memory for trials, spill dir "
            << f.spill_dir << ", spilled trials' optimizers on "
            << (f.optimizer == "auto" ? "the cost model's choice" : "the " + f.optimizer)
            << " (--optimizer)\n"
            << std::flush;
  return ServeUntilSignalled(service, *server, f.linger_s);
}
