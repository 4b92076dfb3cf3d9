// Issue 21's proof against Hugging Face transformers itself (tests/python/hf_reference.py, run
// in the venv of scripts/hf-venv.sh): a small random GPT2LMHeadModel written by save_pretrained
// gives our logits within 1e-4 of transformers' (F32, BF16 and F16 files), `hydra eval` gives
// transformers' loss over the same windows, 20 fine-tuning steps of `hydra run` (unsharded and
// spilled to disk) give the per-step losses of a plain PyTorch AdamW loop over the same windows
// within 1e-4, and the model a run exports (next to its checkpoints, and by `hydra export`)
// loads in transformers with the logits of our final checkpoint.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "agent/executor/checkpoint.h"
#include "agent/executor/gpt2.h"
#include "agent/executor/hf_gpt2_init.h"
#include "agent/executor/tensor_buffers.h"
#include "common/job.h"
#include "tests/fakes/control_plane.h"
#include "tests/fakes/reference_training.h"
#include "tests/fakes/subprocess.h"

namespace hydra::executor {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using fakes::Sh;

const std::string kSource = HYDRA_SOURCE_DIR;
const std::string kHydra = std::string(HYDRA_BINARY_DIR) + "/cli/hydra";
const std::string kScript = kSource + "/tests/python/hf_reference.py";
constexpr int kSteps = 20;
constexpr int64_t kContext = 32;
constexpr int64_t kVocab = 300;

/// The venv's python: $HYDRA_HF_PYTHON (scripts/test.sh sets it, so there a missing venv
/// fails), else the default venv if it exists; empty when neither.
std::string HfPython() {
  if (const char* p = std::getenv("HYDRA_HF_PYTHON"); p && *p) return p;
  const char* home = std::getenv("HOME");
  const std::string def = std::string(home ? home : "") + "/.cache/hydra/hf-venv/bin/python";
  return fs::exists(def) ? def : "";
}

class HfTransformersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    python_ = HfPython();
    if (python_.empty()) GTEST_SKIP() << "no Hugging Face venv: run scripts/hf-venv.sh";
    dir_ = fs::temp_directory_path() / ("hydra_hf_transformers_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    // tokens-u16 from the example corpus: byte + 40, so ids run up to 295 of the 300.
    std::ifstream in(kSource + "/examples/data/corpus.txt", std::ios::binary);
    std::ofstream out(dir_ / "tokens.u16", std::ios::binary);
    for (char c; in.get(c);) {
      const uint16_t t = static_cast<uint8_t>(c) + 40;
      const char le[2] = {static_cast<char>(t & 0xff), static_cast<char>(t >> 8)};
      out.write(le, 2);
    }
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }

  std::pair<int, std::string> Py(const std::string& args) {
    return Sh(python_ + " " + kScript + " " + args + " 2>&1");
  }
  /// A random GPT2LMHeadModel with 64 positions (more than contextLength, as GPT-2's 1024).
  fs::path MakeModel(const std::string& name, const std::string& dtype = "float32") {
    auto [rc, out] = Py("make " + (dir_ / name).string() + " --layers 2 --embd 32 --heads 4 " +
                        "--positions 64 --vocab 300 --seed 7 --dtype " + dtype);
    EXPECT_EQ(rc, 0) << out;
    return dir_ / name;
  }
  static ModelSpec Spec(const fs::path& model_dir) {
    ModelSpec s{ModelFamily::kGpt2, /*n_layer=*/2, /*n_embd=*/32, /*n_head=*/4, kContext, kVocab};
    if (!model_dir.empty()) {
      ModelInit init;
      init.path = init.resolved_path = (model_dir / "model.safetensors").string();
      s.init = init;
    }
    return s;
  }
  /// Two sequences of kContext tokens, as JSON and as a tensor.
  static std::vector<std::vector<int64_t>> Tokens() {
    std::vector<std::vector<int64_t>> t(2);
    for (int64_t i = 0; i < kContext; ++i) {
      t[0].push_back((7 * i + 3) % kVocab);
      t[1].push_back((13 * i + 250) % kVocab);
    }
    return t;
  }
  static std::vector<float> Forward(const LayerSequence& model) {
    torch::NoGradGuard no_grad;
    auto t = Tokens();
    std::vector<int64_t> flat(t[0]);
    flat.insert(flat.end(), t[1].begin(), t[1].end());
    auto x = torch::from_blob(flat.data(), {2, kContext}, torch::kLong).clone();
    auto y = model.Forward(x).contiguous();
    return std::vector<float>(y.data_ptr<float>(), y.data_ptr<float>() + y.numel());
  }
  /// transformers' logits of the model in `model_dir` for Tokens().
  std::vector<float> TheirLogits(const fs::path& model_dir) {
    std::ofstream(dir_ / "tokens.json") << Json(Tokens()).dump();
    const fs::path out = dir_ / "logits.f32";
    auto [rc, text] = Py("logits " + model_dir.string() + " --tokens " +
                         (dir_ / "tokens.json").string() + " --out " + out.string());
    EXPECT_EQ(rc, 0) << text;
    std::ifstream in(out, std::ios::binary);
    std::vector<float> v(static_cast<size_t>(2 * kContext * kVocab));
    in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * 4));
    EXPECT_TRUE(in) << "short logits file";
    return v;
  }
  static void ExpectClose(const std::vector<float>& ours, const std::vector<float>& theirs,
                          double tolerance) {
    ASSERT_EQ(ours.size(), theirs.size());
    double worst = 0;
    for (size_t i = 0; i < ours.size(); ++i) {
      worst = std::max(worst, std::abs(static_cast<double>(ours[i]) - theirs[i]));
    }
    EXPECT_LE(worst, tolerance) << "largest logit difference";
  }
  std::string Manifest(const std::string& init, const std::string& resources) {
    return R"(apiVersion: hydra.dev/v1alpha1
kind: MultiModelJob
metadata: {name: ft}
spec:
  model: {family: gpt2, nLayer: 2, nEmbd: 32, nHead: 4, contextLength: 32, vocabSize: 300,
          init: {format: safetensors, path: )" +
           init + R"(}}
  dataset: {path: tokens.u16, format: tokens-u16}
  training: {steps: 20, batchSize: 4, learningRate: 1.0e-3, weightDecay: 0.1, beta1: 0.9,
             beta2: 0.95, epsilon: 1.0e-8, seed: 3, evalEverySteps: 10, checkpointEverySteps: 10}
)" + resources;
  }

  std::string python_;
  fs::path dir_;
};

