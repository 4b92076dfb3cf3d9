// bench/controller: hydra-controller against the real Kubernetes test control plane
// (tests/envtest) with agents faked at the gRPC boundary. N MultiModelJobs of 8 trials are
// created at once; measured: time from a job's create to all its trials assigned (p50, p99),
// API requests the controller made per job, and the controller's resident memory.
// --agent-pods: the jobs bring their own agents (spec.agents, maxAgents 8, a GPU each, TLS);
// measured: time from a job's create to its first agent pod and to all 8 (no scheduler runs:
// the pods stay Pending), and the controller's API requests per job until then.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <map>
#include <mutex>
#include <thread>

#include "common/process_memory.h"
#include "common/units.h"
#include "controller/agents/agent_certs.h"
#include "controller/kube/kube_client.h"
#include "controller/kube/kube_config.h"
#include "controller/kube/watcher.h"
#include "controller/reconciler/manager.h"
#include "controller/reconciler/reconciler.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using hydra::kube::Json;
namespace v1 = ::hydra::agent::v1;
using hydra::controller::kMultiModelJobs;

/// Agents that accept every assignment and report every assigned trial as running.
class FakeAgents : public hydra::controller::AgentPoolInterface,
                   public hydra::controller::InventorySourceInterface {
 public:
  explicit FakeAgents(int agents) {
    for (int i = 0; i < agents; ++i) {
      hydra::controller::AgentInventory a;
      a.node = "node-" + std::to_string(i);
      a.endpoint = a.node + ":9443";
      for (int d = 0; d < 4; ++d) {
        hydra::controller::DeviceInventory dev;
        dev.name = "cuda:" + std::to_string(d);
        dev.total_bytes = dev.free_bytes = int64_t{16} << 30;
        a.devices.push_back(dev);
      }
      inventory_.push_back(a);
    }
  }
  hydra::Status Assign(const std::string& endpoint, const v1::AssignTrialRequest& request,
                       v1::AssignTrialResponse*) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto& t = trials_[endpoint][request.trial().namespace_() + "/" + request.trial().name()];
    t.set_name(request.trial().name());
    t.set_job(request.trial().job());
    t.set_namespace_(request.trial().namespace_());
    t.set_job_uid(request.trial().job_uid());
    t.set_attempt(request.attempt());
    t.set_state(v1::RUNNING);
    t.set_steps(request.trial().training().steps());
    t.set_last_checkpoint_step(-1);
    auto& job = assigned_[request.trial().namespace_() + "/" + request.trial().job()];
    if (++job.first == 8) job.second = Clock::now();
    return hydra::OkStatus();
  }
  hydra::Status Cancel(const std::string&, const v1::TrialRef&, bool) override {
    return hydra::OkStatus();
  }
  hydra::Status Suspend(const std::string&, const v1::TrialRef&) override {
    return hydra::OkStatus();
  }
  hydra::Status Limit(const std::string&, const v1::LimitTrialRequest&) override {
    return hydra::OkStatus();
  }
  hydra::StatusOr<v1::GetStatusResponse> LastStatus(const std::string& endpoint) override {
    std::lock_guard<std::mutex> lock(mu_);
    v1::GetStatusResponse r;
    // What a real agent answers: the node and devices Prometheus reports for it.
    for (const auto& a : inventory_) {
      if (a.endpoint != endpoint) continue;
      r.set_node_name(a.node);
      for (const auto& d : a.devices) {
        auto* dev = r.add_devices();
        dev->set_name(d.name);
        dev->set_memory_total_bytes(d.total_bytes);
        dev->set_memory_free_bytes(d.free_bytes);
      }
    }
    for (const auto& [name, t] : trials_[endpoint]) *r.add_trials() = t;
    return r;
  }
  void Track(const std::vector<std::string>&) override {}
  void Forget(const std::vector<std::string>&) override {}
  hydra::StatusOr<v1::GetStatusResponse> FreshStatus(const std::string& endpoint) override {
    return LastStatus(endpoint);
  }
  double SecondsSinceContact(const std::string&) override { return 0; }
  bool FirstAnswerDue(const std::string&) override { return false; }
  void SetServerName(const std::string&, const std::string&) override {}
  hydra::StatusOr<std::vector<hydra::controller::AgentInventory>> Inventory() override {
    return inventory_;
  }
  /// Jobs with all 8 trials assigned, and when that happened.
  std::map<std::string, Clock::time_point> Done() {
    std::lock_guard<std::mutex> lock(mu_);
    std::map<std::string, Clock::time_point> out;
    for (const auto& [k, v] : assigned_) {
      if (v.first >= 8) out[k] = v.second;
    }
    return out;
  }

 private:
  std::vector<hydra::controller::AgentInventory> inventory_;
  std::mutex mu_;
  std::map<std::string, std::map<std::string, v1::TrialStatus>> trials_;
  std::map<std::string, std::pair<int, Clock::time_point>> assigned_;
};

