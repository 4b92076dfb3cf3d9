// hydra-controller: the operator. Watches MultiModelJobs, places their trials on hydra-agents
// by the free device memory Prometheus reports, assigns them over gRPC, follows their progress
// and writes it into each job's status.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <iostream>
#include <sstream>
#include <thread>

#include "common/http/http_server.h"
#include "controller/agentclient/agent_client.h"
#include "controller/agents/agent_certs.h"
#include "controller/kube/kube_client.h"
#include "controller/kube/kube_config.h"
#include "controller/kube/leader_election.h"
#include "controller/metrics/controller_metrics.h"
#include "controller/reconciler/manager.h"
#include "controller/reconciler/reconciler.h"

namespace {

namespace fs = std::filesystem;
using hydra::controller::kMultiModelJobs;

std::atomic<bool> g_stop{false};
void OnSignal(int) { g_stop = true; }

std::string Hostname() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "hydra-controller";
  return buf;
}

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

/// hydra-controller's flags as given.
struct Flags {
  std::string kubeconfig, namespaces, prometheus_url, data_root = "/data",
                                                      checkpoint_root = "/checkpoints";
  std::string metrics_bind = ":8080", health_bind = ":8081", tls_ca, tls_cert, tls_key,
              tls_server_name, scrape_job = "hydra-agent";
  std::string lease_ns = "hydra-system", lease_name = "hydra-controller", identity = Hostname();
  std::string pod_ca_cert, pod_ca_key, pod_client_identity = "hydra-controller",
                                       pod_tls_dir = "/etc/hydra/tls";
  bool leader_elect = false;
  int workers = 2, agent_pod_grpc_port = 9443;
  double resync_s = 2.0, inventory_s = 2.0, lost_s = 15.0;
};

/// How the controller reaches agents: the shared pool's (Prometheus, TLS) and the job pods'.
void AddAgentFlags(CLI::App& app, Flags* f) {
  app.add_option("--prometheus-url", f->prometheus_url,
                 "Prometheus with the agents' metrics, e.g. http://prometheus:9090: the shared "
                 "agent pool (the DaemonSet). Without it only jobs with spec.agents run");
  app.add_option("--data-root", f->data_root,
                 "Relative spec.dataset.path resolves against this (the agents' data root)")
      ->capture_default_str();
  app.add_option("--checkpoint-root", f->checkpoint_root,
                 "Shared storage for checkpoints: <root>/<namespace>/<job>/<trial>")
      ->capture_default_str();
  app.add_option("--agent-tls-ca-file", f->tls_ca, "CA of the agents' gRPC certificates (TLS)");
  app.add_option("--agent-tls-cert-file", f->tls_cert, "Client certificate for mutual TLS");
  app.add_option("--agent-tls-key-file", f->tls_key, "Key of --agent-tls-cert-file");
  app.add_option("--agent-tls-server-name", f->tls_server_name,
                 "Name every agent's certificate is checked against (default: the host of its "
                 "endpoint). Agents advertise pod IPs; one certificate for a fixed name such as "
                 "hydra-agent.<namespace>.svc fits them all");
  app.add_option("--agent-scrape-job", f->scrape_job,
                 "The Prometheus job label of the agents' own scrape job: only its "
                 "hydra_agent_info and device series are used (anything else Prometheus scrapes "
                 "could claim to be an agent); \"\" trusts every job")
      ->capture_default_str();
  app.add_option("--agent-pod-grpc-port", f->agent_pod_grpc_port,
                 "The gRPC port of the agent pods this controller creates for jobs with "
                 "spec.agents (their data and checkpoint roots are --data-root and "
                 "--checkpoint-root: the template mounts its volumes there)")
      ->check(CLI::Range(1, 65535))
      ->capture_default_str();
  app.add_option("--agent-pod-ca-cert-file", f->pod_ca_cert,
                 "CA certificate (PEM) that signs the certificate each job with spec.agents gets "
                 "for its agent pods (Secret <job>-agent-tls, name <job>.<namespace>.agents."
                 "hydra.dev, checked per pod); also their ca.crt for the controller's client "
                 "certificate. Without it those pods serve plaintext");
  app.add_option("--agent-pod-ca-key-file", f->pod_ca_key, "The key of --agent-pod-ca-cert-file");
  app.add_option("--agent-pod-tls-dir", f->pod_tls_dir,
                 "Where job agent pods mount their certificate's Secret (an absolute path)")
      ->capture_default_str();
  app.add_option("--agent-pod-tls-client-identity", f->pod_client_identity,
                 "With --agent-pod-ca-cert-file and a client certificate (--agent-tls-cert-file): "
                 "the name job agent pods require of the controller's certificate")
      ->capture_default_str();
  app.add_option("--agent-lost-seconds", f->lost_s,
                 "An agent silent this long and gone from Prometheus is lost: its trials move")
      ->capture_default_str();
}