TEST_F(HfTransformersTest, OurLogitsAndEvalLossAreTransformers) {
  for (const std::string dtype : {"float32", "bfloat16", "float16"}) {
    SCOPED_TRACE(dtype);
    const fs::path model = MakeModel("m-" + dtype, dtype);
    auto ours = BuildHfGpt2(Spec(model));
    ASSERT_TRUE(ours.ok()) << ours.status();
    ExpectClose(Forward(*ours), TheirLogits(model), 1e-4);
  }
  const fs::path model = dir_ / "m-float32";
  std::ofstream(dir_ / "job.yaml") << Manifest("m-float32/model.safetensors", "");
  auto [rc, out] = Sh(kHydra + " eval " + (dir_ / "job.yaml").string() + " --init " +
                      (model / "model.safetensors").string() + " --data " +
                      (dir_ / "tokens.u16").string() + " --json --threads 1");
  ASSERT_EQ(rc, 0) << out;
  auto [prc, pout] = Py("eval " + model.string() + " --data " + (dir_ / "tokens.u16").string() +
                        " --format tokens-u16 --context 32");
  ASSERT_EQ(prc, 0) << pout;
  const Json a = Json::parse(out), b = Json::parse(pout);
  EXPECT_EQ(a["tokens"], b["tokens"]);
  EXPECT_GT(a["tokens"].get<int64_t>(), 100000);
  EXPECT_LE(std::abs(a["loss"].get<double>() - b["loss"].get<double>()),
            1e-4 * b["loss"].get<double>())
      << a << " vs transformers' " << b;
}

TEST_F(HfTransformersTest, FineTuningFollowsAPyTorchLoopAndTheExportLoadsInTransformers) {
  const fs::path model = MakeModel("base");
  std::ofstream(dir_ / "plain.yaml") << Manifest("base/model.safetensors", "");
  // Shards [embed], [block0], [block1, head] spilled to disk: the checkpoint streams into them.
  std::ofstream(dir_ / "spilled.yaml") << Manifest(
      "base/model.safetensors", "  resources: {shardBoundaries: [1, 2], offload: disk}\n");

  // The windows every step trains on, from Hydra's own batch function, and its AdamW settings.
  Json config = fakes::ReferenceTraining((dir_ / "plain.yaml").string(), kSteps);
  ASSERT_FALSE(config.is_null());
  config["data"] = (dir_ / "tokens.u16").string();
  config["format"] = "tokens-u16";
  std::ofstream(dir_ / "reference.json") << config.dump();
  auto [prc, pout] = Py("train " + model.string() + " " + (dir_ / "reference.json").string());
  ASSERT_EQ(prc, 0) << pout;
  const Json python = Json::parse(pout);
  ASSERT_EQ(python.size(), static_cast<size_t>(kSteps));

  for (const std::string variant : {"plain", "spilled"}) {
    SCOPED_TRACE(variant);
    const fs::path out = dir_ / ("out-" + variant);
    auto [rc, text] = Sh(kHydra + " run " + (dir_ / (variant + ".yaml")).string() + " -o " +
                         out.string() + " --progress quiet --threads 1");
    ASSERT_EQ(rc, 0) << text;
    const Json results = Json::parse(fakes::Slurp((out / "results.json").string()));
    const Json& t = results["trials"][0];
    EXPECT_EQ(t["shards"], variant == "plain" ? 1 : 3);
    fakes::ExpectLossesTrack(t, python, 1e-4);
    EXPECT_LT(python[kSteps - 1].get<double>(), python[0].get<double>()) << "it learns";

    // Our final logits: the newest checkpoint's weights in a fresh model.
    const std::string name = t["name"];
    const fs::path ckpts = out / "trials" / name / "checkpoints";
    std::vector<std::string> warnings;
    auto latest = CheckpointStore(ckpts.string()).LoadLatest(&warnings);
    ASSERT_TRUE(latest.ok()) << latest.status();
    LayerSequence trained = BuildGpt2(Spec({}), 0);
    ASSERT_TRUE(CopyBuffersInto(latest->buffers, trained.NamedParameters(), true).ok());
    const std::vector<float> ours = Forward(trained);

    // The run wrote the model next to its checkpoints, and hydra export writes the same.
    EXPECT_TRUE(fs::exists(ckpts / "model.safetensors"));
    EXPECT_TRUE(fs::exists(ckpts / "config.json"));
    ExpectClose(ours, TheirLogits(ckpts), 1e-4);
    const fs::path exported = dir_ / ("export-" + variant);
    auto [erc, etext] = Sh(kHydra + " export " + out.string() + " --trial " + name + " -o " +
                           exported.string() + " 2>&1");
    ASSERT_EQ(erc, 0) << etext;
    EXPECT_THAT(etext, ::testing::HasSubstr("at step 20"));
    ExpectClose(ours, TheirLogits(exported), 1e-4);
  }
}

}  // namespace
}  // namespace hydra::executor
