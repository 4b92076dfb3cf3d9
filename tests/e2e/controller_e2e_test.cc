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
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

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
      {"host budget of 8Ei", "training: {steps: 10, batchSize: 8}",
       "training: {steps: 10, batchSize: 8}\n  resources: {hostMemoryBudget: 8Ei}",
       "must be below 2^63 bytes (8Ei)"},
      {"host budget of 2^63 bytes", "training: {steps: 10, batchSize: 8}",
       "training: {steps: 10, batchSize: 8}\n  resources: {hostMemoryBudget: 9223372036854775808}",
       "spec.resources.hostMemoryBudget"},  // past int64: the schema refuses it as a number
      {"device budget of 0", "training: {steps: 10, batchSize: 8}",
       "training: {steps: 10, batchSize: 8}\n  resources: {deviceMemoryBudget: 0}", "must be > 0"},
      {"a grid of 17 x 16 = 272 trials", "learningRate: [0.001, 0.002]",
       "learningRate: [0.001, 0.002, 0.003, 0.004, 0.005, 0.006, 0.007, 0.008, 0.009, 0.01, 0.011, "
       "0.012, 0.013, 0.014, 0.015, 0.016, 0.017], seed: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, "
       "12, 13, 14, 15]",
       "expands to more than 256 trials"},
      {"too many evaluation sequences", "path: data/corpus.txt",
       "path: data/corpus.txt, evalSequences: 65537", "less than or equal to 65536"},
      {"grid and random at once", "search: {grid: {learningRate: [0.001, 0.002]}}",
       "search: {grid: {learningRate: [0.001]}, random: {trials: 2, space: {seed: {choice: [1, "
       "2]}}}}",
       "grid and random are exclusive"},
      {"random draws an unknown field", "search: {grid: {learningRate: [0.001, 0.002]}}",
       "search: {random: {trials: 2, space: {dropout: {uniform: [0.1, 0.2]}}}}",
       "the search may draw only spec.model and spec.training fields"},
      {"random field with two distributions", "search: {grid: {learningRate: [0.001, 0.002]}}",
       "search: {random: {trials: 2, space: {learningRate: {uniform: [0.1, 0.2], choice: "
       "[0.1]}}}}",
       "at most 1"},
      {"asha without minSteps", "search: {grid: {learningRate: [0.001, 0.002]}}",
       "search: {grid: {learningRate: [0.001, 0.002]}, earlyStopping: {algorithm: asha}}",
       "minSteps is required with algorithm asha or median"},
      {"unknown early-stopping algorithm", "search: {grid: {learningRate: [0.001, 0.002]}}",
       "search: {grid: {learningRate: [0.001, 0.002]}, earlyStopping: {algorithm: pbt, "
       "minSteps: 2}}",
       "Unsupported value: \"pbt\""},
      {"init of a torchscript model", "family: gpt2, ",
       "family: torchscript, path: m.pt, init: {path: m.safetensors}, ",
       "only family gpt2 starts from a checkpoint"},
      {"init in another format", "nHead: 2,", "nHead: 2, init: {format: onnx, path: m.onnx},",
       "Unsupported value: \"onnx\""},
      {"more agents kept than allowed", "training: {steps: 10, batchSize: 8}",
       "training: {steps: 10, batchSize: 8}\n  agents: {minAgents: 3, maxAgents: 2, template: "
       "{spec: {containers: [{name: agent, image: hydra}]}}}",
       "spec.agents.minAgents must be <= maxAgents"},
      {"agents without a template", "training: {steps: 10, batchSize: 8}",
       "training: {steps: 10, batchSize: 8}\n  agents: {maxAgents: 2}", "template: Required value"},
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
  EXPECT_GE(rejected, 17);
  // A job's name leaves room for its trials' names (DNS labels of at most 63 characters).
  auto [long_rc, long_out] = Apply(Manifest(std::string(59, 'j'), "", ""), dir_);
  EXPECT_NE(long_rc, 0) << "a 59-character job name was accepted";
  EXPECT_THAT(long_out, HasSubstr("may not be more than 58"));
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
        return hydra::fakes::PrometheusCountIs(prom_port, "hydra_device_memory_free_bytes", 2);
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

  // Early stopping in the cluster: six random trials under ASHA (rungs at steps 5 and 15 of
  // 30). The controller decides over the agents' reports; the agents hold each trial at its
  // rung until it is promoted or stopped.
  const std::string asha_job = R"(apiVersion: hydra.dev/v1alpha1