/// What the controller watches, how it runs as a replica, and what it serves.
void AddRunFlags(CLI::App& app, Flags* f) {
  app.add_option("--kubeconfig", f->kubeconfig,
                 "kubeconfig file (default: $KUBECONFIG, ~/.kube/config, in-cluster)");
  app.add_option("--namespaces", f->namespaces,
                 "Comma-separated namespaces to watch (default: all)");
  app.add_flag("--leader-elect", f->leader_elect,
               "Run as one of several replicas: only the Lease holder reconciles");
  app.add_option("--leader-election-namespace", f->lease_ns)->capture_default_str();
  app.add_option("--leader-election-id", f->lease_name, "Name of the Lease")->capture_default_str();
  app.add_option("--identity", f->identity, "This replica's name in the Lease")
      ->capture_default_str();
  app.add_option("--metrics-bind-address", f->metrics_bind, "/metrics, [host]:port (\"0\": off)")
      ->capture_default_str();
  app.add_option("--health-probe-bind-address", f->health_bind,
                 "/healthz and /readyz, [host]:port (\"0\": off)")
      ->capture_default_str();
  app.add_option("--workers", f->workers, "Jobs reconciled at once")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--resync-seconds", f->resync_s, "How often running jobs re-read their agents")
      ->capture_default_str();
  app.add_option("--inventory-seconds", f->inventory_s, "How often Prometheus is queried")
      ->capture_default_str();
}

/// The CA of jobs' own agent pods (--agent-pod-ca-*-file), null without one.
hydra::StatusOr<std::shared_ptr<const hydra::controller::CertificateAuthority>> PodCa(
    const Flags& f) {
  if (f.pod_tls_dir.empty() || f.pod_tls_dir.front() != '/') {
    return hydra::InvalidArgumentError("--agent-pod-tls-dir " + f.pod_tls_dir +
                                       ": not an absolute path");
  }
  if (f.pod_ca_cert.empty() != f.pod_ca_key.empty()) {
    return hydra::InvalidArgumentError(
        "--agent-pod-ca-cert-file and --agent-pod-ca-key-file go together");
  }
  if (f.pod_ca_cert.empty()) return {nullptr};
  ASSIGN_OR_RETURN(auto loaded,
                   hydra::controller::LoadCertificateAuthority(f.pod_ca_cert, f.pod_ca_key));
  return {std::make_shared<hydra::controller::CertificateAuthority>(std::move(loaded))};
}

/// Says on stderr what the flags leave unprotected or off.
void Warn(const Flags& f, bool pod_ca) {
  if (f.tls_ca.empty() && !f.prometheus_url.empty()) {
    std::cerr << "hydra-controller: WARNING: calls to the shared pool's agents are plaintext (no "
                 "--agent-tls-ca-file): anyone on the network path can read trial specs and "
                 "impersonate agents. Use mutual TLS outside a test cluster (the Helm chart "
                 "does by default).\n";
  }
  if (!pod_ca) {
    std::cerr << "hydra-controller: WARNING: no --agent-pod-ca-cert-file: the agent pods of jobs "
                 "with spec.agents serve plaintext gRPC (--insecure); each still serves its own "
                 "job only\n";
  }
  if (f.scrape_job.empty()) {
    std::cerr << "hydra-controller: WARNING: --agent-scrape-job is empty: any scraped target "
                 "that exports hydra_agent_info is taken for an agent\n";
  }
  if (f.prometheus_url.empty()) {
    std::cerr << "hydra-controller: no --prometheus-url: jobs without spec.agents (the shared "
                 "agent pool) wait until one is given\n";
  }
}

hydra::controller::ReconcilerOptions ReconcilerOptionsOf(
    const Flags& f, std::shared_ptr<const hydra::controller::CertificateAuthority> pod_ca) {
  hydra::controller::ReconcilerOptions ro;
  ro.data_root = f.data_root;
  ro.checkpoint_root = f.checkpoint_root;
  ro.progress_resync = std::chrono::milliseconds(static_cast<int64_t>(f.resync_s * 1000));
  ro.agent_lost_after = std::chrono::milliseconds(static_cast<int64_t>(f.lost_s * 1000));
  // A job's own agent pods see the data and checkpoints at the paths this controller resolves
  // (their template mounts the volumes there).
  ro.agent_pods.data_root = f.data_root;
  ro.agent_pods.checkpoint_root = f.checkpoint_root;
  ro.agent_pods.grpc_port = f.agent_pod_grpc_port;
  ro.agent_pod_ca = std::move(pod_ca);
  ro.agent_pods.tls_dir = f.pod_tls_dir;
  // Mutual TLS when the controller has a client certificate to show the pods' agents.
  ro.agent_pods.tls_client_identity = f.tls_cert.empty() ? "" : f.pod_client_identity;
  return ro;
}

