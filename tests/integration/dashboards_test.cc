// The Grafana dashboards (dashboards/*.json) and alert rules (dashboards/hydra-alerts.rules.yaml)
// against the real processes: every PromQL expression parses with Prometheus's own parser
// (tests/promql), the rule file passes promtool, and every metric name they use is one that a
// running hydra-agent or hydra-controller exports (or a named dcgm-exporter metric, or `up`);
// then every expression runs on a real Prometheus scraping both, and the panels that must show
// something for a trained job do.
//
// With HYDRA_RENDER_DASHBOARD=out.png (dashboards/render/capture.sh sets it) the test instead
// trains a 4-trial job on two agents for a few minutes, stops one agent half way (a lost node:
// its trials restart on the other from their checkpoints), and draws the job dashboard from the
// scraped data with dashboards/render.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "agent/metrics/metric_names.h"
#include "tests/fakes/agent_process.h"
#include "tests/fakes/control_plane.h"
#include "tests/fakes/control_plane_test.h"

namespace {

namespace fs = std::filesystem;
using hydra::fakes::Eventually;
using hydra::fakes::Proc;
using hydra::fakes::Sh;
using Json = nlohmann::json;

const std::string kSource = HYDRA_SOURCE_DIR;
const std::string kBinary = HYDRA_BINARY_DIR;

/// Metrics the dashboards may use that Hydra does not export: dcgm-exporter's (on GPU nodes)
/// and Prometheus's own `up`.
const std::set<std::string> kForeign = {"DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED",
                                        "DCGM_FI_DEV_GPU_UTIL", "up"};
/// Hydra's series that only an agent with GPUs exports (the test's agents train on CPUs).
const std::set<std::string> kGpuOnly = {hydra::agent::metric_names::kGpuAllocatorAllocatedBytes,
                                        hydra::agent::metric_names::kGpuAllocatorReservedBytes};

/// A series name as the dashboards compare it: a histogram's series by the histogram's name.
std::string BaseName(const std::string& name) {
  for (const std::string s : {"_bucket", "_sum", "_count"}) {
    if (name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0) {
      return name.substr(0, name.size() - s.size());
    }
  }
  return name;
}

/// The metric names of a text exposition: its `# TYPE` lines and its samples.
std::set<std::string> ExportedNames(const std::string& exposition) {
  std::set<std::string> names;
  std::istringstream lines(exposition);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("# TYPE ", 0) == 0) {
      std::istringstream words(line.substr(7));
      std::string name;
      words >> name;
      names.insert(BaseName(name));
    } else if (!line.empty() && line[0] != '#') {
      names.insert(BaseName(line.substr(0, line.find_first_of("{ "))));
    }
  }
  return names;
}

std::string Join(const std::set<std::string>& s) {
  std::string out;
  for (const auto& x : s) out += (out.empty() ? "" : ", ") + x;
  return out;
}

/// URL-encodes a query parameter.
std::string Encode(const std::string& s) {
  std::string out;
  char buf[4];
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      std::snprintf(buf, sizeof(buf), "%%%02X", c);
      out += buf;
    }
  }
  return out;
}

class DashboardsTest : public hydra::fakes::ControlPlaneTest {
 protected:
  static void SetUpTestSuite() { StartSuite("dashboards"); }
};

const std::vector<std::string> kFiles = {"dashboards/hydra-job.json", "dashboards/hydra-node.json",
                                         "dashboards/hydra-controller.json",
                                         "dashboards/hydra-alerts.rules.yaml"};

std::string Files() {
  std::string out;
  for (const auto& f : kFiles) out += " " + kSource + "/" + f;
  return out;
}

/// Steps of the (slow, pictured) render job: enough for a few minutes of curves.
const char* kRenderJob = R"(apiVersion: hydra.dev/v1alpha1
kind: MultiModelJob
metadata: {name: gpt2-sweep}
spec:
  model: {family: gpt2, nLayer: 4, nEmbd: 128, nHead: 4, contextLength: 128, vocabSize: 256}
  dataset: {format: text, path: data/corpus.txt, validationFraction: 0.05}
  search:
    grid:
      learningRate: [1.0e-3, 3.0e-4]
      batchSize: [8, 16]
  training: {steps: 100, batchSize: 8, seed: 1, evalEverySteps: 20, checkpointEverySteps: 20}
  resources: {deviceMemoryBudget: 48Mi, offload: disk}
)";

