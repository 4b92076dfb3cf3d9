#include "common/job.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/job_json.h"

namespace hydra {
namespace {

using ::testing::HasSubstr;

const char* kGood = R"(apiVersion: hydra.dev/v1alpha1
kind: MultiModelJob
metadata:
  name: gpt2-sweep
  labels: {team: research}
spec:
  model:
    family: gpt2
    nLayer: 4
    nEmbd: 128
    nHead: 4
    contextLength: 128
    vocabSize: 256
  dataset:
    format: text
    path: data/corpus.txt
    validationFraction: 0.05
  search:
    grid:
      learningRate: [1.0e-3, 3.0e-4]
      batchSize: [8, 16]
  training:
    optimizer: adamw
    learningRate: 1.0e-3
    batchSize: 8
    steps: 200
    seed: 1
    evalEverySteps: 50
    checkpointEverySteps: 100
  resources:
    deviceMemoryBudget: 512Mi
)";

TEST(JobTest, ParsesTheIssueManifest) {
  auto job = ParseJobYaml(kGood, "/base");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->metadata.name, "gpt2-sweep");
  EXPECT_EQ(job->metadata.labels.at("team"), "research");
  EXPECT_EQ(job->spec.model.n_layer, 4);
  EXPECT_EQ(job->spec.model.n_embd, 128);
  EXPECT_EQ(job->spec.dataset.format, DatasetFormat::kText);
  EXPECT_EQ(job->spec.dataset.resolved_path, "/base/data/corpus.txt");
  EXPECT_DOUBLE_EQ(job->spec.dataset.validation_fraction, 0.05);
  EXPECT_EQ(job->spec.training.steps, 200);
  EXPECT_EQ(job->spec.training.checkpoint_every_steps, 100);
  ASSERT_TRUE(job->spec.resources.device_memory_budget.has_value());
  EXPECT_EQ(*job->spec.resources.device_memory_budget, 512LL << 20);
  ASSERT_EQ(job->spec.grid.size(), 2u);
  EXPECT_EQ(job->spec.grid[0].field, "learningRate");
  EXPECT_EQ(job->spec.grid[1].values.size(), 2u);
}

TEST(JobTest, SuspendDefaultsToFalse) {
  auto job = ParseJobYaml(kGood, "/base");
  ASSERT_TRUE(job.ok()) << job.status().message();
  EXPECT_FALSE(job->spec.suspend);
  std::string yaml = kGood;
  yaml.replace(yaml.find("  resources:"), 12, "  suspend: true\n  resources:");
  auto suspended = ParseJobYaml(yaml, "/base");
  ASSERT_TRUE(suspended.ok()) << suspended.status().message();
  EXPECT_TRUE(suspended->spec.suspend);
}

TEST(JobTest, TokenFormatsBoundTheVocabulary) {
  auto with = [](const std::string& format, const std::string& vocab) {
    std::string yaml = kGood;
    yaml.replace(yaml.find("format: text"), 12, "format: " + format);
    yaml.replace(yaml.find("vocabSize: 256"), 14, "vocabSize: " + vocab);
    return ParseJobYaml(yaml, "/base");
  };
  auto big = with("tokens-u32", "100000");
  ASSERT_TRUE(big.ok()) << big.status().message();
  EXPECT_EQ(big->spec.dataset.format, DatasetFormat::kTokensU32);
  auto narrow = with("tokens-u16", "100000");
  EXPECT_THAT(narrow.status().message(), HasSubstr("<= 65536 for the tokens-u16 format"));
  auto unknown = with("tokens-u64", "256");
  EXPECT_THAT(unknown.status().message(), HasSubstr("tokens-u32"));  // the formats it knows
}

TEST(JobTest, AbsoluteDatasetPathIsKept) {
  std::string yaml = kGood;
  yaml.replace(yaml.find("data/corpus.txt"), 15, "/data/x.txt");
  auto job = ParseJobYaml(yaml, "/base");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->spec.dataset.resolved_path, "/data/x.txt");
}

