// Job-owned agent pods end to end (issue 20): the real kube-apiserver, kube-scheduler and
// kube-controller-manager's garbage collector (tests/envtest), a test kubelet that runs a real
// hydra-agent for every pod bound to its nodes, each in its own network namespace, and adds
// nodes while pods are Pending (tests/kubelet), real Kueue (tests/kueue), and hydra-controller
// with TLS for the pods (each job its own certificate) and no Prometheus.
//
//   * A spot pool that scales from zero: a job with minAgents 0 applied with kubectl; its pods
//     are Pending (Unschedulable) until nodes are added; trials run; the idle pod goes in the
//     tail; a node reclaimed mid-run, its pod replaced, the trial resumes; every trial ends
//     with the losses of an undisturbed `hydra run`; no pod is left; a second job in another
//     namespace never shares an agent with the first.
//   * Kueue: a ClusterQueue with quota for one agent admits one pod and the job trains on it;
//     raising the quota admits another, which gets a trial; with zero quota a job stays Queued.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "tests/fakes/control_plane.h"
#include "tests/fakes/subprocess.h"
#include "tests/fakes/test_certs.h"

namespace {

namespace fs = std::filesystem;
using hydra::fakes::Eventually;
using hydra::fakes::Proc;
using hydra::fakes::Sh;
using hydra::fakes::Slurp;
using ::testing::HasSubstr;
using Json = nlohmann::json;

const std::string kSource = HYDRA_SOURCE_DIR;
const std::string kBinary = HYDRA_BINARY_DIR;

/// `kubectl <args> -o json`, parsed (null when it fails).
Json Kubectl(const std::string& args) {
  auto [rc, out] = Sh("kubectl " + args + " -o json");
  if (rc != 0) return Json();
  Json j = Json::parse(out, nullptr, false);
  return j.is_discarded() ? Json() : j;
}

/// The condition `type` of a job's status (an empty object if absent).
/// The job's status; empty before the controller first writes it (or when the job is gone).
Json StatusOf(const Json& job) {
  return job.is_object() ? job.value("status", Json::object()) : Json::object();
}

Json Condition(const Json& job, const std::string& type) {
  for (const auto& c : StatusOf(job).value("conditions", Json::array())) {
    if (c.value("type", "") == type) return c;
  }
  return Json::object();
}

bool IsTrue(const Json& job, const std::string& type) {
  return Condition(job, type).value("status", "") == "True";
}

/// A job's trial entry by name (an empty object if absent).
Json TrialOf(const Json& job, const std::string& name) {
  for (const auto& t : StatusOf(job).value("trials", Json::array())) {
    if (t.value("name", "") == name) return t;
  }
  return Json::object();
}

/// The job's agent pods (its uid label), as the API server lists them.
Json PodsOf(const std::string& ns, const std::string& job) {
  Json pods = Kubectl("get pods -n " + ns + " -l hydra.dev/job=" + job);
  return pods.is_null() ? Json::array() : pods.value("items", Json::array());
}

class AgentPodsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("hydra-envtest-pods-" + std::to_string(::getpid()));
    const std::string error =
        hydra::fakes::StartControlPlaneWithCrd(dir_, "--with-scheduler --with-controller-manager");
    ok_ = error.empty() && hydra::fakes::MakeTestCertificates(dir_ / "certs");
    if (!error.empty()) std::fprintf(stderr, "%s\n", error.c_str());
    auto [rc, out] = Sh(kSource + "/tests/kubelet/build");
    kubelet_bin_ = out.substr(out.find_last_of('\n', out.size() - 2) + 1);
    while (!kubelet_bin_.empty() && std::isspace(kubelet_bin_.back())) kubelet_bin_.pop_back();
    ok_ = ok_ && rc == 0;
  }
  static void TearDownTestSuite() { hydra::fakes::StopControlPlane(dir_); }

  void SetUp() override {
    ASSERT_TRUE(ok_) << "the control plane, the test kubelet or the certificates are missing";
    work_ = dir_ / ::testing::UnitTest::GetInstance()->current_test_info()->name();
    for (const char* d : {"data", "ckpt", "pods", "spill", "tls-mount"}) {
      fs::create_directories(work_ / d);
    }
    fs::copy_file(kSource + "/examples/data/corpus.txt", work_ / "data" / "corpus.txt",
                  fs::copy_options::overwrite_existing);
  }
  void TearDown() override {
    hydra::fakes::Stop(controller_, SIGTERM, std::chrono::seconds(10));
    hydra::fakes::Stop(kubelet_, SIGTERM, std::chrono::seconds(10));
    // Its Nodes stay "Ready" (no node lifecycle controller runs): the next test's pods must not
    // be bound to them.
    Sh("kubectl delete nodes --all --wait=false");
    // HYDRA_KEEP_TEST_FILES=1 keeps them after a pass too (to compare with a failure).
    if (::testing::Test::HasFailure() || std::getenv("HYDRA_KEEP_TEST_FILES") != nullptr) {
      Sh("kubectl get pods -A -o wide > " + (work_ / "pods.txt").string());
      Sh("kubectl get pods,workloads,events -A -o yaml > " + (work_ / "objects.yaml").string());
      // The control plane's directory goes with the suite: keep this test's files.
      const fs::path keep =
          fs::temp_directory_path() /
          ("hydra-agent-pods-" + std::to_string(::getpid()) + "-" + work_.filename().string());
      fs::copy(work_, keep, fs::copy_options::recursive | fs::copy_options::skip_symlinks);
      std::printf("--- kept %s\n", keep.c_str());
      std::printf("--- controller log (tail)\n%s\n", Tail(work_ / "controller.log").c_str());
      std::printf("--- kubelet log (tail)\n%s\n", Tail(work_ / "kubelet.log").c_str());
      std::printf("--- pods\n%s\n", Slurp((work_ / "pods.txt").string()).c_str());
    }
    // A test that failed may leave jobs that the next test's controller would reconcile, with
    // their pods' dead addresses: they go, their finalizers with them (no controller runs now
    // to remove those), and so do their agent pods.
    Sh("kubectl delete mmj --all -A --wait=false");
    Sh("kubectl get mmj -A -o jsonpath='{range .items[*]}{.metadata.namespace} "
       "{.metadata.name}{\"\\n\"}{end}' | while read -r ns name; do kubectl patch mmj -n \"$ns\" "
       "\"$name\" --type=merge -p '{\"metadata\":{\"finalizers\":null}}'; done");
    Sh("kubectl delete pods -A -l hydra.dev/job --force --grace-period=0 --wait=false");
  }

  /// Waits up to `seconds` for the job's condition `type` to be True; `job` is the last read.
  bool AwaitCondition(const std::string& ns, const std::string& name, const std::string& type,
                      int seconds, Json* job) {
    return Eventually(
        [&] {
          *job = Kubectl("get mmj " + name + " -n " + ns);
          return IsTrue(*job, type);
        },
        seconds);
  }

  /// What a failed wait prints: the job's status in brief (not its spec), and the controller's
  /// last lines; CI shows only the start of a failure's output.
  std::string Brief(const Json& job) {
    std::ostringstream o;
    if (!job.is_object()) return "the job is gone";
    const Json st = StatusOf(job);
    const Json meta = job.value("metadata", Json::object());
    o << meta.value("namespace", "") << "/" << meta.value("name", "") << ": running "
      << st.value("running", 0) << ", succeeded " << st.value("succeeded", 0) << ", agents "
      << st.value("agents", Json::object()).dump() << "\n";
    for (const auto& c : st.value("conditions", Json::array())) {
      o << "  " << c.value("type", "") << "=" << c.value("status", "") << " "
        << c.value("reason", "") << ": " << c.value("message", "") << "\n";
    }
    for (const auto& t : st.value("trials", Json::array())) {
      o << "  trial " << t.value("name", "") << " " << t.value("state", "") << " step "
        << t.value("step", 0) << " on " << t.value("agentEndpoint", "-") << ": "
        << t.value("message", "") << "\n";
    }
    const std::string log = Slurp((work_ / "controller.log").string());
    o << "controller log (end):\n" << log.substr(log.size() > 2500 ? log.size() - 2500 : 0);
    return o.str();
  }

  static std::string Tail(const fs::path& f) {
    const std::string s = Slurp(f.string());
    return s.size() > 6000 ? s.substr(s.size() - 6000) : s;
  }

  /// The test kubelet: nodes of one GPU, added while pods are Pending (up to `max_nodes`).
  void StartKubelet(const std::vector<std::string>& nodes, int max_nodes) {
    std::vector<std::string> args = {"--autoscale-max-nodes",
                                     std::to_string(max_nodes),
                                     "--autoscale-gpus",
                                     "1",
                                     "--binary",
                                     "hydra-agent=" + kBinary + "/agent/hydra-agent",
                                     "--log-dir",
                                     (work_ / "pods").string()};
    for (const auto& n : nodes) args.insert(args.end(), {"--node", n + "=1"});
    kubelet_ =
        hydra::fakes::Start(kubelet_bin_ + "/test-kubelet", args, (work_ / "kubelet.log").string());
    ASSERT_GT(kubelet_.pid, 0);
    std::ofstream(dir_ / "kubelet.pid") << kubelet_.pid;  // tests/envtest/down stops it too
  }

  /// hydra-controller with no Prometheus (no shared pool) and TLS for job agents: the test CA
  /// signs each job's certificate, the controller shows the agents its client certificate.
  void StartController() {
    const fs::path certs = dir_ / "certs";
    controller_ = hydra::fakes::Start(kBinary + "/controller/hydra-controller",
                                      {"--data-root",
                                       work_.string(),
                                       "--checkpoint-root",
                                       (work_ / "ckpt").string(),
                                       "--metrics-bind-address",
                                       "0",
                                       "--health-probe-bind-address",
                                       "0",
                                       "--resync-seconds",
                                       "0.5",
                                       "--agent-lost-seconds",
                                       "5",
                                       "--agent-pod-ca-cert-file",
                                       (certs / "ca.pem").string(),
                                       "--agent-pod-ca-key-file",
                                       (certs / "ca.key").string(),
                                       "--agent-tls-cert-file",
                                       (certs / "controller.pem").string(),
                                       "--agent-tls-key-file",
                                       (certs / "controller.key").string(),
                                       "--agent-pod-tls-dir",
                                       (work_ / "tls-mount").string()},
                                      (work_ / "controller.log").string());
    ASSERT_GT(controller_.pid, 0);
  }

  /// A job of the tiny GPT-2 in namespace `ns` with its own agents; `search` and the extra
  /// metadata as given. Written to <work>/<name>.yaml; returns the path.
  std::string Manifest(const std::string& ns, const std::string& name, const std::string& search,
                       int64_t steps, int max_agents, const std::string& labels = "{}") {
    std::ostringstream m;
    const std::string w = work_.string();
    m << "apiVersion: hydra.dev/v1alpha1\nkind: MultiModelJob\n"
      << "metadata: {name: " << name << ", namespace: " << ns << ", labels: " << labels << "}\n"
      << "spec:\n"
      << "  model: {family: gpt2, nLayer: 2, nEmbd: 64, nHead: 2, contextLength: 64, "
         "vocabSize: 256}\n"
      << "  dataset: {format: text, path: data/corpus.txt}\n"
      << "  search: " << search << "\n"
      << "  training: {steps: " << steps
      << ", batchSize: 4, seed: 7, evalEverySteps: 250, checkpointEverySteps: 50}\n"
      << "  resources: {deviceMemoryBudget: 256Mi}\n"
      << "  agents:\n    minAgents: 0\n    maxAgents: " << max_agents << "\n"
      << "    template:\n      spec:\n        terminationGracePeriodSeconds: 10\n"
      << "        containers:\n        - name: agent\n          image: hydra:test\n"
      << "          args: [--devices=cpu:1, --threads=1, '--spill-dir=" << w
      << "/spill/$(POD_NAME)', --shutdown-linger-seconds=1]\n"
      << "          resources: {limits: {nvidia.com/gpu: 1}}\n"
      << "          volumeMounts: [{name: work, mountPath: " << w << "}]\n"
      << "        volumes: [{name: work, hostPath: {path: " << w << "}}]\n";
    const fs::path path = work_ / (name + ".yaml");
    std::ofstream(path) << m.str();
    return path.string();
  }

  /// The undisturbed run of a manifest: trial name -> its results.json entry. In the
  /// environment the test kubelet gives the agents (PATH and HOME only): variables such as
  /// OPENBLAS_CORETYPE choose other GEMM kernels, and float results are bit-identical only
  /// under the same ones.
  std::map<std::string, Json> Reference(const std::string& manifest, const std::string& out) {
    const char* path = std::getenv("PATH");
    const char* home = std::getenv("HOME");
    auto [rc, text] =
        Sh("env -i PATH='" + std::string(path ? path : "/usr/bin:/bin") + "' HOME='" +
           std::string(home ? home : "/") + "' " + kBinary + "/cli/hydra run " + manifest + " -o " +
           (work_ / out).string() + " --threads 2 --devices cpu:2 --progress quiet");
    EXPECT_EQ(rc, 0) << text;
    std::map<std::string, Json> ref;
    const Json r = Json::parse(Slurp((work_ / out / "results.json").string()), nullptr, false);
    if (r.is_discarded()) return ref;
    for (const auto& t : r["trials"]) ref[t["name"]] = t;
    return ref;
  }

  static void ExpectReferenceLosses(const Json& job, const std::map<std::string, Json>& ref) {
    for (const auto& t : StatusOf(job).value("trials", Json::array())) {
      const std::string name = t["name"];
      SCOPED_TRACE(name);
      EXPECT_EQ(t["state"], "Succeeded");
      ASSERT_TRUE(ref.count(name));
      EXPECT_EQ(t["validationLoss"].get<double>(), ref.at(name)["finalValLoss"].get<double>());
      EXPECT_EQ(t["trainLoss"].get<double>(), ref.at(name)["trainLoss"].back()[1].get<double>());
    }
  }

  static inline fs::path dir_;
  static inline bool ok_ = false;
  static inline std::string kubelet_bin_;
  fs::path work_;
  Proc kubelet_, controller_;
};

