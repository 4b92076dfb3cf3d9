// End to end on a real control plane (tests/envtest), a real Prometheus and two hydra-agent
// processes with CPU devices: kubectl apply the CRD and an example job, the controller places
// and follows the trials, kubectl delete cancels them; two controller replicas elect one
// leader; and the API server itself rejects invalid manifests by the CRD's schema and CEL rules.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "hydra/agent/v1/agent.grpc.pb.h"
#include "tests/fakes/agent_process.h"
#include "tests/fakes/control_plane.h"
#include "tests/fakes/control_plane_test.h"

namespace {

namespace fs = std::filesystem;
namespace v1 = ::hydra::agent::v1;
using hydra::fakes::Proc;
using ::testing::HasSubstr;
using ::testing::Not;
using Json = nlohmann::json;

const std::string kSource = HYDRA_SOURCE_DIR;
const std::string kBinary = HYDRA_BINARY_DIR;

using hydra::fakes::Eventually;
using hydra::fakes::Sh;

class ControllerE2eTest : public hydra::fakes::ControlPlaneTest {
 protected:
  static void SetUpTestSuite() { StartSuite("e2e"); }
};

/// kubectl apply of a manifest given as text.
std::pair<int, std::string> Apply(const std::string& yaml, const fs::path& dir) {
  const fs::path f = dir / "manifest.yaml";
  std::ofstream(f) << yaml;
  return Sh("kubectl apply -f " + f.string());
}

const char* kValid = R"(apiVersion: hydra.dev/v1alpha1
kind: MultiModelJob
metadata: {name: NAME}
spec:
  model: {family: gpt2, nLayer: 2, nEmbd: 32, nHead: 2, contextLength: 32}
  dataset: {path: data/corpus.txt}
  search: {grid: {learningRate: [0.001, 0.002]}}
  training: {steps: 10, batchSize: 8}
)";

std::string Manifest(const std::string& name, const std::string& from, const std::string& to) {
  std::string m = kValid;
  m.replace(m.find("NAME"), 4, name);
  if (!from.empty()) {
    const auto at = m.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    m.replace(at, from.size(), to);
  }
  return m;
}