Json Job(const std::string& name, bool agent_pods) {
  Json job = {{"apiVersion", "hydra.dev/v1alpha1"},
              {"kind", "MultiModelJob"},
              {"metadata", {{"name", name}}},
              {"spec",
               {{"model",
                 {{"family", "gpt2"},
                  {"nLayer", 12},
                  {"nEmbd", 768},
                  {"nHead", 12},
                  {"contextLength", 1024},
                  {"vocabSize", 50257}}},
                {"dataset", {{"path", "data/corpus.txt"}, {"format", "tokens-u16"}}},
                {"search",
                 {{"grid", {{"learningRate", {1e-4, 3e-4, 1e-3, 3e-3}}, {"batchSize", {8, 16}}}}}},
                {"training", {{"steps", 1000}}}}}};
  if (agent_pods) {
    job["spec"]["agents"] = {
        {"maxAgents", 8},
        {"template",
         {{"spec",
           {{"containers",
             Json::array({{{"name", "agent"},
                           {"image", "registry.example.com/hydra:0.1.0"},
                           {"resources", {{"limits", {{"nvidia.com/gpu", 1}}}}}}})}}}}}};
  }
  return job;
}

/// When each job's agent pods appeared: the first and the eighth, by "namespace/job".
class PodClock {
 public:
  void Seen(const std::string& type, const Json& pod) {
    if (type != "ADDED") return;
    const std::string job =
        pod["metadata"]["namespace"].get<std::string>() + "/" +
        pod["metadata"].value("labels", Json::object()).value("hydra.dev/job", "?");
    std::lock_guard<std::mutex> lock(mu_);
    auto& j = jobs_[job];
    if (++j.pods == 1) j.first = Clock::now();
    if (j.pods == 8) j.all = Clock::now();
  }
  struct Times {
    int pods = 0;
    Clock::time_point first, all;
  };
  std::map<std::string, Times> jobs() {
    std::lock_guard<std::mutex> lock(mu_);
    return jobs_;
  }
  int complete() {
    std::lock_guard<std::mutex> lock(mu_);
    int n = 0;
    for (const auto& [k, t] : jobs_) n += t.pods >= 8;
    return n;
  }

 private:
  std::mutex mu_;
  std::map<std::string, Times> jobs_;
};

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1,
                    static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5))];
}

int Sh(const std::string& cmd) { return std::system(cmd.c_str()); }

/// The agents' CA for --agent-pods (openssl, into `dir`), as the controller would load it.
std::shared_ptr<const hydra::controller::CertificateAuthority> MakeCa(const fs::path& dir) {
  const std::string d = dir.string();
  if (Sh("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj "
         "/CN=bench-ca -keyout " +
         d + "/ca.key -out " + d + "/ca.pem 2>/dev/null") != 0) {
    return nullptr;
  }
  auto ca = hydra::controller::LoadCertificateAuthority(d + "/ca.pem", d + "/ca.key");
  if (!ca.ok()) return nullptr;
  return std::make_shared<hydra::controller::CertificateAuthority>(*ca);
}