TEST(JobTest, GridExpandsToCartesianProductInOrder) {
  auto job = ParseJobYaml(kGood, "/base");
  ASSERT_TRUE(job.ok());
  auto trials = ExpandTrials(*job);
  ASSERT_TRUE(trials.ok()) << trials.status();
  ASSERT_EQ(trials->size(), 4u);
  EXPECT_EQ((*trials)[0].name, "gpt2-sweep-lr1e-3-bs8");
  EXPECT_EQ((*trials)[1].name, "gpt2-sweep-lr1e-3-bs16");
  EXPECT_EQ((*trials)[2].name, "gpt2-sweep-lr3e-4-bs8");
  EXPECT_EQ((*trials)[3].name, "gpt2-sweep-lr3e-4-bs16");
  EXPECT_DOUBLE_EQ((*trials)[2].training.learning_rate, 3e-4);
  EXPECT_EQ((*trials)[3].training.batch_size, 16);
  // Fields the grid does not name keep the base values.
  EXPECT_EQ((*trials)[3].training.steps, 200);
  EXPECT_EQ((*trials)[3].model.n_layer, 4);
  EXPECT_EQ(HyperparametersJson((*trials)[1]).dump(), R"({"learningRate":0.001,"batchSize":16})");
  for (int i = 0; i < 4; ++i) EXPECT_EQ((*trials)[i].index, i);
}

TEST(JobTest, ExpansionIsDeterministicAndFingerprintsDiffer) {
  auto job = ParseJobYaml(kGood, "/base");
  ASSERT_TRUE(job.ok());
  auto a = ExpandTrials(*job), b = ExpandTrials(*job);
  ASSERT_TRUE(a.ok() && b.ok());
  for (size_t i = 0; i < a->size(); ++i) {
    EXPECT_EQ((*a)[i].name, (*b)[i].name);
    EXPECT_EQ(TrialFingerprint((*a)[i]), TrialFingerprint((*b)[i]));
    for (size_t j = 0; j < i; ++j) EXPECT_NE(TrialFingerprint((*a)[i]), TrialFingerprint((*a)[j]));
  }
}

TEST(JobTest, NoGridGivesOneTrial) {
  std::string yaml = kGood;
  auto start = yaml.find("  search:");
  auto end = yaml.find("  training:");
  yaml.erase(start, end - start);
  auto job = ParseJobYaml(yaml, "/base");
  ASSERT_TRUE(job.ok()) << job.status();
  auto trials = ExpandTrials(*job);
  ASSERT_TRUE(trials.ok());
  ASSERT_EQ(trials->size(), 1u);
  EXPECT_EQ((*trials)[0].name, "gpt2-sweep-base");
}

TEST(JobTest, ModelAndEnumFieldsCanBeSearched) {
  std::string yaml = kGood;
  yaml.replace(
      yaml.find("      learningRate: [1.0e-3, 3.0e-4]\n      batchSize: [8, 16]\n"),
      std::string("      learningRate: [1.0e-3, 3.0e-4]\n      batchSize: [8, 16]\n").size(),
      "      nLayer: [2, 4, 6]\n      optimizer: [adamw, sgd]\n      weightDecay: [0.1]\n");
  auto job = ParseJobYaml(yaml, "/base");
  ASSERT_TRUE(job.ok()) << job.status();
  auto trials = ExpandTrials(*job);
  ASSERT_TRUE(trials.ok());
  ASSERT_EQ(trials->size(), 6u);
  EXPECT_EQ((*trials)[5].name, "gpt2-sweep-l6-optsgd-wd0p1");
  EXPECT_EQ((*trials)[5].model.n_layer, 6);
  EXPECT_EQ((*trials)[5].training.optimizer, OptimizerKind::kSgd);
}

TEST(JobTest, PrecisionIsATrainingFieldAndAGridAxis) {
  std::string yaml = kGood;
  const std::string axes = "      learningRate: [1.0e-3, 3.0e-4]\n      batchSize: [8, 16]\n";
  yaml.replace(yaml.find(axes), axes.size(), "      precision: [fp32, bf16]\n");
  auto job = ParseJobYaml(yaml, "/base");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->spec.training.precision, Precision::kFp32) << "the default";
  auto trials = ExpandTrials(*job);
  ASSERT_TRUE(trials.ok());
  ASSERT_EQ(trials->size(), 2u);
  EXPECT_EQ((*trials)[0].training.precision, Precision::kFp32);
  EXPECT_EQ((*trials)[1].training.precision, Precision::kBf16);
  EXPECT_EQ((*trials)[1].name, "gpt2-sweep-precbf16");
  EXPECT_NE(TrialFingerprint((*trials)[0]), TrialFingerprint((*trials)[1]));
  EXPECT_EQ(TrialConfigJson((*trials)[1])["training"]["precision"], "bf16");
  EXPECT_FALSE(TrialConfigJson((*trials)[0])["training"].contains("precision"))
      << "fp32 trials keep the fingerprints they had before the field existed";
}