TEST_F(ControllerE2eTest, TheApiServerRejectsInvalidManifestsWithTheRulesMessage) {
  struct Case {
    std::string what, from, to, message;
  };
  const std::vector<Case> cases = {
      {"missing family", "family: gpt2, ", "", "family: Required value"},
      {"unknown family", "family: gpt2", "family: rnn", "Unsupported value: \"rnn\""},
      {"no layers", "nLayer: 2", "nLayer: 0", "should be greater than or equal to 1"},
      {"negative learning rate", "search: {grid: {learningRate: [0.001, 0.002]}}",
       "search: {}\n  # none", ""},  // placeholder replaced below
      {"nHead does not divide nEmbd", "nHead: 2", "nHead: 3",
       "spec.model.nHead must divide spec.model.nEmbd"},
      {"accumulation does not divide the batch", "batchSize: 8",
       "batchSize: 8, gradientAccumulationSteps: 3", "must divide spec.training.batchSize"},
      {"warm-up longer than training", "steps: 10", "steps: 10, warmupSteps: 11",
       "warmupSteps must be <= spec.training.steps"},
      {"grid searches an unknown field", "learningRate: [0.001, 0.002]", "dropout: [0.1]",
       "unknown field \"spec.search.grid.dropout\""},
      {"empty grid axis", "learningRate: [0.001, 0.002]", "learningRate: []",
       "should have at least 1 items"},
      {"unknown dataset format", "path: data/corpus.txt", "path: data/corpus.txt, format: csv",
       "Unsupported value: \"csv\""},
      {"validation fraction out of range", "path: data/corpus.txt",
       "path: data/corpus.txt, validationFraction: 1.5", "must be > 0 and < 1"},
      {"device budget not a quantity", "training: {steps: 10, batchSize: 8}",
       "training: {steps: 10, batchSize: 8}\n  resources: {deviceMemoryBudget: lots}",
       "deviceMemoryBudget"},
      {"shard boundaries not increasing", "training: {steps: 10, batchSize: 8}",
       "training: {steps: 10, batchSize: 8}\n  resources: {shardBoundaries: [3, 2]}",
       "shard boundaries must be increasing"},
      {"shard boundary repeated", "training: {steps: 10, batchSize: 8}",
       "training: {steps: 10, batchSize: 8}\n  resources: {shardBoundaries: [1, 1]}",
       "Duplicate value: 1"},
      {"vocabulary too small for text", "contextLength: 32", "contextLength: 32, vocabSize: 100",
       "vocabSize must be >= 256 for the text format"},
      {"image classifier on a text corpus", "family: gpt2", "family: mlp",
       "families mlp and resnet classify images and need spec.dataset.format images-u8"},
      {"image shape on a text corpus", "path: data/corpus.txt",
       "path: data/corpus.txt, imageShape: [3, 8, 8]", "imageShape is only for format images-u8"},
      {"missing steps", "training: {steps: 10, batchSize: 8}", "training: {batchSize: 8}",
       "steps: Required value"},
      {"unknown field", "training: {steps: 10, batchSize: 8}",
       "training: {steps: 10, batchSize: 8, dropout: 0.1}", "unknown field"},
      {"unknown retention", "training: {steps: 10, batchSize: 8}",
       "training: {steps: 10, batchSize: 8}\n  checkpointRetention: Sometimes",
       "Unsupported value: \"Sometimes\""},
  };
  int rejected = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    Case c = cases[i];
    if (c.what == "negative learning rate") {
      c = {"negative learning rate", "batchSize: 8}", "batchSize: 8, learningRate: -0.5}",
           "must be > 0 and <= 10"};
    }
    auto [rc, out] = Apply(Manifest("bad-" + std::to_string(i), c.from, c.to), dir_);
    EXPECT_NE(rc, 0) << c.what << " was accepted";
    EXPECT_THAT(out, HasSubstr(c.message)) << c.what;
    rejected += rc != 0;
  }
  EXPECT_GE(rejected, 12);
  // Every example is a valid MultiModelJob for the API server too.
  for (const auto& e : fs::recursive_directory_iterator(kSource + "/examples")) {
    if (e.path().extension() != ".yaml") continue;
    auto [erc, eout] = Sh("kubectl apply --dry-run=server -f " + e.path().string());
    EXPECT_EQ(erc, 0) << e.path() << ": " << eout;
  }
  // Increasing boundaries are fine, one or several.
  for (const std::string b : {"[1]", "[1, 2]", "[1, 3, 4]"}) {
    auto [brc, bout] = Apply(Manifest("bounds", "training: {steps: 10, batchSize: 8}",
                                      "training: {steps: 10, batchSize: 8}\n  resources: "
                                      "{shardBoundaries: " +
                                          b + "}"),
                             dir_);
    EXPECT_EQ(brc, 0) << b << ": " << bout;
    Sh("kubectl delete mmj bounds --wait=true");
  }
  // A running job's spec cannot change.
  ASSERT_EQ(Apply(Manifest("immutable", "", ""), dir_).first, 0);
  auto [rc, out] = Apply(Manifest("immutable", "steps: 10", "steps: 20"), dir_);
  EXPECT_NE(rc, 0);
  EXPECT_THAT(out, HasSubstr("cannot change once the job exists"));
  Sh("kubectl delete mmj immutable --wait=false");
}

using Agent = hydra::fakes::AgentProcess;

