// Bring your own model: a GPT-style model exported from Python with TorchScript trains in the
// real `hydra` binary with the per-step losses of the same model trained in Python (within 1e-5
// relative, 20 steps), unsharded and spilled to disk, and in bf16 within 2%; the weights it
// writes load back in
// Python; and bad model files are refused with a clear error before anything trains.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/job.h"
#include "tests/fakes/control_plane.h"
#include "tests/fakes/reference_training.h"
#include "tests/fakes/subprocess.h"

namespace hydra {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using fakes::Sh;
using ::testing::HasSubstr;

const std::string kSource = HYDRA_SOURCE_DIR;
const std::string kHydra = std::string(HYDRA_BINARY_DIR) + "/cli/hydra";
const std::string kPython = "/usr/bin/python3";  // Debian's, with python3-torch
constexpr int kSteps = 20;

class TorchScriptTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("hydra_torchscript_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "data");
    fs::copy_file(kSource + "/examples/data/corpus.txt", dir_ / "data" / "corpus.txt");
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Manifest(const std::string& model, const std::string& resources,
                       const std::string& precision = "fp32") {
    return R"(apiVersion: hydra.dev/v1alpha1
kind: MultiModelJob
metadata: {name: ts}
spec:
  model: {family: torchscript, path: )" +
           model + R"(, contextLength: 32, vocabSize: 256}
  dataset: {path: data/corpus.txt}
  training: {steps: 20, batchSize: 4, learningRate: 1.0e-3, weightDecay: 0.1, beta1: 0.9,
             beta2: 0.95, epsilon: 1.0e-8, seed: 3, evalEverySteps: 10, checkpointEverySteps: 10,
             precision: )" +
           precision + "}\n" + resources;
  }

  fs::path dir_;
};

TEST_F(TorchScriptTest, TrainsWithThePythonLossesUnshardedAndSpilledAndItsWeightsLoadInPython) {
  auto [erc, eout] =
      Sh(kPython + " " + kSource + "/examples/torchscript/export_gpt.py --out " +
         (dir_ / "gpt.pt").string() + " --layers 2 --width 64 --heads 2 --context 32 --seed 5");
  ASSERT_EQ(erc, 0) << eout;

  // The windows every step trains on, from Hydra's own batch function, and its AdamW settings.
  std::ofstream(dir_ / "plain.yaml") << Manifest("gpt.pt", "");
  Json config = fakes::ReferenceTraining((dir_ / "plain.yaml").string(), kSteps);
  ASSERT_FALSE(config.is_null());
  config["model"] = (dir_ / "gpt.pt").string();
  config["data"] = (dir_ / "data" / "corpus.txt").string();
  std::ofstream(dir_ / "reference.json") << config.dump();
  auto [prc, pout] = Sh(kPython + " " + kSource + "/tests/python/train_reference.py " +
                        (dir_ / "reference.json").string());
  ASSERT_EQ(prc, 0) << pout;
  const Json python = Json::parse(pout);
  ASSERT_EQ(python.size(), static_cast<size_t>(kSteps));

  // Shard boundaries [1, 3]: the embedding, both blocks, the head in three shards on disk.
  std::ofstream(dir_ / "spilled.yaml")
      << Manifest("gpt.pt", "  resources: {shardBoundaries: [1, 3], offload: disk}\n");
  // bf16 (autocast over the scripted module's ops), spilled to disk too: within 2% of Python's
  // fp32 losses.
  std::ofstream(dir_ / "bf16.yaml")
      << Manifest("gpt.pt", "  resources: {shardBoundaries: [1, 3], offload: disk}\n", "bf16");
  for (const std::string variant : {"plain", "spilled", "bf16"}) {
    SCOPED_TRACE(variant);
    const double tolerance = variant == "bf16" ? 2e-2 : 1e-5;
    const fs::path out = dir_ / ("out-" + variant);
    auto [rc, text] = Sh(kHydra + " run " + (dir_ / (variant + ".yaml")).string() + " -o " +
                         out.string() + " --progress quiet");
    ASSERT_EQ(rc, 0) << text;
    const Json results = Json::parse(fakes::Slurp((out / "results.json").string()));
    const Json& t = results["trials"][0];
    EXPECT_EQ(t["shards"], variant == "plain" ? 1 : 3);
    EXPECT_EQ(t["precision"], variant == "bf16" ? "bf16" : "fp32");
    fakes::ExpectLossesTrack(t, python, tolerance);
    if (variant == "bf16") {
      // Autocast took effect: some step's loss is off Python's fp32 by more than fp32's 1e-5.
      double most = 0;
      for (size_t s = 0; s < python.size(); ++s) {
        const double ours = t["trainLoss"][s][1], theirs = python[s];
        most = std::max(most, std::abs(ours - theirs) / std::abs(theirs));
      }
      EXPECT_GT(most, 1e-4) << "the bf16 run's losses are fp32's: it computed in fp32";
    }
    // The trained weights load back in Python (load_state_dict is strict: every name and
    // shape must match the module).
    const fs::path state =
        out / "trials" / t["name"].get<std::string>() / "checkpoints" / "model.pt";
    ASSERT_TRUE(fs::exists(state)) << state;
    auto [lrc, lout] = Sh(kPython + " " + kSource + "/tests/python/train_reference.py " +
                          (dir_ / "reference.json").string() + " --check-state " + state.string());
    ASSERT_EQ(lrc, 0) << lout;
    const double trained = Json::parse(lout).get<double>();
    EXPECT_TRUE(std::isfinite(trained));
    EXPECT_LT(trained, python[0].get<double>()) << "the loaded weights are the trained ones";
  }
}

TEST_F(TorchScriptTest, BadModelFilesAreRefusedWithAClearError) {
  auto [mrc, mout] =
      Sh(kPython + " " + kSource + "/tests/python/make_bad_models.py " + (dir_ / "bad").string());
  ASSERT_EQ(mrc, 0) << mout;
  struct Case {
    std::string file, message;
  };
  const std::vector<Case> cases = {
      {"bad/missing.pt", "does not exist"},
      {"bad/not-torchscript.pt", "is not a TorchScript archive"},
      {"bad/future-version.pt", "was saved by a PyTorch this LibTorch"},
      {"bad/not-sequential.pt", "is not sequential"},
      {"bad/no-children.pt", "has no child modules"},
      {"bad/float64.pt", "Hydra trains fp32 parameters"},
      {"bad/wrong-output.pt", "must return logits of shape [batch, 32, 256]"},
      {"bad/untrainable.pt", "uses an operation that cannot be trained"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.file);
    std::ofstream(dir_ / "bad.yaml") << Manifest(c.file, "");
    auto [rc, out] = Sh(kHydra + " validate " + (dir_ / "bad.yaml").string());
    EXPECT_NE(rc, 0) << out;
    EXPECT_THAT(out, HasSubstr("spec.model.path: " + (dir_ / c.file).string())) << out;
    EXPECT_THAT(out, HasSubstr(c.message)) << out;
  }
  // The good one of the same kind passes.
  std::ofstream(dir_ / "good.yaml") << Manifest("bad/good.pt", "");
  auto [rc, out] = Sh(kHydra + " validate " + (dir_ / "good.yaml").string());
  EXPECT_EQ(rc, 0) << out;
  // The manifest's own rules.
  std::ofstream(dir_ / "nopath.yaml") << Manifest("x", "");
  std::string text = fakes::Slurp((dir_ / "nopath.yaml").string());
  text.replace(text.find("path: x, "), 9, "");
  std::ofstream(dir_ / "nopath.yaml") << text;
  auto nopath = Sh(kHydra + " validate " + (dir_ / "nopath.yaml").string());
  EXPECT_NE(nopath.first, 0);
  EXPECT_THAT(nopath.second, HasSubstr("spec.model.path"));
}

}  // namespace
}  // namespace hydra