double Seconds(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

/// --agent-pods: every job's 8 agent pods created (or the time is up), then the numbers.
bool ReportAgentPods(PodClock& pods, const std::map<std::string, Clock::time_point>& created,
                     int jobs, Clock::time_point t0, int64_t requests) {
  std::vector<double> first, all;
  for (const auto& [job, t] : pods.jobs()) {
    auto it = created.find(job);
    if (it == created.end()) continue;
    first.push_back(Seconds(it->second, t.first));
    if (t.pods >= 8) all.push_back(Seconds(it->second, t.all));
  }
  std::printf("create -> first agent pod: p50 %.3f s, p99 %.3f s, max %.3f s (%zu jobs)\n",
              Percentile(first, 0.5), Percentile(first, 0.99), Percentile(first, 1.0),
              first.size());
  std::printf("create -> all 8 agent pods: p50 %.3f s, p99 %.3f s, max %.3f s (%zu jobs)\n",
              Percentile(all, 0.5), Percentile(all, 0.99), Percentile(all, 1.0), all.size());
  std::printf(
      "every job's pods created after %.2f s; controller API requests: %lld in all, "
      "%.1f per job\n",
      Seconds(t0, Clock::now()), static_cast<long long>(requests),
      static_cast<double>(requests) / jobs);
  return static_cast<int>(all.size()) == jobs;
}

/// The shared pool: every job's 8 trials assigned, then the numbers.
bool ReportAssignments(FakeAgents& fake, const std::map<std::string, Clock::time_point>& created,
                       int jobs, Clock::time_point t0, int64_t requests) {
  const auto done = fake.Done();
  std::vector<double> latencies;
  for (const auto& [key, at] : done) {
    auto it = created.find(key);
    if (it != created.end()) latencies.push_back(Seconds(it->second, at));
  }
  std::printf("all assigned after %.2f s\n", Seconds(t0, Clock::now()));
  std::printf("create -> all 8 trials assigned: p50 %.3f s, p99 %.3f s, max %.3f s (%zu jobs)\n",
              Percentile(latencies, 0.5), Percentile(latencies, 0.99), Percentile(latencies, 1.0),
              latencies.size());
  std::printf("controller API requests: %lld in all, %.1f per job (until all were assigned)\n",
              static_cast<long long>(requests), static_cast<double>(requests) / jobs);
  return static_cast<int>(latencies.size()) == jobs;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"hydra-controller on the real control plane: N jobs x 8 trials at once"};
  int jobs = 200, agents = 16, workers = 2;
  bool smoke = false, agent_pods = false;
  app.add_option("--jobs", jobs)->capture_default_str();
  app.add_option("--agents", agents, "fake agents of 4 x 16 GiB devices")->capture_default_str();
  app.add_option("--workers", workers, "reconcile workers")->capture_default_str();
  app.add_flag("--agent-pods", agent_pods,
               "jobs with spec.agents: time to their agent pods (with TLS: each job's "
               "certificate issued)");
  app.add_flag("--smoke", smoke, "5 jobs, to check that it runs");
  CLI11_PARSE(app, argc, argv);
  if (smoke) jobs = 5;

  const std::string src = HYDRA_SOURCE_DIR;
  const fs::path dir =
      fs::temp_directory_path() / ("hydra-envtest-bench-" + std::to_string(getpid()));
  if (Sh(src + "/tests/envtest/up --dir " + dir.string() + " > /dev/null") != 0) {
    std::fprintf(stderr, "the test control plane did not start\n");
    return 1;
  }
  int rc = 0;
  {
    auto config = hydra::kube::LoadKubeconfig((dir / "kubeconfig").string());
    auto user = hydra::kube::KubeClient::Create(*config);        // the bench's own requests
    auto controller = hydra::kube::KubeClient::Create(*config);  // the controller's, counted
    if (!user.ok() || !controller.ok()) return 1;
    Sh("KUBECONFIG=" + (dir / "kubeconfig").string() + " kubectl apply -f " + src +
       "/crds/multimodeljob.yaml > /dev/null && KUBECONFIG=" + (dir / "kubeconfig").string() +
       " kubectl wait --for=condition=Established crd/multimodeljobs.hydra.dev > /dev/null");
    (void)(*user)->Create(
        hydra::kube::kNamespaces, "",
        {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", "bench"}}}});

    FakeAgents fake(agents);
    hydra::controller::ReconcilerOptions ro;
    ro.data_root = "/data";
    ro.checkpoint_root = "/checkpoints";
    if (agent_pods) {
      ro.agent_pod_ca = MakeCa(dir);
      if (!ro.agent_pod_ca) {
        std::fprintf(stderr, "could not make the agents' CA with openssl\n");
        return 1;
      }
    }
    hydra::controller::Reconciler reconciler(controller->get(), &fake, &fake, ro);
    hydra::controller::Manager manager(controller->get(), &reconciler, nullptr, {"bench"}, workers,
                                       nullptr);
    PodClock pods;
    hydra::kube::Watcher pod_watch(
        user->get(), hydra::kube::kPods, "bench",
        [&](const std::string& type, const Json& pod) { pods.Seen(type, pod); });
    if (agent_pods) pod_watch.Start();
    hydra::ResidentPeakSampler peak(std::chrono::milliseconds(20));
    const int64_t rss_before = hydra::ResidentBytes();
    manager.Start();
    while (!manager.synced()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    const int64_t requests_before = (*controller)->requests();

    // All jobs at once (4 client threads).
    std::map<std::string, Clock::time_point> created;
    std::mutex mu;
    std::vector<std::thread> creators;
    const auto t0 = Clock::now();
    for (int c = 0; c < 4; ++c) {
      creators.emplace_back([&, c] {
        for (int i = c; i < jobs; i += 4) {
          const std::string name = "job-" + std::to_string(i);
          auto r = (*user)->Create(kMultiModelJobs, "bench", Job(name, agent_pods));
          std::lock_guard<std::mutex> lock(mu);
          if (!r.ok()) {
            std::fprintf(stderr, "create %s: %s\n", name.c_str(), r.status().ToString().c_str());
          } else {
            created["bench/" + name] = Clock::now();
          }
        }
      });
    }
    for (auto& t : creators) t.join();
    std::printf("%d jobs x 8 trials (%d trials) created in %.2f s; %s, %d workers\n", jobs,
                jobs * 8, Seconds(t0, Clock::now()),
                agent_pods ? "each with its own agent pods (spec.agents, TLS)"
                           : ("on " + std::to_string(agents) + " fake agents").c_str(),
                workers);
    const auto finished = [&] {
      return agent_pods ? pods.complete() >= jobs : static_cast<int>(fake.Done().size()) >= jobs;
    };
    const auto give_up = Clock::now() + std::chrono::minutes(10);
    while (!finished() && Clock::now() < give_up) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    const int64_t requests = (*controller)->requests() - requests_before;
    const int64_t rss = hydra::ResidentBytes();
    manager.Stop();
    pod_watch.Stop();
    const bool ok = agent_pods ? ReportAgentPods(pods, created, jobs, t0, requests)
                               : ReportAssignments(fake, created, jobs, t0, requests);
    std::printf(
        "resident memory of the bench process (controller + client): %s before, %s after, %s "
        "peak\n",
        hydra::FormatBytes(rss_before).c_str(), hydra::FormatBytes(rss).c_str(),
        hydra::FormatBytes(peak.peak()).c_str());
    if (!ok) {
      std::fprintf(stderr, "not every job got there within 10 minutes\n");
      rc = 1;
    }
  }
  Sh(src + "/tests/envtest/down --dir " + dir.string() + " 2> /dev/null");
  return rc;
}