struct BadCase {
  const char* what;
  std::string from;  // text in kGood to replace (first occurrence)
  std::string to;
  std::string path;  // expected field path
  std::string rule;  // expected words of the message
};

class BadManifestTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(BadManifestTest, RejectedWithFieldPath) {
  const BadCase& c = GetParam();
  std::string yaml = kGood;
  auto pos = yaml.find(c.from);
  ASSERT_NE(pos, std::string::npos) << c.from;
  yaml.replace(pos, c.from.size(), c.to);
  std::vector<FieldError> errors;
  auto job = ParseJobYaml(yaml, "/base", &errors);
  ASSERT_FALSE(job.ok()) << c.what;
  EXPECT_EQ(job.status().code(), StatusCode::kInvalidArgument);
  bool found = false;
  for (const auto& e : errors)
    found = found || (e.path == c.path && e.message.find(c.rule) != std::string::npos);
  EXPECT_TRUE(found) << c.what << ": want " << c.path << " / " << c.rule << ", got:\n"
                     << job.status().message();
  EXPECT_THAT(job.status().message(), HasSubstr(c.path + ": "));
}

INSTANTIATE_TEST_SUITE_P(
    Table, BadManifestTest,
    ::testing::Values(
        BadCase{"negative grid batch", "batchSize: [8, 16]", "batchSize: [8, -16]",
                "spec.search.grid.batchSize[1]", "must be >= 1"},
        BadCase{"zero grid batch", "batchSize: [8, 16]", "batchSize: [8, 0]",
                "spec.search.grid.batchSize[1]", "must be >= 1"},
        BadCase{"wrong apiVersion", "hydra.dev/v1alpha1", "hydra.dev/v2", "apiVersion",
                "must be hydra.dev/v1alpha1"},
        BadCase{"wrong kind", "kind: MultiModelJob", "kind: Job", "kind", "must be MultiModelJob"},
        BadCase{"unknown model field", "    nHead: 4\n", "    nHead: 4\n    nHeads: 4\n",
                "spec.model.nHeads", "unknown field"},
        BadCase{"unknown top-level spec field", "  resources:", "  resource:", "spec.resource",
                "unknown field"},
        BadCase{"unknown grid field", "batchSize: [8, 16]", "dropout: [0.1]",
                "spec.search.grid.dropout", "unknown field"},
        BadCase{"suspend not a boolean", "  resources:", "  suspend: yes\n  resources:",
                "spec.suspend", "must be true or false"},
        BadCase{"missing name", "  name: gpt2-sweep\n", "", "metadata.name", "required"},
        BadCase{"uppercase name", "name: gpt2-sweep", "name: GPT2_Sweep", "metadata.name",
                "DNS-1123"},
        BadCase{"bad optimizer", "optimizer: adamw", "optimizer: adam", "spec.training.optimizer",
                "must be one of: adamw, sgd"},
        BadCase{"bad precision", "    learningRate: 1.0e-3\n",
                "    learningRate: 1.0e-3\n    precision: fp16\n", "spec.training.precision",
                "must be one of: fp32, bf16 (got 'fp16')"},
        BadCase{"zero learning rate", "    learningRate: 1.0e-3\n", "    learningRate: 0\n",
                "spec.training.learningRate", "must be > 0"},
        BadCase{"non-integer steps", "steps: 200", "steps: 2.5", "spec.training.steps",
                "must be an integer"},
        BadCase{"string steps", "steps: 200", "steps: many", "spec.training.steps",
                "must be an integer"},
        BadCase{"bad dataset format", "format: text", "format: csv", "spec.dataset.format",
                "must be one of"},
        BadCase{"missing dataset path", "    path: data/corpus.txt\n", "", "spec.dataset.path",
                "required"},
        BadCase{"validation fraction 1", "validationFraction: 0.05", "validationFraction: 1",
                "spec.dataset.validationFraction", "> 0 and < 1"},
        BadCase{"bad budget", "512Mi", "512Mb", "spec.resources.deviceMemoryBudget",
                "byte quantity"},
        BadCase{"empty grid list", "batchSize: [8, 16]", "batchSize: []",
                "spec.search.grid.batchSize", "non-empty list"},
        BadCase{"duplicate grid value", "batchSize: [8, 16]", "batchSize: [8, 8]",
                "spec.search.grid.batchSize[1]", "duplicate"},
        BadCase{"grid value of wrong type", "learningRate: [1.0e-3, 3.0e-4]",
                "learningRate: [1.0e-3, fast]", "spec.search.grid.learningRate[1]",
                "must be a number"},
        BadCase{"nHead does not divide nEmbd", "nHead: 4", "nHead: 5", "spec.model.nHead",
                "must divide nEmbd"},
        BadCase{"text format needs 256 vocab", "vocabSize: 256", "vocabSize: 100",
                "spec.model.vocabSize", ">= 256"},
        BadCase{"accumulation must divide batch", "    seed: 1\n",
                "    seed: 1\n    gradientAccumulationSteps: 3\n",
                "spec.training.gradientAccumulationSteps", "must divide batchSize"},
        BadCase{"model is not a mapping", "  model:\n    family: gpt2\n",
                "  model: gpt2\n  modelx:\n    family: gpt2\n", "spec.model", "must be a mapping"},
        BadCase{"model path with a built-in family", "    nLayer: 4\n",
                "    nLayer: 4\n    path: model.pt\n", "spec.model.path",
                "only family torchscript reads a model file"},
        BadCase{"torchscript without a path", "    family: gpt2\n", "    family: torchscript\n",
                "spec.model.path", "required field is missing"},
        BadCase{"image family on a text corpus", "    family: gpt2\n", "    family: mlp\n",
                "spec.model.family", "spec.dataset.format must be images-u8"},
        BadCase{"image format for a language model", "format: text", "format: images-u8",
                "spec.model.family", "format images-u8 needs an image family"},
        BadCase{"image shape on a text corpus", "    format: text\n",
                "    format: text\n    imageShape: [3, 32, 32]\n", "spec.dataset.imageShape",
                "only format images-u8 has images"},
        BadCase{"image shape of two dimensions", "    format: text\n",
                "    format: images-u8\n    imageShape: [32, 32]\n", "spec.dataset.imageShape",
                "[channels, height, width]"},
        BadCase{"one class", "    vocabSize: 256\n", "    vocabSize: 256\n    numClasses: 1\n",
                "spec.model.numClasses", "must be >= 2"},
        BadCase{"init in an unknown format", "    vocabSize: 256\n",
                "    vocabSize: 256\n    init: {format: onnx, path: m.safetensors}\n",
                "spec.model.init.format", "must be one of: safetensors"},
        BadCase{"init without a path", "    vocabSize: 256\n",
                "    vocabSize: 256\n    init: {format: safetensors}\n", "spec.model.init.path",
                "required field is missing"},
        BadCase{"init with an unknown field", "    vocabSize: 256\n",
                "    vocabSize: 256\n    init: {path: m.safetensors, dtype: f16}\n",
                "spec.model.init.dtype", "unknown field"},
        BadCase{"init of a torchscript model", "    family: gpt2\n",
                "    family: torchscript\n    path: m.pt\n    init: {path: m.safetensors}\n",
                "spec.model.init", "only family gpt2 starts from a checkpoint"},
        BadCase{
            "agents without maxAgents", "\n  resources:",
            "\n  agents: {template: {spec: {containers: [{name: agent, image: h}]}}}\n  resources:",
            "spec.agents.maxAgents", "required field is missing"},
        BadCase{"agents maxAgents zero", "\n  resources:",
                "\n  agents: {maxAgents: 0, template: {spec: {containers: [{name: agent, image: "
                "h}]}}}\n  resources:",
                "spec.agents.maxAgents", "from 1 to 1024"},
        BadCase{"agents minAgents above max", "\n  resources:",
                "\n  agents: {minAgents: 3, maxAgents: 2, template: {spec: {containers: [{name: "
                "agent, image: h}]}}}\n  resources:",
                "spec.agents.minAgents", "must be <= maxAgents"},
        BadCase{"agents without a template", "\n  resources:",
                "\n  agents: {maxAgents: 2}\n  resources:", "spec.agents.template",
                "required field is missing"},
        BadCase{"agents with no containers", "\n  resources:",
                "\n  agents: {maxAgents: 2, template: {spec: {containers: []}}}\n  resources:",
                "spec.agents.template.spec.containers", "non-empty list"},
        BadCase{"agents with no agent container", "\n  resources:",
                "\n  agents: {maxAgents: 2, template: {spec: {containers: [{name: a, image: h}, "
                "{name: b, image: h}]}}}\n  resources:",
                "spec.agents.template.spec.containers", "no container named agent"},
        BadCase{"agent container without an image", "\n  resources:",
                "\n  agents: {maxAgents: 2, template: {spec: {containers: [{name: agent}]}}}\n  "
                "resources:",
                "spec.agents.template.spec.containers[0].image", "required"},
        BadCase{"agent container with a command", "\n  resources:",
                "\n  agents: {maxAgents: 2, template: {spec: {containers: [{name: agent, image: h, "
                "command: [sh]}]}}}\n  resources:",
                "spec.agents.template.spec.containers[0].command", "set by the controller"},
        BadCase{"agent args overriding a flag the controller sets", "\n  resources:",
                "\n  agents: {maxAgents: 2, template: {spec: {containers: [{name: agent, image: h, "
                "args: [--threads=2, --dedicated-job=other/job/uid]}]}}}\n  resources:",
                "spec.agents.template.spec.containers[0].args[1]",
                "--dedicated-job is set by the controller"},
        BadCase{"agent args binding another address", "\n  resources:",
                "\n  agents: {maxAgents: 2, template: {spec: {containers: [{name: agent, image: h, "
                "args: [--grpc-bind-address]}]}}}\n  resources:",
                "spec.agents.template.spec.containers[0].args[0]", "set by the controller"},
        BadCase{"agent pods with a nodeName", "\n  resources:",
                "\n  agents: {maxAgents: 2, template: {spec: {nodeName: n1, containers: [{name: "
                "agent, image: h}]}}}\n  resources:",
                "spec.agents.template.spec.nodeName", "must not be set"},
        BadCase{"agent GPUs not a number", "\n  resources:",
                "\n  agents: {maxAgents: 2, template: {spec: {containers: [{name: agent, image: h, "
                "resources: {limits: {nvidia.com/gpu: two}}}]}}}\n  resources:",
                "spec.agents.template.spec.containers[0].resources.limits.nvidia.com/gpu",
                "whole number of GPUs"},
        BadCase{"agent template naming its pods", "\n  resources:",
                "\n  agents: {maxAgents: 2, template: {metadata: {name: x}, spec: {containers: "
                "[{name: agent, image: h}]}}}\n  resources:",
                "spec.agents.template.metadata.name", "unknown field"},
        BadCase{"agents unknown field", "\n  resources:",
                "\n  agents: {maxAgents: 2, maxGpus: 3, template: {spec: {containers: [{name: "
                "agent, image: h}]}}}\n  resources:",
                "spec.agents.maxGpus", "unknown field"},
        BadCase{"missing steps", "    steps: 200\n", "", "spec.training.steps", "required"},
        BadCase{"malformed YAML", "  search:\n", "  search: [\n", "", "malformed YAML"}),
    [](const ::testing::TestParamInfo<BadCase>& info) {
      std::string name = info.param.what;
      for (char& ch : name) {
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
      }
      return name;
    });

