#pragma once

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/fakes/subprocess.h"

/// Real hydra-agent and Prometheus processes for integration and end-to-end tests.
namespace hydra::fakes {

struct AgentProcess {
  std::string node;
  int grpc = 0, metrics = 0, health = 0;
  Proc proc;
  std::string endpoint() const { return "127.0.0.1:" + std::to_string(grpc); }
};

/// Starts build/agent/hydra-agent on free loopback ports and waits until it serves metrics; its
/// log is `work/<node>.log`. It advertises its bind address (the default for a concrete
/// address), which the controller then dials. A port picked free can be taken by another
/// process (a parallel test's client) before the agent binds it; an agent that exits while
/// starting is started again on fresh ports, up to 5 times, each attempt's log kept as
/// `work/<node>.<attempt>.log`. The returned pid is -1 if no attempt came up. `extra_args`
/// (flags the others do not set) follow them.
inline AgentProcess StartAgentProcess(const std::string& node, const std::string& devices,
                                      const std::filesystem::path& work,
                                      const std::filesystem::path& data_root,
                                      const std::filesystem::path& checkpoint_root,
                                      const std::vector<std::string>& extra_args = {}) {
  const std::string log = (work / (node + ".log")).string();
  for (int attempt = 1;; ++attempt) {
    AgentProcess a;
    a.node = node;
    a.grpc = FreePort();
    a.metrics = FreePort();
    a.health = FreePort();
    std::vector<std::string> args = {"--node-name",
                                     node,
                                     "--grpc-bind-address",
                                     a.endpoint(),
                                     "--metrics-bind-address",
                                     "127.0.0.1:" + std::to_string(a.metrics),
                                     "--health-probe-bind-address",
                                     "127.0.0.1:" + std::to_string(a.health),
                                     "--devices",
                                     devices,
                                     "--threads",
                                     "1",
                                     "--data-root",
                                     data_root.string(),
                                     "--checkpoint-root",
                                     checkpoint_root.string(),
                                     "--spill-dir",
                                     (work / ("spill-" + node)).string()};
    args.insert(args.end(), extra_args.begin(), extra_args.end());
    a.proc = Start(std::string(HYDRA_BINARY_DIR) + "/agent/hydra-agent", args, log);
    if (a.proc.pid <= 0) return a;
    int code = -1;  // stays -1 while the agent runs
    if (WaitForOutput(a.proc, "/metrics, probes on", std::chrono::seconds(60), &code)) return a;
    std::filesystem::copy_file(log, work / (node + "." + std::to_string(attempt) + ".log"),
                               std::filesystem::copy_options::overwrite_existing);
    if (code < 0) Stop(a.proc, SIGKILL, std::chrono::seconds(5));  // still starting after 60 s
    if (code < 0 || attempt == 5) {
      a.proc.pid = -1;
      return a;
    }
  }
}

/// Starts Debian's Prometheus on a free port scraping `targets` ("host:port" of /metrics) every
/// second as scrape job hydra-agent, with honor_labels as the chart's ServiceMonitor sets it.
/// `other_targets`, if any, are scraped as an unrelated job "other" (honor_labels false), as a
/// cluster's Prometheus scrapes every other pod. Returns the process; `port` receives its port.
/// Its log is `work/prometheus.log`.
inline Proc StartPrometheus(const std::filesystem::path& work,
                            const std::vector<std::string>& targets, int* port,
                            const std::vector<std::string>& other_targets = {}) {
  *port = FreePort();
  std::ofstream cfg(work / "prometheus.yml");
  cfg << "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
      << "scrape_configs:\n  - job_name: hydra-agent\n    honor_labels: true\n"
      << "    static_configs:\n      - targets: [";
  for (size_t i = 0; i < targets.size(); ++i) cfg << (i ? ", " : "") << "'" << targets[i] << "'";
  cfg << "]\n";
  if (!other_targets.empty()) {
    cfg << "  - job_name: other\n    static_configs:\n      - targets: [";
    for (size_t i = 0; i < other_targets.size(); ++i) {
      cfg << (i ? ", " : "") << "'" << other_targets[i] << "'";
    }
    cfg << "]\n";
  }
  cfg.close();
  return Start("/usr/bin/prometheus",
               {"--config.file=" + (work / "prometheus.yml").string(),
                "--storage.tsdb.path=" + (work / "prom").string(),
                "--web.listen-address=127.0.0.1:" + std::to_string(*port)},
               (work / "prometheus.log").string());
}

/// The same, scraping agents on loopback.
inline Proc StartPrometheus(const std::filesystem::path& work,
                            const std::vector<AgentProcess>& agents, int* port) {
  std::vector<std::string> targets;
  for (const auto& a : agents) targets.push_back("127.0.0.1:" + std::to_string(a.metrics));
  return StartPrometheus(work, targets, port);
}

}  // namespace hydra::fakes