TEST_F(ControllerE2eTest, ApplyTrainsEveryTrialDeleteCancelsAndOneReplicaLeads) {
  const fs::path work = dir_ / "e2e";
  fs::create_directories(work / "data");
  fs::create_directories(work / "ckpt");
  fs::copy_file(kSource + "/examples/data/corpus.txt", work / "data" / "corpus.txt");

  std::vector<Agent> agents;
  for (const char* node : {"node-a", "node-b"}) {
    agents.push_back(hydra::fakes::StartAgentProcess(node, "cpu:1,budget=512Mi", work,
                                                     work / "data", work / "ckpt"));
    ASSERT_GT(agents.back().proc.pid, 0);
  }
  int prom_port = 0;
  Proc prometheus = hydra::fakes::StartPrometheus(work, agents, &prom_port);
  // Both agents visible in Prometheus before the job arrives, so placement sees them both.
  ASSERT_TRUE(Eventually(
      [&] {
        auto [rc, body] = Sh("curl -s 'http://127.0.0.1:" + std::to_string(prom_port) +
                             "/api/v1/query?query=count(hydra_device_memory_free_bytes)'");
        auto j = Json::parse(body, nullptr, false);
        return rc == 0 && !j.is_discarded() && j["data"]["result"].size() == 1 &&
               j["data"]["result"][0]["value"][1] == "2";
      },
      60))
      << hydra::fakes::Slurp((work / "prometheus.log").string());
  auto controller = [&](const std::string& id) {
    return hydra::fakes::Start(
        kBinary + "/controller/hydra-controller",
        {"--prometheus-url", "http://127.0.0.1:" + std::to_string(prom_port), "--data-root",
         work.string(), "--checkpoint-root", (work / "ckpt").string(), "--leader-elect",
         "--leader-election-namespace", "default", "--identity", id, "--metrics-bind-address", "0",
         "--health-probe-bind-address", "0", "--resync-seconds", "1", "--inventory-seconds", "1"},
        (work / (id + ".log")).string());
  };
  Proc c1 = controller("replica-1");
  ASSERT_TRUE(Eventually(
      [&] { return hydra::fakes::Slurp(c1.out_path).find("is the leader") != std::string::npos; },
      60))
      << hydra::fakes::Slurp(c1.out_path);
  Proc c2 = controller("replica-2");
  auto cleanup = [&] {
    for (auto& a : agents) hydra::fakes::Stop(a.proc, SIGKILL, std::chrono::seconds(5));
    hydra::fakes::Stop(c1, SIGKILL, std::chrono::seconds(5));
    hydra::fakes::Stop(c2, SIGKILL, std::chrono::seconds(5));
    hydra::fakes::Stop(prometheus, SIGTERM, std::chrono::seconds(10));
  };

  // kubectl apply the example: every trial trains to the end.
  auto [rc, out] = Sh("kubectl apply -f " + kSource + "/examples/tiny-sweep.yaml");
  ASSERT_EQ(rc, 0) << out;
  Json job;
  ASSERT_TRUE(hydra::fakes::WaitJobComplete("tiny-sweep", 240, &job))
      << job.dump(2) << "\n"
      << hydra::fakes::Slurp(c1.out_path);
  const auto& st = job["status"];
  EXPECT_EQ(st["trialCount"], 2);
  EXPECT_EQ(st["succeeded"], 2);
  EXPECT_EQ(st["observedGeneration"], job["metadata"]["generation"]);
  ASSERT_EQ(st["trials"].size(), 2u);
  std::set<std::string> nodes;
  for (const auto& t : st["trials"]) {
    EXPECT_EQ(t["state"], "Succeeded") << t.dump();
    EXPECT_EQ(t["step"], 40);
    EXPECT_GT(t["validationLoss"].get<double>(), 0.5);
    EXPECT_EQ(t["lastCheckpoint"]["step"], 40);
    EXPECT_FALSE(t["shardPlan"]["shards"].empty());
    nodes.insert(t["agent"].get<std::string>());
  }
  EXPECT_EQ(nodes.size(), 2u) << "the two trials went to the two agents (most free capacity)";
  EXPECT_TRUE(st["bestTrial"].contains("validationLoss"));
  EXPECT_FALSE(st.value("startTime", "").empty());
  EXPECT_FALSE(st.value("completionTime", "").empty());
  auto table = Sh("kubectl get mmj");
  EXPECT_THAT(table.second, HasSubstr("TRIALS"));
  EXPECT_THAT(table.second, HasSubstr("BEST-VAL-LOSS"));
  EXPECT_THAT(table.second, HasSubstr("tiny-sweep"));
  auto events = Sh("kubectl get events --field-selector involvedObject.name=tiny-sweep");
  EXPECT_THAT(events.second, HasSubstr("TrialAssigned"));
  EXPECT_THAT(events.second, HasSubstr("JobComplete"));

  // A model brought as TorchScript: the agents load it from the shared data root, plan its
  // shards themselves and write its trained weights for Python next to its checkpoints.
  auto exported =
      Sh("/usr/bin/python3 " + kSource + "/examples/torchscript/export_gpt.py --out " +
         (work / "data" / "gpt.pt").string() + " --layers 1 --width 32 --heads 2 --context 32");
  ASSERT_EQ(exported.first, 0) << exported.second;
  const std::string ts_job = R"(apiVersion: hydra.dev/v1alpha1
kind: MultiModelJob
metadata: {name: ts-e2e}
spec:
  model: {family: torchscript, path: data/gpt.pt, contextLength: 32, vocabSize: 256}
  dataset: {path: data/corpus.txt}
  search: {grid: {learningRate: [1.0e-3, 2.0e-3]}}
  training: {steps: 20, batchSize: 4, evalEverySteps: 10, checkpointEverySteps: 10}
  resources: {shardBoundaries: [1, 2]}
)";
  ASSERT_EQ(Apply(ts_job, work).first, 0);
  Json ts;
  ASSERT_TRUE(hydra::fakes::WaitJobComplete("ts-e2e", 180, &ts))
      << ts.dump(2) << "\n"
      << hydra::fakes::Slurp(c1.out_path);
  for (const auto& t : ts["status"]["trials"]) {
    EXPECT_EQ(t["state"], "Succeeded") << t.dump();
    EXPECT_EQ(t["step"], 20);
    EXPECT_TRUE(fs::exists(work / "ckpt" / "default" / "ts-e2e" / t["name"].get<std::string>() /
                           "model.pt"))
        << t["name"];
  }

  // The built-in image classifiers on an images-u8 file: the controller plans their shards
  // from the image shape, the agents check the labels against numClasses and train them.
  auto images = Sh("/usr/bin/python3 " + kSource + "/examples/images/make_shapes.py --images 400 " +
                   "--size 8 --out " + (work / "data" / "shapes.bin").string());
  ASSERT_EQ(images.first, 0) << images.second;
  const std::string image_job = R"(apiVersion: hydra.dev/v1alpha1