TEST(JobTest, ModelInitResolvesAndIsPartOfTheFingerprint) {
  std::string yaml = kGood;
  yaml.replace(
      yaml.find("    vocabSize: 256\n"), 19,
      "    vocabSize: 256\n    init: {format: safetensors, path: gpt2/model.safetensors}\n");
  auto job = ParseJobYaml(yaml, "/base");
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(job->spec.model.init.has_value());
  EXPECT_EQ(job->spec.model.init->format, InitFormat::kSafetensors);
  EXPECT_EQ(job->spec.model.init->path, "gpt2/model.safetensors");
  EXPECT_EQ(job->spec.model.init->resolved_path, "/base/gpt2/model.safetensors");
  auto trials = ExpandTrials(*job);
  ASSERT_TRUE(trials.ok()) << trials.status();
  const Trial& t = trials->front();
  ASSERT_TRUE(t.model.init.has_value()) << "every trial starts from the checkpoint";
  EXPECT_EQ(TrialConfigJson(t)["model"]["init"]["path"], "/base/gpt2/model.safetensors");
  Trial random = t;
  random.model.init.reset();
  EXPECT_NE(TrialFingerprint(t), TrialFingerprint(random));
  // Format is optional (safetensors is the one there is); absolute paths are kept.
  std::string abs = kGood;
  abs.replace(abs.find("    vocabSize: 256\n"), 19,
              "    vocabSize: 256\n    init: {path: /m.st}\n");
  auto absolute = ParseJobYaml(abs, "/base");
  ASSERT_TRUE(absolute.ok()) << absolute.status();
  EXPECT_EQ(absolute->spec.model.init->resolved_path, "/m.st");
}