TEST_F(DashboardsTest, EveryQueryParsesAndUsesOnlyMetricsTheProcessesExport) {
  const char* render_to = std::getenv("HYDRA_RENDER_DASHBOARD");
  const bool render = render_to != nullptr && *render_to != '\0';

  // 1. Every expression parses (Prometheus's parser), and the rule file passes promtool.
  auto [brc, lint] = Sh(kSource + "/tests/promql/build 2>/dev/null");
  ASSERT_EQ(brc, 0) << lint;
  // The path is the build's last line (a first build may print more before it).
  lint = lint.substr(0, lint.find_last_not_of("\n") + 1);
  lint = lint.substr(lint.find_last_of('\n') + 1);
  auto [lrc, used_text] = Sh(lint + " -names" + Files());
  ASSERT_EQ(lrc, 0) << used_text;
  std::set<std::string> used;
  {
    std::istringstream lines(used_text);
    for (std::string l; std::getline(lines, l);) {
      if (!l.empty()) used.insert(l);
    }
  }
  EXPECT_GE(used.size(), 20u) << used_text;
  auto [prc, promtool] =
      Sh("promtool check rules " + kSource + "/dashboards/hydra-alerts.rules.yaml");
  EXPECT_EQ(prc, 0) << promtool;
  EXPECT_THAT(promtool, ::testing::HasSubstr("SUCCESS"));

  // 2. The real processes: agents, the controller, and Prometheus scraping them all.
  const fs::path work = dir_ / "dashboards";
  fs::create_directories(work / "data");
  fs::create_directories(work / "ckpt");
  fs::copy_file(kSource + "/examples/data/corpus.txt", work / "data" / "corpus.txt");
  std::vector<hydra::fakes::AgentProcess> agents;
  Proc prometheus, controller;
  // Stops the processes however the test ends (an ASSERT returns early).
  struct Cleanup {
    std::function<void()> f;
    ~Cleanup() { f(); }
  } cleanup{[&] {
    for (auto& a : agents) hydra::fakes::Stop(a.proc, SIGKILL, std::chrono::seconds(5));
    hydra::fakes::Stop(controller, SIGTERM, std::chrono::seconds(10));
    hydra::fakes::Stop(prometheus, SIGTERM, std::chrono::seconds(10));
  }};
  for (int i = 0; i < (render ? 2 : 1); ++i) {
    agents.push_back(hydra::fakes::StartAgentProcess(std::string("node-") + char('a' + i),
                                                     "cpu:1,budget=768Mi", work, work / "data",
                                                     work / "ckpt"));
    ASSERT_GT(agents.back().proc.pid, 0);
  }
  const int controller_port = hydra::fakes::FreePort();
  std::vector<std::string> targets;
  for (const auto& a : agents) targets.push_back("127.0.0.1:" + std::to_string(a.metrics));
  targets.push_back("127.0.0.1:" + std::to_string(controller_port));
  int prom_port = 0;
  prometheus = hydra::fakes::StartPrometheus(work, targets, &prom_port);
  const std::string prom = "http://127.0.0.1:" + std::to_string(prom_port);
  auto query = [&](const std::string& expr) {
    auto [rc, body] =
        Sh("curl -s --max-time 10 '" + prom + "/api/v1/query?query=" + Encode(expr) + "'");
    Json j = Json::parse(body, nullptr, false);
    return rc == 0 && !j.is_discarded() ? j : Json{{"status", "curl failed"}, {"body", body}};
  };
  ASSERT_TRUE(Eventually(
      [&] {
        Json j = query("count(hydra_device_memory_free_bytes)");
        return j["status"] == "success" && j["data"]["result"].size() == 1 &&
               j["data"]["result"][0]["value"][1] == std::to_string(agents.size());
      },
      60))
      << "targets: " << Sh("curl -s --max-time 10 '" + prom + "/api/v1/targets'").second
      << "\nagent log: " << hydra::fakes::Slurp(agents.front().proc.out_path)
      << "\nprometheus log: " << hydra::fakes::Slurp((work / "prometheus.log").string());
  controller = hydra::fakes::Start(
      kBinary + "/controller/hydra-controller",
      {"--prometheus-url", prom, "--data-root", work.string(), "--checkpoint-root",
       (work / "ckpt").string(), "--metrics-bind-address",
       "127.0.0.1:" + std::to_string(controller_port), "--health-probe-bind-address", "0",
       "--resync-seconds", "1", "--inventory-seconds", "1"},
      (work / "controller.log").string());

  // 3. One job, trained to the end, so per-trial series exist.
  const std::string job_name = render ? "gpt2-sweep" : "tiny-sweep";
  const fs::path manifest = work / "job.yaml";
  if (render) {
    std::ofstream(manifest) << kRenderJob;
  } else {
    // The example, its shards spilled to disk (so the spill counters have series).
    std::string m = hydra::fakes::Slurp(kSource + "/examples/tiny-sweep.yaml");
    const std::string from = "resources: {deviceMemoryBudget: 256Mi}";
    ASSERT_NE(m.find(from), std::string::npos);
    m.replace(m.find(from), from.size(), "resources: {deviceMemoryBudget: 2Mi, offload: disk}");
    std::ofstream(manifest) << m;
  }
  const std::time_t start = std::time(nullptr);
  auto [arc, aout] = Sh("kubectl apply -f " + manifest.string());
  ASSERT_EQ(arc, 0) << aout;
  auto complete = [&] {
    auto [rc, text] = Sh("kubectl get mmj " + job_name + " -o json");
    Json job = Json::parse(text, nullptr, false);
    if (rc != 0 || job.is_discarded() || !job.contains("status")) return false;
    for (const auto& c : job["status"].value("conditions", Json::array())) {
      if (c["type"] == "Complete" && c["status"] == "True") return true;
    }
    return false;
  };
  if (render) {
    // Half way, node-b goes away: its trials are restarted on node-a (a preemption).
    ASSERT_TRUE(Eventually(
        [&] {
          Json j = query("max(hydra_trial_step{job=\"gpt2-sweep\", node=\"node-b\"})");
          return j["status"] == "success" && !j["data"]["result"].empty() &&
                 std::stod(j["data"]["result"][0]["value"][1].get<std::string>()) >= 40;
        },
        600))
        << hydra::fakes::Slurp(controller.out_path);
    hydra::fakes::Stop(agents[1].proc, SIGKILL, std::chrono::seconds(5));
  }
  ASSERT_TRUE(Eventually(complete, render ? 1200 : 240))
      << Sh("kubectl get mmj " + job_name + " -o yaml").second
      << hydra::fakes::Slurp(controller.out_path);
  // Two more scrapes after the end, so the last values are in Prometheus.
  std::this_thread::sleep_for(std::chrono::seconds(3));

  // 4. The names the dashboards and alerts use are the names the processes export.
  std::set<std::string> exported;
  std::vector<std::string> endpoints = {"127.0.0.1:" + std::to_string(controller_port)};
  endpoints.push_back("127.0.0.1:" + std::to_string(agents[0].metrics));
  for (const auto& ep : endpoints) {
    auto [rc, body] = Sh("curl -s --max-time 10 http://" + ep + "/metrics");
    ASSERT_EQ(rc, 0) << ep;
    const auto names = ExportedNames(body);
    EXPECT_FALSE(names.empty()) << ep << ":\n" << body;
    exported.insert(names.begin(), names.end());
  }
  std::set<std::string> unknown;
  for (const auto& n : used) {
    if (exported.count(n) || kForeign.count(n) || kGpuOnly.count(n)) continue;
    unknown.insert(n);
  }
  EXPECT_TRUE(unknown.empty()) << "used by a dashboard or alert but exported by neither process: "
                               << Join(unknown) << "\nexported: " << Join(exported);
  // And the other way round: every Hydra metric is on some dashboard or alert.
  std::set<std::string> unused;
  for (const auto& n : exported) {
    if (n.rfind("hydra_", 0) == 0 && !used.count(n)) unused.insert(n);
  }
  EXPECT_TRUE(unused.empty()) << "exported but on no dashboard or alert: " << Join(unused);

  // 5. Every expression runs on Prometheus; the job's panels show the job.
  auto [erc, exprs] = Sh(lint + " -exprs" + Files());
  ASSERT_EQ(erc, 0) << exprs;
  std::istringstream lines(exprs);
  int ran = 0;
  for (std::string l; std::getline(lines, l);) {
    if (l.empty()) continue;
    const Json e = Json::parse(l);
    const std::string expr = e["expr"],
                      where = e["file"].get<std::string>() + ": " + e["where"].get<std::string>();
    const Json r = query(expr);
    ++ran;
    EXPECT_EQ(r["status"], "success") << where << "\n" << expr << "\n" << r.dump();
    // Series that exist only on GPU nodes or after a failure may be empty; alerts are quiet.
    bool may_be_empty = e["file"].get<std::string>().find(".rules.yaml") != std::string::npos;
    for (const auto& n : e["names"]) {
      const std::string name = n;
      may_be_empty |= kForeign.count(name) > 0 || kGpuOnly.count(name) > 0;
    }
    if (!may_be_empty) {
      EXPECT_FALSE(r["data"]["result"].empty()) << where << " shows nothing\n" << expr;
    }
  }
  EXPECT_GE(ran, 30);
  // The best-trial table names one of the job's trials.
  const Json best = query("bottomk(1, min by (namespace, job, trial) (hydra_trial_loss{job=\"" +
                          job_name + "\", split=\"validation\"}))");
  ASSERT_EQ(best["data"]["result"].size(), 1u) << best.dump();
  EXPECT_THAT(best["data"]["result"][0]["metric"]["trial"].get<std::string>(),
              ::testing::StartsWith(job_name));

  if (render) {
    const std::time_t end = std::time(nullptr);
    auto [rrc, rout] =
        Sh(kSource + "/dashboards/render/render -dashboard " + kSource +
           "/dashboards/hydra-job.json -prometheus " + prom + " -start " +
           std::to_string(start - 20) + " -end " + std::to_string(end) +
           " -scrape-interval 1s -var namespace=default -var job=" + job_name + " -o " + render_to);
    EXPECT_EQ(rrc, 0) << rout;
    std::fprintf(stderr, "%s", rout.c_str());
  }
}

}  // namespace