/// Watches every job's trials and pods: a trial placed on an agent whose pod is not of its own
/// job (by namespace, job and pod IP) is recorded as a violation.
class IsolationWatch {
 public:
  IsolationWatch() : thread_([this] { Run(); }) {}
  ~IsolationWatch() {
    stop_ = true;
    thread_.join();
  }
  std::vector<std::string> violations() {
    std::lock_guard<std::mutex> lock(mu_);
    return violations_;
  }
  int checked() const { return checked_; }

 private:
  void Run() {
    while (!stop_) {
      const Json pods = Kubectl("get pods -A -l hydra.dev/job");
      const Json jobs = Kubectl("get mmj -A");
      if (!pods.is_null() && !jobs.is_null()) Check(pods, jobs);
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
    }
  }
  void Check(const Json& pods, const Json& jobs) {
    std::map<std::string, std::string> owner;  // pod IP -> namespace/job
    for (const auto& p : pods["items"]) {
      const std::string ip = p["status"].value("podIP", "");
      if (!ip.empty()) {
        owner[ip] = p["metadata"]["namespace"].get<std::string>() + "/" +
                    p["metadata"]["labels"]["hydra.dev/job"].get<std::string>();
      }
    }
    for (const auto& j : jobs["items"]) {
      const std::string me = j["metadata"]["namespace"].get<std::string>() + "/" +
                             j["metadata"]["name"].get<std::string>();
      for (const auto& t : j.value("status", Json::object()).value("trials", Json::array())) {
        const std::string ep = t.value("agentEndpoint", "");
        if (ep.empty()) continue;
        const std::string ip = ep.substr(0, ep.rfind(':'));
        ++checked_;
        auto it = owner.find(ip);
        if (it != owner.end() && it->second != me) {
          std::lock_guard<std::mutex> lock(mu_);
          violations_.push_back(me + " trial " + t.value("name", "") + " on " + it->second +
                                "'s agent " + ep);
        }
      }
    }
  }
  std::atomic<bool> stop_{false};
  std::atomic<int> checked_{0};
  std::mutex mu_;
  std::vector<std::string> violations_;
  std::thread thread_;
};