TEST(JobTest, ModelSpecComesBackFromItsJson) {
  Trial t;
  t.model.n_layer = 3;
  t.model.n_embd = 48;
  t.model.n_head = 6;
  t.model.context_length = 20;
  t.model.vocab_size = 1000;
  auto back = ModelSpecFromJson(TrialConfigJson(t)["model"]);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->family, ModelFamily::kGpt2);
  EXPECT_EQ(back->n_layer, 3);
  EXPECT_EQ(back->n_embd, 48);
  EXPECT_EQ(back->n_head, 6);
  EXPECT_EQ(back->context_length, 20);
  EXPECT_EQ(back->vocab_size, 1000);
  auto broken = TrialConfigJson(t)["model"];
  broken["nEmbd"] = "wide";
  EXPECT_THAT(ModelSpecFromJson(broken).status().message(), HasSubstr("model.nEmbd"));
  EXPECT_THAT(ModelSpecFromJson(nlohmann::json::object()).status().message(),
              HasSubstr("model.family"));
}

TEST(JobTest, AgentsSpecKeepsWhatScalingNeeds) {
  EXPECT_FALSE(ParseJobYaml(kGood, "/base")->spec.agents.has_value()) << "the shared pool";
  std::string yaml = kGood;
  yaml.replace(yaml.find("\n  resources:"), 13, R"(
  agents:
    minAgents: 1
    maxAgents: 4
    template:
      metadata: {labels: {team: nlp}}
      spec:
        nodeSelector: {cloud.google.com/gke-spot: "true"}
        containers:
          - name: log-shipper
            image: busybox
          - name: agent
            image: ghcr.io/hydra/hydra:0.9
            args: [--threads=8]
            resources: {limits: {nvidia.com/gpu: 2, cpu: 8}}
  resources:)");
  auto job = ParseJobYaml(yaml, "/base");
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(job->spec.agents.has_value());
  EXPECT_EQ(job->spec.agents->min_agents, 1);
  EXPECT_EQ(job->spec.agents->max_agents, 4);
  EXPECT_EQ(job->spec.agents->container, "agent");
  EXPECT_EQ(job->spec.agents->gpus_per_agent, 2);
  // One container: that one runs the agent, whatever its name; no GPU limit: a CPU agent.
  std::string one = kGood;
  one.replace(one.find("\n  resources:"), 13,
              "\n  agents: {maxAgents: 2, template: {spec: {containers: [{name: main, image: h}]}}}"
              "\n  resources:");
  auto single = ParseJobYaml(one, "/base");
  ASSERT_TRUE(single.ok()) << single.status();
  EXPECT_EQ(single->spec.agents->container, "main");
  EXPECT_EQ(single->spec.agents->gpus_per_agent, 0);
  EXPECT_EQ(single->spec.agents->min_agents, 0) << "scales to zero by default";
}