kind: MultiModelJob
metadata: {name: asha-e2e}
spec:
  model: {family: gpt2, nLayer: 1, nEmbd: 32, nHead: 2, contextLength: 32}
  dataset: {path: data/corpus.txt, evalSequences: 16}
  search:
    random: {trials: 6, seed: 5, space: {learningRate: {logUniform: [1.0e-4, 3.0e-2]}}}
    earlyStopping: {algorithm: asha, metric: validationLoss, minSteps: 5, reductionFactor: 3}
  training: {steps: 30, batchSize: 4, evalEverySteps: 5, checkpointEverySteps: 10}
)";
  ASSERT_EQ(Apply(asha_job, work).first, 0);
  Json asha;
  ASSERT_TRUE(hydra::fakes::WaitJobComplete("asha-e2e", 240, &asha))
      << asha.dump(2) << "\n"
      << hydra::fakes::Slurp(c1.out_path);
  const auto& as = asha["status"];
  int finished = 0, stopped = 0;
  int64_t trained = 0;
  for (const auto& t : as["trials"]) {
    trained += t["step"].get<int64_t>();
    if (t["state"] == "Succeeded") {
      ++finished;
      EXPECT_EQ(t["step"], 30) << t.dump();
      continue;
    }
    ASSERT_EQ(t["state"], "EarlyStopped") << t.dump();
    ++stopped;
    // Stopped at a rung, its checkpoint of that step kept, its message saying why.
    EXPECT_TRUE(t["step"] == 5 || t["step"] == 15) << t.dump();
    EXPECT_EQ(t["lastCheckpoint"]["step"], t["step"]) << t.dump();
    EXPECT_THAT(t.value("message", ""), HasSubstr("asha: stopped at step")) << t.dump();
    EXPECT_TRUE(t.contains("validationLoss")) << t.dump();
  }
  EXPECT_GE(finished, 1);
  EXPECT_GE(stopped, 2) << "of six trials, at most four can pass the first rung";
  EXPECT_EQ(finished + stopped, 6);
  EXPECT_EQ(as["earlyStopped"], stopped);
  EXPECT_EQ(as["succeeded"], finished);
  EXPECT_LT(trained, 6 * 30);
  auto asha_table = Sh("kubectl get mmj asha-e2e");
  EXPECT_THAT(asha_table.second, HasSubstr("STOPPED"));
  auto asha_events = Sh("kubectl get events --field-selector involvedObject.name=asha-e2e");
  EXPECT_THAT(asha_events.second, HasSubstr("TrialEarlyStopped"));
  EXPECT_THAT(asha_events.second, HasSubstr("stopped early"));

  // spec.suspend through kubectl patch: the trials are checkpointed and stopped where they are,
  // wait Interrupted, and resume from those checkpoints once it is false again.
  const std::string susp_job = R"(apiVersion: hydra.dev/v1alpha1
