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

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "hydra-controller: the Hydra operator. Watches MultiModelJobs, places their trials on "
      "hydra-agents by the free device memory Prometheus reports, assigns them over gRPC and "
      "keeps each job's status current."};
  app.set_version_flag("--version", std::string("hydra-controller ") + HYDRA_VERSION);
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
  app.add_option("--kubeconfig", kubeconfig,
                 "kubeconfig file (default: $KUBECONFIG, ~/.kube/config, in-cluster)");
  app.add_option("--namespaces", namespaces, "Comma-separated namespaces to watch (default: all)");
  app.add_option("--prometheus-url", prometheus_url,
                 "Prometheus with the agents' metrics, e.g. http://prometheus:9090: the shared "
                 "agent pool (the DaemonSet). Without it only jobs with spec.agents run");
  app.add_option("--data-root", data_root,
                 "Relative spec.dataset.path resolves against this (the agents' data root)")
      ->capture_default_str();
  app.add_option("--checkpoint-root", checkpoint_root,
                 "Shared storage for checkpoints: <root>/<namespace>/<job>/<trial>")
      ->capture_default_str();
  app.add_option("--agent-tls-ca-file", tls_ca, "CA of the agents' gRPC certificates (TLS)");
  app.add_option("--agent-tls-cert-file", tls_cert, "Client certificate for mutual TLS");
  app.add_option("--agent-tls-key-file", tls_key, "Key of --agent-tls-cert-file");
  app.add_option("--agent-tls-server-name", tls_server_name,
                 "Name every agent's certificate is checked against (default: the host of its "
                 "endpoint). Agents advertise pod IPs; one certificate for a fixed name such as "
                 "hydra-agent.<namespace>.svc fits them all");
  app.add_option("--agent-scrape-job", scrape_job,
                 "The Prometheus job label of the agents' own scrape job: only its "
                 "hydra_agent_info and device series are used (anything else Prometheus scrapes "
                 "could claim to be an agent); \"\" trusts every job")
      ->capture_default_str();
  app.add_option("--agent-pod-grpc-port", agent_pod_grpc_port,
                 "The gRPC port of the agent pods this controller creates for jobs with "
                 "spec.agents (their data and checkpoint roots are --data-root and "
                 "--checkpoint-root: the template mounts its volumes there)")
      ->check(CLI::Range(1, 65535))
      ->capture_default_str();
  app.add_option("--agent-pod-ca-cert-file", pod_ca_cert,
                 "CA certificate (PEM) that signs the certificate each job with spec.agents gets "
                 "for its agent pods (Secret <job>-agent-tls, name <job>.<namespace>.agents."
                 "hydra.dev, checked per pod); also their ca.crt for the controller's client "
                 "certificate. Without it those pods serve plaintext");
  app.add_option("--agent-pod-ca-key-file", pod_ca_key, "The key of --agent-pod-ca-cert-file");
  app.add_option("--agent-pod-tls-dir", pod_tls_dir,
                 "Where job agent pods mount their certificate's Secret (an absolute path)")
      ->capture_default_str();
  app.add_option("--agent-pod-tls-client-identity", pod_client_identity,
                 "With --agent-pod-ca-cert-file and a client certificate (--agent-tls-cert-file): "
                 "the name job agent pods require of the controller's certificate")
      ->capture_default_str();
  app.add_flag("--leader-elect", leader_elect,
               "Run as one of several replicas: only the Lease holder reconciles");
  app.add_option("--leader-election-namespace", lease_ns)->capture_default_str();
  app.add_option("--leader-election-id", lease_name, "Name of the Lease")->capture_default_str();
  app.add_option("--identity", identity, "This replica's name in the Lease")->capture_default_str();
  app.add_option("--metrics-bind-address", metrics_bind, "/metrics, [host]:port (\"0\": off)")
      ->capture_default_str();
  app.add_option("--health-probe-bind-address", health_bind,
                 "/healthz and /readyz, [host]:port (\"0\": off)")
      ->capture_default_str();
  app.add_option("--workers", workers, "Jobs reconciled at once")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--resync-seconds", resync_s, "How often running jobs re-read their agents")
      ->capture_default_str();
  app.add_option("--inventory-seconds", inventory_s, "How often Prometheus is queried")
      ->capture_default_str();
  app.add_option("--agent-lost-seconds", lost_s,
                 "An agent silent this long and gone from Prometheus is lost: its trials move")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  auto config = hydra::kube::DefaultKubeConfig(kubeconfig);
  if (!config.ok()) {
    std::cerr << "error: " << config.status().message() << "\n";
    return 2;
  }
  auto kube = hydra::kube::KubeClient::Create(*config);
  if (!kube.ok()) {
    std::cerr << "error: " << kube.status().message() << "\n";
    return 2;
  }
  if (pod_tls_dir.empty() || pod_tls_dir.front() != '/') {
    std::cerr << "error: --agent-pod-tls-dir " << pod_tls_dir << ": not an absolute path\n";
    return 2;
  }
  std::shared_ptr<const hydra::controller::CertificateAuthority> pod_ca;
  if (pod_ca_cert.empty() != pod_ca_key.empty()) {
    std::cerr << "error: --agent-pod-ca-cert-file and --agent-pod-ca-key-file go together\n";
    return 2;
  }
  if (!pod_ca_cert.empty()) {
    auto loaded = hydra::controller::LoadCertificateAuthority(pod_ca_cert, pod_ca_key);
    if (!loaded.ok()) {
      std::cerr << "error: " << loaded.status().message() << "\n";
      return 2;
    }
    pod_ca = std::make_shared<hydra::controller::CertificateAuthority>(*loaded);
  }
  // The job agents' certificates chain to their CA, whatever signed the shared pool's.
  auto pool = hydra::controller::GrpcAgentPool::Create(
      {tls_ca, tls_cert, tls_key, tls_server_name, pod_ca ? pod_ca->cert_pem : ""});
  if (!pool.ok()) {
    std::cerr << "error: " << pool.status().message() << "\n";
    return 2;
  }
  // The CRD must be installed: a clear error beats a watcher that retries forever.
  // Probe where this replica will watch: with --namespaces it may hold no cluster-wide list.
  const auto watched = Split(namespaces);
  if (auto probe = (*kube)->List(kMultiModelJobs, watched.empty() ? "" : watched.front(), "", 1);
      !probe.ok()) {
    std::cerr << "error: cannot list MultiModelJobs (is crds/multimodeljob.yaml applied, and may "
                 "this service account list them?): "
              << probe.status().message() << "\n";
    return 1;
  }

  hydra::controller::ControllerMetrics metrics;
  if (tls_ca.empty() && !prometheus_url.empty()) {
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
  if (scrape_job.empty()) {
    std::cerr << "hydra-controller: WARNING: --agent-scrape-job is empty: any scraped target "
                 "that exports hydra_agent_info is taken for an agent\n";
  }
  hydra::controller::CachedPrometheusInventory prometheus_inventory(
      prometheus_url, scrape_job,
      std::chrono::milliseconds(static_cast<int64_t>(inventory_s * 1000)));
  hydra::controller::NoSharedPool no_shared_pool;
  hydra::controller::InventorySourceInterface* inventory = &prometheus_inventory;
  if (prometheus_url.empty()) {
    inventory = &no_shared_pool;
    std::cerr << "hydra-controller: no --prometheus-url: jobs without spec.agents (the shared "
                 "agent pool) wait until one is given\n";
  }
  hydra::controller::ReconcilerOptions ro;
  ro.data_root = data_root;
  ro.checkpoint_root = checkpoint_root;
  ro.progress_resync = std::chrono::milliseconds(static_cast<int64_t>(resync_s * 1000));
  ro.agent_lost_after = std::chrono::milliseconds(static_cast<int64_t>(lost_s * 1000));
  // A job's own agent pods see the data and checkpoints at the paths this controller resolves
  // (their template mounts the volumes there).
  ro.agent_pods.data_root = data_root;
  ro.agent_pods.checkpoint_root = checkpoint_root;
  ro.agent_pods.grpc_port = agent_pod_grpc_port;
  ro.agent_pod_ca = pod_ca;
  ro.agent_pods.tls_dir = pod_tls_dir;
  // Mutual TLS when the controller has a client certificate to show the pods' agents.
  ro.agent_pods.tls_client_identity = tls_cert.empty() ? "" : pod_client_identity;
  hydra::controller::Reconciler reconciler(kube->get(), pool->get(), inventory, ro);

  std::atomic<bool> leading{!leader_elect}, synced{false};
  hydra::http::ProbeAndMetricsServers endpoints;
  // Ready once the job cache synced; a passive replica is ready too (it can take over).
  if (auto s = endpoints.Start(
          metrics_bind, [&] { return metrics.Render(); }, health_bind,
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

  std::unique_ptr<hydra::kube::LeaderElector> elector;
  if (leader_elect) {
    hydra::kube::LeaderElectionConfig lc;
    lc.lease_namespace = lease_ns;
    lc.lease_name = lease_name;
    lc.identity = identity;
    elector = std::make_unique<hydra::kube::LeaderElector>(
        kube->get(), lc,
        [&] {
          std::cout << "hydra-controller: " << identity << " is the leader\n" << std::flush;
          leading = true;
          metrics.SetLeader(true);
        },
        [&] {
          // Another replica may lead now: stop at once rather than race it (as
          // controller-runtime does); the Deployment restarts us as a candidate.
          std::cerr << "hydra-controller: lost the leader lease; exiting\n";
          g_stop = true;
        });
    elector->Start();
    std::cout << "hydra-controller: " << identity << " waiting for the lease " << lease_ns << "/"
              << lease_name << "\n"
              << std::flush;
  } else {
    metrics.SetLeader(true);
  }

  hydra::controller::Manager manager(kube->get(), &reconciler, &metrics, Split(namespaces), workers,
                                     &leading);
  manager.Start();
  std::cout << "hydra-controller " << HYDRA_VERSION << ": watching MultiModelJobs in "
            << (namespaces.empty() ? "all namespaces" : namespaces) << ", shared agent pool "
            << (prometheus_url.empty() ? std::string("off (no --prometheus-url)")
                                       : "from " + prometheus_url)
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