TEST(JobTest, ImageClassifiersParse) {
  std::string yaml = kGood;
  yaml.replace(yaml.find("family: gpt2"), 12, "family: resnet\n    numClasses: 7");
  yaml.replace(yaml.find("format: text"), 12, "format: images-u8\n    imageShape: [1, 28, 20]");
  yaml.replace(yaml.find("nHead: 4"), 8, "nHead: 3");  // unused by image families
  auto job = ParseJobYaml(yaml, "/base");
  ASSERT_TRUE(job.ok()) << job.status();
  auto trials = ExpandTrials(*job);
  ASSERT_TRUE(trials.ok()) << trials.status();
  const Trial& t = trials->front();
  EXPECT_TRUE(IsImageTask(t));
  EXPECT_EQ(t.model.num_classes, 7);
  EXPECT_EQ(t.dataset.image_shape, (std::vector<int64_t>{1, 28, 20}));
  EXPECT_EQ(SampleWindow(t), 1 + 28 * 20);  // one record: label byte + pixels
  EXPECT_EQ(TokensPerSample(t), 1);
  EXPECT_STREQ(ThroughputUnit(t), "images/s");
  EXPECT_EQ(TrialConfigJson(t)["model"]["numClasses"], 7);
}

TEST(JobTest, ReportsEveryProblemWithLineNumbers) {
  std::string yaml = kGood;
  yaml.replace(yaml.find("steps: 200"), 10, "steps: -1");
  yaml.replace(yaml.find("nLayer: 4"), 9, "nLayer: 0");
  std::vector<FieldError> errors;
  auto job = ParseJobYaml(yaml, "/base", &errors);
  ASSERT_FALSE(job.ok());
  ASSERT_EQ(errors.size(), 2u) << job.status();
  EXPECT_EQ(errors[0].path, "spec.model.nLayer");
  EXPECT_EQ(errors[0].line, 9);
  EXPECT_EQ(errors[1].path, "spec.training.steps");
  EXPECT_THAT(job.status().message(), HasSubstr("spec.training.steps: must be >= 1 (line"));
}