kind: MultiModelJob
metadata: {name: susp-e2e}
spec:
  model: {family: gpt2, nLayer: 1, nEmbd: 32, nHead: 2, contextLength: 32}
  dataset: {path: data/corpus.txt, evalSequences: 8}
  search: {grid: {learningRate: [1.0e-3, 2.0e-3]}}
  training: {steps: 100000, batchSize: 4, checkpointEverySteps: 0}
)";
  ASSERT_EQ(Apply(susp_job, work).first, 0);
  auto trials_of = [](const std::string& job) {
    auto [rc, text] = Sh("kubectl get mmj " + job + " -o json");
    Json j = Json::parse(text, nullptr, false);
    return rc == 0 && !j.is_discarded() ? j["status"].value("trials", Json::array())
                                        : Json::array();
  };
  auto all_trials = [&](const std::string& job, const std::function<bool(const Json&)>& pred) {
    const Json ts = trials_of(job);
    if (ts.size() != 2) return false;
    for (const auto& t : ts) {
      if (!pred(t)) return false;
    }
    return true;
  };
  ASSERT_TRUE(Eventually(
      [&] {
        return all_trials("susp-e2e", [](const Json& t) {
          return t["state"] == "Running" && t.value("step", 0) >= 3;
        });
      },
      120))
      << trials_of("susp-e2e").dump(2);
  ASSERT_EQ(Sh("kubectl patch mmj susp-e2e --type merge -p '{\"spec\":{\"suspend\":true}}'").first,
            0);
  ASSERT_TRUE(Eventually(
      [&] {
        return all_trials("susp-e2e", [](const Json& t) { return t["state"] == "Interrupted"; });
      },
      90))
      << trials_of("susp-e2e").dump(2) << "\n"
      << hydra::fakes::Slurp(c1.out_path);
  std::map<std::string, int64_t> suspended_at;
  for (const auto& t : trials_of("susp-e2e")) {
    suspended_at[t["name"]] = t["step"].get<int64_t>();
    EXPECT_EQ(t["lastCheckpoint"]["step"], t["step"]) << "checkpointed where it stopped";
    EXPECT_EQ(t.value("restarts", 0), 0) << "a suspension is not a restart";
    EXPECT_THAT(t.value("message", ""), HasSubstr("suspended at step"));
  }
  auto suspended =
      Sh("kubectl get mmj susp-e2e -o "
         "jsonpath='{.status.conditions[?(@.type==\"Progressing\")].reason}'");
  EXPECT_EQ(suspended.second, "Suspended");
  std::this_thread::sleep_for(std::chrono::seconds(3));
  for (const auto& t : trials_of("susp-e2e")) {
    EXPECT_EQ(t["step"], suspended_at[t["name"]]) << "nothing trains while suspended";
  }
  ASSERT_EQ(Sh("kubectl patch mmj susp-e2e --type merge -p '{\"spec\":{\"suspend\":false}}'").first,
            0);
  ASSERT_TRUE(Eventually(
      [&] {
        return all_trials("susp-e2e", [&](const Json& t) {
          return t["state"] == "Running" && t["step"].get<int64_t>() > suspended_at[t["name"]];
        });
      },
      120))
      << trials_of("susp-e2e").dump(2);
  auto susp_events = Sh("kubectl get events --field-selector involvedObject.name=susp-e2e");
  EXPECT_THAT(susp_events.second, HasSubstr("TrialsSuspended"));
  for (const auto& [name, step] : suspended_at) {
    EXPECT_THAT(susp_events.second,
                HasSubstr("resumed from the checkpoint of step " + std::to_string(step)))
        << name;
  }
  ASSERT_EQ(Sh("kubectl delete mmj susp-e2e --timeout=60s").first, 0);

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