TEST_F(AgentPodsTest, ASpotPoolScalesFromZeroSurvivesAReclaimAndLeavesNoPod) {
  // Two trials of 300 and 3000 steps (seconds each) on at most two agents (the short one's
  // agent goes in the tail), and a job of one trial in another namespace at the same time.
  const std::string spot =
      Manifest("team-a", "spot", "{grid: {steps: [300, 3000]}}", 3000, /*max_agents=*/2);
  const std::string solo = Manifest("team-b", "solo", "{}", 600, /*max_agents=*/1);
  const auto ref_spot = Reference(spot, "ref-spot");
  const auto ref_solo = Reference(solo, "ref-solo");
  ASSERT_EQ(ref_spot.size(), 2u);
  // The example of docs/install.md is what the API server takes.
  auto [xrc, xout] =
      Sh("kubectl apply --dry-run=server -f " + kSource + "/examples/spot-agents.yaml");
  EXPECT_EQ(xrc, 0) << xout;
  StartKubelet({}, /*max_nodes=*/4);  // no node at all: the pool is at zero
  StartController();
  for (const char* ns : {"team-a", "team-b"}) Sh(std::string("kubectl create namespace ") + ns);
  IsolationWatch isolation;
  for (const auto& m : {spot, solo}) {
    auto [rc, out] = Sh("kubectl apply -f " + m);
    ASSERT_EQ(rc, 0) << out;
  }

  // Pending and Unschedulable first (no node yet); nodes are added for them; they run.
  bool unschedulable = false;
  ASSERT_TRUE(Eventually(
      [&] {
        for (const auto& p : PodsOf("team-a", "spot")) {
          for (const auto& c : p["status"].value("conditions", Json::array())) {
            unschedulable = unschedulable || c.value("reason", "") == "Unschedulable";
          }
        }
        return unschedulable;
      },
      30))
      << "no agent pod of spot was seen Unschedulable";
  Json job;
  ASSERT_TRUE(Eventually(
      [&] {
        job = Kubectl("get mmj spot -n team-a");
        return StatusOf(job).value("running", 0) == 2;
      },
      90))
      << Brief(job);
  EXPECT_EQ(job["status"]["agents"]["desired"], 2);
  EXPECT_GE(Kubectl("get nodes")["items"].size(), 2u) << "nodes were added for the pods";
  // Each pod serves only its job, over TLS with the job's own certificate.
  for (const auto& p : PodsOf("team-a", "spot")) {
    const auto args = p["spec"]["containers"][0]["args"].get<std::vector<std::string>>();
    EXPECT_THAT(args, ::testing::Contains("--dedicated-job=team-a/spot/" +
                                          job["metadata"]["uid"].get<std::string>()));
  }
  EXPECT_FALSE(Kubectl("get secret spot-agent-tls -n team-a").is_null());
  EXPECT_THAT(Slurp((work_ / "pods" / "team-a_spot-agent-0_agent.log").string()),
              HasSubstr("mutual TLS"));

  // The tail: the short trial ends, its idle agent goes while the long one trains on.
  ASSERT_TRUE(Eventually(
      [&] {
        job = Kubectl("get mmj spot -n team-a");
        return StatusOf(job).value("agents", Json::object()).value("pods", 0) == 1 &&
               StatusOf(job).value("succeeded", 0) == 1;
      },
      60))
      << Brief(job);
  auto [erc, events] = Sh("kubectl get events -n team-a --field-selector reason=AgentPodsDeleted");
  EXPECT_THAT(events, HasSubstr("the job's remaining trials need 1 of them"));

  // A spot reclaim of the long trial's node once it has a checkpoint.
  const std::string long_trial = "spot-steps3000";
  std::string node;
  int64_t at_step = 0;
  ASSERT_TRUE(Eventually(
      [&] {
        job = Kubectl("get mmj spot -n team-a");
        const Json t = TrialOf(job, long_trial);
        at_step = t.value("lastCheckpoint", Json::object()).value("step", 0);
        if (t.value("state", "") != "Running" || at_step < 100) return false;
        for (const auto& p : PodsOf("team-a", "spot")) {
          if (t.value("agentEndpoint", "").rfind(p["status"].value("podIP", "?") + ":", 0) == 0) {
            node = p["spec"].value("nodeName", "");
          }
        }
        return !node.empty();
      },
      90))
      << Brief(job);
  ASSERT_LT(at_step, 3000) << "the trial ended before the reclaim";
  auto [drc, dout] = Sh("kubectl delete node " + node + " --wait=false");
  ASSERT_EQ(drc, 0) << dout;

  // Its pod is replaced on a new node and the trial resumes there; both jobs end.
  ASSERT_TRUE(AwaitCondition("team-a", "spot", "Complete", 240, &job)) << Brief(job);
  const Json t = TrialOf(job, long_trial);
  EXPECT_EQ(t["restarts"], 1) << "moved once, by the reclaim";
  ExpectReferenceLosses(job, ref_spot);
  Json solo_job;
  ASSERT_TRUE(AwaitCondition("team-b", "solo", "Complete", 120, &solo_job)) << Brief(solo_job);
  ExpectReferenceLosses(solo_job, ref_solo);
  // The controller saw the reclaimed pod failed or already gone, and moved the trial at once.
  auto [qrc, requeued] =
      Sh("kubectl get events -n team-a --field-selector reason=TrialRequeued -o "
         "jsonpath='{.items[*].message}'");
  EXPECT_THAT(requeued, ::testing::ContainsRegex(long_trial + ": agent " + node +
                                                 " lost \\(its agent pod (is gone|.* failed)"));

  // No pod is left; deleting the jobs deletes their certificates.
  EXPECT_TRUE(Eventually(
      [&] { return PodsOf("team-a", "spot").empty() && PodsOf("team-b", "solo").empty(); }, 60))
      << Kubectl("get pods -A").dump(2);
  EXPECT_GT(isolation.checked(), 0);
  EXPECT_TRUE(isolation.violations().empty()) << ::testing::PrintToString(isolation.violations());
  Sh("kubectl delete mmj spot -n team-a --wait=true --timeout=60s");
  Sh("kubectl delete mmj solo -n team-b --wait=true --timeout=60s");
  EXPECT_TRUE(
      Eventually([&] { return Kubectl("get secret spot-agent-tls -n team-a").is_null(); }, 30));
}