TEST(JobTest, GridRuleViolationNamesTheTrial) {
  std::string yaml = kGood;
  yaml.replace(yaml.find("batchSize: [8, 16]"), 18, "nHead: [4, 3]");
  std::vector<FieldError> errors;
  auto job = ParseJobYaml(yaml, "/base", &errors);
  ASSERT_FALSE(job.ok());
  EXPECT_THAT(job.status().message(), HasSubstr("gpt2-sweep-h3-lr1e-3"));
  EXPECT_THAT(job.status().message(), HasSubstr("nHead (3) must divide nEmbd (128)"));
}

// yaml-cpp 0.7's LoadAll reports empty documents forever for these (jbeder/yaml-cpp#1319) and
// ran out of memory; found by tests/fuzz (regressions/manifest/).
TEST(JobTest, TextThatStallsTheYamlParserIsMalformedNotEndless) {
  for (const std::string& text :
       std::vector<std::string>{", 16]", ",\n", std::string(kGood) + "\n, 16]"}) {
    auto job = ParseJobYaml(text, "/base");
    ASSERT_FALSE(job.ok()) << text;
    EXPECT_EQ(job.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(job.status().message(), HasSubstr("malformed YAML")) << text;
  }
}

TEST(JobTest, ExactlyOneDocument) {
  auto none = ParseJobYaml("# nothing\n", "/base");
  EXPECT_THAT(none.status().message(), HasSubstr("found none"));
  auto two = ParseJobYaml(std::string(kGood) + "\n---\n" + kGood, "/base");
  EXPECT_THAT(two.status().message(), HasSubstr("exactly one YAML document, found more"));
}

TEST(JobTest, LoadJobFileReportsMissingFile) {
  auto job = LoadJobFile("/nonexistent/job.yaml");
  ASSERT_FALSE(job.ok());
  EXPECT_EQ(job.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(job.status().message(), HasSubstr("/nonexistent/job.yaml"));
}

TEST(JobTest, LearningRateSchedules) {
  TrainingSpec t;
  t.learning_rate = 1.0;
  t.steps = 11;
  EXPECT_DOUBLE_EQ(LearningRateAt(t, 0), 1.0);
  EXPECT_DOUBLE_EQ(LearningRateAt(t, 10), 1.0);
  t.warmup_steps = 4;
  EXPECT_DOUBLE_EQ(LearningRateAt(t, 0), 0.25);
  EXPECT_DOUBLE_EQ(LearningRateAt(t, 3), 1.0);
  t.lr_schedule = LrSchedule::kCosine;
  t.warmup_steps = 0;
  EXPECT_DOUBLE_EQ(LearningRateAt(t, 0), 1.0);
  EXPECT_NEAR(LearningRateAt(t, 5), 0.55, 1e-12);
  EXPECT_NEAR(LearningRateAt(t, 10), 0.1, 1e-12);
}

/// Every value of E named as `names` says, in the enum's order, and read back from its name.
template <typename E>
void NamedInOrder(const std::vector<E>& values, const std::vector<std::string>& names) {
  EXPECT_EQ(NamesOf<E>(), names);
  ASSERT_EQ(values.size(), names.size());
  for (size_t i = 0; i < values.size(); ++i) {
    EXPECT_STREQ(NameOf(values[i]), names[i].c_str());
    EXPECT_EQ(ParseName<E>(names[i]), values[i]) << names[i];
    EXPECT_EQ(NameProblem<E>(names[i]), "") << names[i];
  }
}

TEST(JobTest, ClosedSetsAreEnumsNamedAsInTheManifest) {
  NamedInOrder<ModelFamily>(
      {ModelFamily::kGpt2, ModelFamily::kTorchScript, ModelFamily::kMlp, ModelFamily::kResNet},
      {"gpt2", "torchscript", "mlp", "resnet"});
  NamedInOrder<DatasetFormat>({DatasetFormat::kText, DatasetFormat::kTokensU16,
                               DatasetFormat::kTokensU32, DatasetFormat::kImagesU8},
                              {"text", "tokens-u16", "tokens-u32", "images-u8"});
  NamedInOrder<OptimizerKind>({OptimizerKind::kAdamW, OptimizerKind::kSgd}, {"adamw", "sgd"});
  NamedInOrder<LrSchedule>({LrSchedule::kConstant, LrSchedule::kCosine}, {"constant", "cosine"});
  NamedInOrder<OffloadTier>({OffloadTier::kHost, OffloadTier::kDisk}, {"host", "disk"});
  NamedInOrder<Precision>({Precision::kFp32, Precision::kBf16}, {"fp32", "bf16"});
  NamedInOrder<InitFormat>({InitFormat::kSafetensors}, {"safetensors"});
  EXPECT_FALSE(ParseName<LrSchedule>("Cosine"));  // names are exact
  EXPECT_FALSE(ParseName<ModelFamily>(""));
  EXPECT_EQ(NameProblem<OptimizerKind>("adam"), "must be one of: adamw, sgd (got 'adam')");
}

TEST(JobTest, TheJobJsonNamesClosedSetsAsTheManifestDoes) {
  // The JSON fingerprints trials (earlier runs' results and checkpoints are found by it): the
  // enums must not change its text.
  Trial t;
  t.model.family = ModelFamily::kResNet;
  t.dataset.format = DatasetFormat::kImagesU8;
  t.training.optimizer = OptimizerKind::kSgd;
  t.training.lr_schedule = LrSchedule::kCosine;
  const nlohmann::json j = TrialConfigJson(t);
  EXPECT_EQ(j["model"]["family"], "resnet");
  EXPECT_EQ(j["dataset"]["format"], "images-u8");
  EXPECT_EQ(j["dataset"]["imageShape"], nlohmann::json({3, 32, 32}));
  EXPECT_EQ(j["training"]["optimizer"], "sgd");
  EXPECT_EQ(j["training"]["lrSchedule"], "cosine");
  // The fingerprints the string fields gave these trials (814125b).
  EXPECT_EQ(TrialFingerprint(t), "4f7dcbfa888ccc4a");
  EXPECT_EQ(TrialFingerprint(Trial{}), "ccab0555d3a8ef52");
}

}  // namespace
}  // namespace hydra

namespace hydra {
namespace {

TEST(JobGridOrderTest, AxesFollowTheFieldTableWhateverTheManifestOrder) {
  auto parse = [](const std::string& grid) {
    auto job = ParseJobYaml(R"(apiVersion: hydra.dev/v1alpha1
kind: MultiModelJob
metadata: {name: j}
spec:
  model: {family: gpt2}
  dataset: {path: c.txt}
  search: {grid: )" + grid + R"(}
  training: {steps: 5}
)",
                            "/");
    EXPECT_TRUE(job.ok()) << job.status();
    std::vector<std::string> names;
    const auto trials = ExpandTrials(*job);
    for (const auto& t : *trials) names.push_back(t.name);
    return names;
  };
  // Kubernetes hands the controller the keys sorted; `hydra run` reads them as written.
  EXPECT_EQ(parse("{batchSize: [4, 8], learningRate: [0.001, 0.002]}"),
            parse("{learningRate: [0.001, 0.002], batchSize: [4, 8]}"));
  EXPECT_EQ(parse("{batchSize: [4], learningRate: [0.001]}").front(), "j-lr1e-3-bs4");
}

}  // namespace
}  // namespace hydra