/// GetStatus of an agent over plaintext (the test agents bind loopback).
v1::GetStatusResponse AgentStatus(const Agent& a) {
  auto stub = v1::AgentService::NewStub(
      grpc::CreateChannel(a.endpoint(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::GetStatusResponse resp;
  stub->GetStatus(&ctx, {}, &resp);
  return resp;
}

/// The agent's record of the trial `name` of job `job` in namespace `ns`, if it has one.
std::optional<v1::TrialStatus> AgentTrial(const Agent& a, const std::string& ns,
                                          const std::string& job, const std::string& name) {
  const v1::GetStatusResponse status = AgentStatus(a);
  for (const auto& t : status.trials()) {
    if (t.namespace_() == ns && t.job() == job && t.name() == name) return t;
  }
  return std::nullopt;
}

/// Files under `dir`, recursively (0 when it does not exist).
size_t FilesUnder(const fs::path& dir) {
  std::error_code ec;
  size_t n = 0;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    n += it->is_regular_file();
  }
  return n;
}

// Two tenants run jobs of the same name, so their trials have the same names too, on the same
// agent. Deleting one tenant's job (checkpointRetention: Delete) cancels and deletes only its
// own trials. A real agent whose metrics reach Prometheus through an unrelated scrape job (as
// any pod's could) is never given a trial, however much memory it claims. A missing dataset is
// reported as such (TrialRejected), not as waiting for capacity.
TEST_F(ControllerE2eTest, TenantsWithTheSameJobNameCannotTouchEachOther) {
  const fs::path work = dir_ / "tenants";
  fs::create_directories(work / "data");
  fs::create_directories(work / "ckpt");
  fs::copy_file(kSource + "/examples/data/corpus.txt", work / "data" / "corpus.txt");
  std::vector<Agent> agents;
  // Two devices, so that both tenants' trials run at once (on one, the longest-remaining-
  // time-first policy would run one trial after the other).
  agents.push_back(hydra::fakes::StartAgentProcess("node-a", "cpu:2,budget=512Mi", work,
                                                   work / "data", work / "ckpt"));
  // The impostor: a working agent with 8x the memory, scraped as job "other".
  Agent impostor = hydra::fakes::StartAgentProcess("node-evil", "cpu:1,budget=4Gi", work,
                                                   work / "data", work / "ckpt");
  ASSERT_GT(agents[0].proc.pid, 0);
  ASSERT_GT(impostor.proc.pid, 0);
  int prom_port = 0;
  Proc prometheus =
      hydra::fakes::StartPrometheus(work, {"127.0.0.1:" + std::to_string(agents[0].metrics)},
                                    &prom_port, {"127.0.0.1:" + std::to_string(impostor.metrics)});
  ASSERT_TRUE(Eventually(
      [&] { return hydra::fakes::PrometheusCountIs(prom_port, "hydra_agent_info", 2); }, 60))
      << "both agents' metrics are in Prometheus";
  Proc controller = hydra::fakes::Start(
      kBinary + "/controller/hydra-controller",
      {"--prometheus-url", "http://127.0.0.1:" + std::to_string(prom_port), "--data-root",
       work.string(), "--checkpoint-root", (work / "ckpt").string(), "--metrics-bind-address", "0",
       "--health-probe-bind-address", "0", "--resync-seconds", "1", "--inventory-seconds", "1"},
      (work / "controller.log").string());
  auto cleanup = [&] {
    hydra::fakes::Stop(controller, SIGKILL, std::chrono::seconds(5));
    hydra::fakes::Stop(agents[0].proc, SIGKILL, std::chrono::seconds(5));
    hydra::fakes::Stop(impostor.proc, SIGKILL, std::chrono::seconds(5));
    hydra::fakes::Stop(prometheus, SIGTERM, std::chrono::seconds(10));
  };
  const std::string job = R"(apiVersion: hydra.dev/v1alpha1
kind: MultiModelJob
metadata: {name: sweep, namespace: NS}
spec:
  model: {family: gpt2, nLayer: 1, nEmbd: 32, nHead: 2, contextLength: 32}
  dataset: {path: data/corpus.txt}
  search: {grid: {learningRate: [1.0e-3]}}
  training: {steps: 1000000, batchSize: 4, evalEverySteps: 5, checkpointEverySteps: 5}
  resources: {deviceMemoryBudget: 64Mi}
  checkpointRetention: Delete
)";
  const std::string trial = "sweep-lr1e-3";
  for (const std::string ns : {"team-a", "team-b"}) {
    ASSERT_EQ(Sh("kubectl create namespace " + ns).first, 0);
    std::string m = job;
    m.replace(m.find("NS"), 2, ns);
    auto [rc, out] = Apply(m, work);
    ASSERT_EQ(rc, 0) << out;
  }
  // Both trials run on node-a with checkpoints on disk, each in its tenant's directory.
  const fs::path dir_a = work / "ckpt" / "team-a" / "sweep" / trial;
  const fs::path dir_b = work / "ckpt" / "team-b" / "sweep" / trial;
  ASSERT_TRUE(Eventually(
      [&] {
        for (const std::string ns : {"team-a", "team-b"}) {
          auto t = AgentTrial(agents[0], ns, "sweep", trial);
          if (!t || t->state() != v1::RUNNING || t->last_checkpoint_step() < 5) return false;
        }
        return true;
      },
      120))
      << AgentStatus(agents[0]).DebugString() << hydra::fakes::Slurp(controller.out_path);
  EXPECT_GT(FilesUnder(dir_a), 0u);
  EXPECT_GT(FilesUnder(dir_b), 0u);
  const auto uid_a = AgentTrial(agents[0], "team-a", "sweep", trial)->job_uid();
  const auto uid_b = AgentTrial(agents[0], "team-b", "sweep", trial)->job_uid();
  EXPECT_FALSE(uid_a.empty());
  EXPECT_NE(uid_a, uid_b);

  // A dataset that is not there: its own reason and an Event naming it, not "capacity".
  ASSERT_EQ(Apply(Manifest("lost", "path: data/corpus.txt", "path: data/missing.txt"), work).first,
            0);
  EXPECT_TRUE(Eventually(
      [&] {
        auto [rc, out] = Sh("kubectl get events --field-selector involvedObject.name=lost");
        return out.find("TrialRejected") != std::string::npos &&
               out.find("missing.txt") != std::string::npos;
      },
      60))
      << Sh("kubectl get mmj lost -o yaml").second;
  auto lost = Sh("kubectl get mmj lost -o jsonpath={.status.conditions}");
  EXPECT_THAT(lost.second, HasSubstr("TrialRejected"));
  EXPECT_THAT(lost.second, Not(HasSubstr("WaitingForCapacity")));
  Sh("kubectl delete mmj lost --timeout=60s");

  // team-a deletes its job: its trial is cancelled and its files go; team-b's trial, of the
  // same name on the same agent, trains on with its checkpoints intact.
  const int64_t b_before = AgentTrial(agents[0], "team-b", "sweep", trial)->step();
  auto del = Sh("kubectl delete -n team-a mmj sweep --timeout=60s");
  EXPECT_EQ(del.first, 0) << del.second;
  auto a_after = AgentTrial(agents[0], "team-a", "sweep", trial);
  ASSERT_TRUE(a_after.has_value());
  EXPECT_EQ(a_after->state(), v1::CANCELLED);
  EXPECT_FALSE(fs::exists(dir_a)) << "team-a's checkpoints were not deleted";
  EXPECT_TRUE(Eventually(
      [&] {
        auto b = AgentTrial(agents[0], "team-b", "sweep", trial);
        return b && b->state() == v1::RUNNING && b->step() > b_before + 5;
      },
      60))
      << AgentStatus(agents[0]).DebugString();
  EXPECT_GT(FilesUnder(dir_b), 0u) << "team-b lost its checkpoints";
  EXPECT_TRUE(fs::exists(dir_b)) << "team-b's checkpoints were deleted";
  auto job_b = Sh("kubectl get -n team-b mmj sweep -o jsonpath={.status.running}");
  EXPECT_EQ(job_b.second, "1");

  // The impostor never got a trial, nor was it dialled for one.
  EXPECT_EQ(AgentStatus(impostor).trials_size(), 0);
  EXPECT_THAT(hydra::fakes::Slurp(controller.out_path), Not(HasSubstr("node-evil")));
  Sh("kubectl delete -n team-b mmj sweep --timeout=60s");
  EXPECT_FALSE(fs::exists(dir_b));
  cleanup();
}

}  // namespace