kind: MultiModelJob
metadata: {name: images-e2e}
spec:
  model: {family: mlp, nLayer: 2, nEmbd: 32, numClasses: 10}
  dataset: {format: images-u8, path: data/shapes.bin, imageShape: [3, 8, 8], evalSequences: 40}
  search: {grid: {family: [mlp, resnet]}}
  training: {steps: 20, batchSize: 8, evalEverySteps: 10, checkpointEverySteps: 10}
  resources: {deviceMemoryBudget: 64Mi}
)";
  ASSERT_EQ(Apply(image_job, work).first, 0);
  Json im;
  ASSERT_TRUE(hydra::fakes::WaitJobComplete("images-e2e", 180, &im))
      << im.dump(2) << "\n"
      << hydra::fakes::Slurp(c1.out_path);
  ASSERT_EQ(im["status"]["trials"].size(), 2u);
  for (const auto& t : im["status"]["trials"]) {
    EXPECT_EQ(t["state"], "Succeeded") << t.dump();
    EXPECT_EQ(t["step"], 20);
    EXPECT_FALSE(t["shardPlan"]["shards"].empty()) << t.dump();
    EXPECT_LT(t["validationLoss"].get<double>(), 2 * std::log(10.0)) << "diverged: " << t.dump();
  }

  // Only the leader reconciled: the second replica waits for the Lease.
  EXPECT_THAT(hydra::fakes::Slurp(c2.out_path), Not(HasSubstr("is the leader")));
  auto holder =
      Sh("kubectl get lease -n default hydra-controller -o jsonpath={.spec.holderIdentity}");
  EXPECT_EQ(holder.second, "replica-1");

  // A long job, then kubectl delete: its trials are cancelled on the agents and their
  // checkpoints removed (checkpointRetention: Delete), and the finalizer lets the job go.
  std::string long_job = hydra::fakes::Slurp(kSource + "/examples/tiny-sweep.yaml");
  long_job.replace(long_job.find("name: tiny-sweep"), 16, "name: long-sweep");
  long_job.replace(long_job.find("steps: 40"), 9, "steps: 100000");
  ASSERT_EQ(Apply(long_job, work).first, 0);
  auto agent_trials = [&](const Agent& a) {
    auto stub = v1::AgentService::NewStub(
        grpc::CreateChannel(a.endpoint(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    v1::GetStatusResponse resp;
    stub->GetStatus(&ctx, {}, &resp);
    return resp;
  };
  ASSERT_TRUE(Eventually(
      [&] {
        int running = 0;
        for (const auto& a : agents) {
          const auto resp = agent_trials(a);
          for (const auto& t : resp.trials()) {
            running += t.job() == "long-sweep" && t.state() == v1::RUNNING && t.step() > 0;
          }
        }
        return running == 2;
      },
      120))
      << hydra::fakes::Slurp(c1.out_path);
  auto del = Sh("kubectl delete mmj long-sweep --timeout=60s");
  EXPECT_EQ(del.first, 0) << del.second;
  for (const auto& a : agents) {
    const auto resp = agent_trials(a);
    for (const auto& t : resp.trials()) {
      if (t.job() == "long-sweep") {
        EXPECT_EQ(t.state(), v1::CANCELLED) << t.name();
      }
    }
  }
  EXPECT_FALSE(fs::exists(work / "ckpt" / "default" / "long-sweep" / "long-sweep-lr1e-3"))
      << "checkpointRetention: Delete";
  EXPECT_NE(Sh("kubectl get mmj long-sweep").first, 0) << "the finalizer was not removed";

  // The leader stops: the passive replica takes over.
  EXPECT_EQ(hydra::fakes::Stop(c1, SIGTERM), 0);
  EXPECT_TRUE(Eventually(
      [&] { return hydra::fakes::Slurp(c2.out_path).find("is the leader") != std::string::npos; },
      30))
      << hydra::fakes::Slurp(c2.out_path);
  holder = Sh("kubectl get lease -n default hydra-controller -o jsonpath={.spec.holderIdentity}");
  EXPECT_EQ(holder.second, "replica-2");
  cleanup();
}

}  // namespace