TEST_F(AgentPodsTest, KueueAdmitsAgentPodsAsItsQuotaAllows) {
  auto [urc, uout] = Sh(kSource + "/tests/kueue/up");
  ASSERT_EQ(urc, 0) << uout;
  StartKubelet({"n1", "n2", "n3"}, /*max_nodes=*/0);
  StartController();
  const auto queue = [&](const std::string& ns, const std::string& name, int gpus) {
    std::ostringstream y;
    y << "apiVersion: kueue.x-k8s.io/v1beta1\nkind: ClusterQueue\nmetadata: {name: " << name
      << "}\nspec:\n  namespaceSelector: {}\n  resourceGroups:\n"
      << "  - coveredResources: [nvidia.com/gpu]\n    flavors:\n    - name: default\n"
      << "      resources: [{name: nvidia.com/gpu, nominalQuota: " << gpus << "}]\n---\n"
      << "apiVersion: kueue.x-k8s.io/v1beta1\nkind: LocalQueue\nmetadata: {name: " << name
      << ", namespace: " << ns << "}\nspec: {clusterQueue: " << name << "}\n";
    std::ofstream(work_ / ("queue-" + name + ".yaml")) << y.str();
    return Sh("kubectl apply -f " + (work_ / ("queue-" + name + ".yaml")).string());
  };
  for (const char* ns : {"team-q", "team-z"}) Sh(std::string("kubectl create namespace ") + ns);
  std::ofstream(work_ / "flavor.yaml")
      << "apiVersion: kueue.x-k8s.io/v1beta1\nkind: ResourceFlavor\nmetadata: {name: default}\n";
  ASSERT_EQ(Sh("kubectl apply -f " + (work_ / "flavor.yaml").string()).first, 0);
  ASSERT_EQ(queue("team-q", "gpus", 1).first, 0);
  ASSERT_EQ(queue("team-z", "none", 0).first, 0);
  // Trials of 5000 steps (about 20 s each here) outlast an admitted pod's start by far: the
  // second agent must find one still waiting (1500 steps, 7 s, did not always).
  const std::string sweep =
      Manifest("team-q", "sweep", "{grid: {learningRate: [1.0e-3, 2.0e-3, 3.0e-3]}}", 5000, 3,
               "{kueue.x-k8s.io/queue-name: gpus}");
  const std::string starved =
      Manifest("team-z", "starved", "{}", 50, 1, "{kueue.x-k8s.io/queue-name: none}");
  const auto ref = Reference(sweep, "ref-sweep");
  for (const auto& m : {sweep, starved}) {
    auto [rc, out] = Sh("kubectl apply -f " + m);
    ASSERT_EQ(rc, 0) << out;
  }

  // Quota for one agent: one pod admitted, the job trains there; the others wait, gated.
  Json job;
  ASSERT_TRUE(Eventually(
      [&] {
        job = Kubectl("get mmj sweep -n team-q");
        return StatusOf(job).value("running", 0) == 1 &&
               StatusOf(job).value("agents", Json::object()).value("gated", 0) == 2;
      },
      90))
      << Brief(job);
  EXPECT_EQ(job["status"]["agents"]["pods"], 3);
  EXPECT_FALSE(IsTrue(job, "Queued"));
  EXPECT_EQ(Condition(job, "Queued")["message"], "1 of 3 agent pods admitted");
  for (const auto& p : PodsOf("team-q", "sweep")) {
    EXPECT_EQ(p["metadata"]["labels"]["kueue.x-k8s.io/queue-name"], "gpus");
  }
  // Zero quota: the other job stays Queued, its pod gated.
  Json starved_job;
  ASSERT_TRUE(AwaitCondition("team-z", "starved", "Queued", 30, &starved_job))
      << Brief(starved_job);
  EXPECT_EQ(Condition(starved_job, "Queued")["reason"], "AwaitingAdmission");
  EXPECT_THAT(Condition(starved_job, "Queued")["message"].get<std::string>(),
              HasSubstr("queue none"));

  // More quota: a second pod is admitted, serves and gets a trial of its own.
  ASSERT_EQ(queue("team-q", "gpus", 2).first, 0);
  std::set<std::string> agents;
  ASSERT_TRUE(Eventually(
      [&] {
        job = Kubectl("get mmj sweep -n team-q");
        for (const auto& t : StatusOf(job).value("trials", Json::array())) {
          if (t.value("state", "") == "Running") agents.insert(t.value("agentEndpoint", ""));
        }
        return agents.size() >= 2;
      },
      90))
      << Brief(job);
  ASSERT_TRUE(AwaitCondition("team-q", "sweep", "Complete", 240, &job)) << Brief(job);
  ExpectReferenceLosses(job, ref);
  EXPECT_TRUE(Eventually([&] { return PodsOf("team-q", "sweep").empty(); }, 60));
  // Kueue let go of the pods: their Workloads were collected with them.
  EXPECT_TRUE(Eventually(
      [&] {
        const Json w = Kubectl("get workloads -n team-q");
        return !w.is_null() && w["items"].empty();
      },
      60))
      << Kubectl("get workloads -n team-q").dump(2);
  EXPECT_TRUE(IsTrue(Kubectl("get mmj starved -n team-z"), "Queued"));
}

}  // namespace