/// With --leader-elect: campaigns for the Lease; `leading` and the metric turn true once this
/// replica holds it, and losing it stops the process. Without: leads at once (null).
std::unique_ptr<hydra::kube::LeaderElector> Campaign(const Flags& f,
                                                     hydra::kube::KubeClientInterface* kube,
                                                     hydra::controller::ControllerMetrics& metrics,
                                                     std::atomic<bool>& leading) {
  if (!f.leader_elect) {
    metrics.SetLeader(true);
    return nullptr;
  }
  hydra::kube::LeaderElectionConfig lc;
  lc.lease_namespace = f.lease_ns;
  lc.lease_name = f.lease_name;
  lc.identity = f.identity;
  auto elector = std::make_unique<hydra::kube::LeaderElector>(
      kube, lc,
      [&metrics, &leading, identity = f.identity] {
        std::cout << "hydra-controller: " << identity << " is the leader\n" << std::flush;
        leading = true;
        metrics.SetLeader(true);
      },
      [] {
        // Another replica may lead now: stop at once rather than race it (as
        // controller-runtime does); the Deployment restarts us as a candidate.
        std::cerr << "hydra-controller: lost the leader lease; exiting\n";
        g_stop = true;
      });
  elector->Start();
  std::cout << "hydra-controller: " << f.identity << " waiting for the lease " << f.lease_ns << "/"
            << f.lease_name << "\n"
            << std::flush;
  return elector;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "hydra-controller: the Hydra operator. Watches MultiModelJobs, places their trials on "
      "hydra-agents by the free device memory Prometheus reports, assigns them over gRPC and "
      "keeps each job's status current."};
  app.set_version_flag("--version", std::string("hydra-controller ") + HYDRA_VERSION);
  Flags f;
  AddRunFlags(app, &f);
  AddAgentFlags(app, &f);
  CLI11_PARSE(app, argc, argv);

  auto kube = [&]() -> hydra::StatusOr<std::unique_ptr<hydra::kube::KubeClient>> {
    ASSIGN_OR_RETURN(auto config, hydra::kube::DefaultKubeConfig(f.kubeconfig));
    return hydra::kube::KubeClient::Create(config);
  }();
  if (!kube.ok()) {
    std::cerr << "error: " << kube.status().message() << "\n";
    return 2;
  }
  auto pod_ca = PodCa(f);
  if (!pod_ca.ok()) {
    std::cerr << "error: " << pod_ca.status().message() << "\n";
    return 2;
  }
  // The job agents' certificates chain to their CA, whatever signed the shared pool's.
  auto pool = hydra::controller::GrpcAgentPool::Create(
      {f.tls_ca, f.tls_cert, f.tls_key, f.tls_server_name, *pod_ca ? (*pod_ca)->cert_pem : ""});
  if (!pool.ok()) {
    std::cerr << "error: " << pool.status().message() << "\n";
    return 2;
  }
  // The CRD must be installed: a clear error beats a watcher that retries forever.
  // Probe where this replica will watch: with --namespaces it may hold no cluster-wide list.
  const auto watched = Split(f.namespaces);
  if (auto probe = (*kube)->List(kMultiModelJobs, watched.empty() ? "" : watched.front(), "", 1);
      !probe.ok()) {
    std::cerr << "error: cannot list MultiModelJobs (is crds/multimodeljob.yaml applied, and may "
                 "this service account list them?): "
              << probe.status().message() << "\n";
    return 1;
  }
  Warn(f, *pod_ca != nullptr);

  hydra::controller::ControllerMetrics metrics;
  hydra::controller::CachedPrometheusInventory prometheus_inventory(
      f.prometheus_url, f.scrape_job,
      std::chrono::milliseconds(static_cast<int64_t>(f.inventory_s * 1000)));
  hydra::controller::NoSharedPool no_shared_pool;
  hydra::controller::InventorySourceInterface* inventory =
      f.prometheus_url.empty()
          ? static_cast<hydra::controller::InventorySourceInterface*>(&no_shared_pool)
          : &prometheus_inventory;
  hydra::controller::Reconciler reconciler(kube->get(), pool->get(), inventory,
                                           ReconcilerOptionsOf(f, *pod_ca));

  std::atomic<bool> leading{!f.leader_elect}, synced{false};
  hydra::http::ProbeAndMetricsServers endpoints;
  // Ready once the job cache synced; a passive replica is ready too (it can take over).
  if (auto s = endpoints.Start(
          f.metrics_bind, [&] { return metrics.Render(); }, f.health_bind,
          [&] { return synced ? std::string() : std::string("syncing MultiModelJobs"); });
      !s.ok()) {
    std::cerr << "error: " << s.message() << "\n";
    return 1;
  }

  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  std::unique_ptr<hydra::kube::LeaderElector> elector = Campaign(f, kube->get(), metrics, leading);

  hydra::controller::Manager manager(kube->get(), &reconciler, &metrics, watched, f.workers,
                                     &leading);
  manager.Start();
  std::cout << "hydra-controller " << HYDRA_VERSION << ": watching MultiModelJobs in "
            << (f.namespaces.empty() ? "all namespaces" : f.namespaces) << ", shared agent pool "
            << (f.prometheus_url.empty() ? std::string("off (no --prometheus-url)")
                                         : "from " + f.prometheus_url)
            << "\n"
            << std::flush;
  while (!g_stop) {
    synced = manager.synced();
    metrics.SetQueueDepth(manager.queue_depth());
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::cout << "hydra-controller: stopping\n" << std::flush;
  manager.Stop();
  if (elector) elector->Stop(/*release=*/true);
  return 0;
}
