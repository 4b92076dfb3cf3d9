#include "common/random_search.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>

#include "common/job.h"

namespace hydra {
namespace {

using ::testing::HasSubstr;

// The issue's manifest.
const char* kRandom = R"(apiVersion: hydra.dev/v1alpha1
kind: MultiModelJob
metadata: {name: rs}
spec:
  model: {family: gpt2, nLayer: 2, nEmbd: 32, nHead: 2, contextLength: 32, vocabSize: 256}
  dataset: {format: text, path: data/corpus.txt}
  search:
    random:
      trials: 16
      seed: 3
      space:
        learningRate: {logUniform: [1.0e-4, 3.0e-3]}
        batchSize: {choice: [8, 16]}
        nLayer: {intUniform: [2, 6]}
        weightDecay: {uniform: [0.0, 0.1]}
    earlyStopping:
      algorithm: asha
      metric: validationLoss
      minSteps: 20
      reductionFactor: 3
  training: {steps: 200, batchSize: 8, evalEverySteps: 50}
)";

std::vector<Trial> Expand(const std::string& yaml) {
  auto job = ParseJobYaml(yaml, "/base");
  EXPECT_TRUE(job.ok()) << job.status();
  if (!job.ok()) return {};
  auto trials = ExpandTrials(*job);
  EXPECT_TRUE(trials.ok()) << trials.status();
  return trials.ok() ? *trials : std::vector<Trial>{};
}

std::string Replace(std::string s, const std::string& from, const std::string& to) {
  const auto pos = s.find(from);
  EXPECT_NE(pos, std::string::npos) << from;
  if (pos != std::string::npos) s.replace(pos, from.size(), to);
  return s;
}

TEST(RandomSearchTest, ParsesTheIssueManifest) {
  auto job = ParseJobYaml(kRandom, "/base");
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(job->spec.random.has_value());
  EXPECT_EQ(job->spec.random->trials, 16);
  EXPECT_EQ(job->spec.random->seed, 3);
  ASSERT_EQ(job->spec.random->space.size(), 4u);
  // The field table's order (model before training), whatever the manifest's.
  EXPECT_EQ(job->spec.random->space[0].field, "nLayer");
  EXPECT_EQ(job->spec.random->space[1].field, "learningRate");
  EXPECT_EQ(job->spec.random->space[1].distribution, Distribution::kLogUniform);
  EXPECT_EQ(job->spec.early_stopping.algorithm, EarlyStoppingAlgorithm::kAsha);
  EXPECT_EQ(job->spec.early_stopping.min_steps, 20);
  EXPECT_EQ(job->spec.early_stopping.reduction_factor, 3);
}

TEST(RandomSearchTest, DrawsAreReproducibleNamedByIndexAndWithinRange) {
  const auto a = Expand(kRandom);
  const auto b = Expand(kRandom);
  ASSERT_EQ(a.size(), 16u);
  ASSERT_EQ(b.size(), 16u);
  std::set<int64_t> layers, batches;
  std::set<double> rates;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].name, "rs-" + std::to_string(i));
    EXPECT_EQ(a[i].index, static_cast<int>(i));
    ASSERT_EQ(a[i].hyperparameters.size(), 4u);
    for (size_t h = 0; h < 4; ++h) {
      EXPECT_EQ(a[i].hyperparameters[h].value, b[i].hyperparameters[h].value);
    }
    const auto& t = a[i];
    EXPECT_GE(t.model.n_layer, 2);
    EXPECT_LE(t.model.n_layer, 6);
    EXPECT_TRUE(t.training.batch_size == 8 || t.training.batch_size == 16);
    EXPECT_GE(t.training.learning_rate, 1e-4);
    EXPECT_LE(t.training.learning_rate, 3e-3);
    EXPECT_GE(t.training.weight_decay, 0.0);
    EXPECT_LE(t.training.weight_decay, 0.1);
    layers.insert(t.model.n_layer);
    batches.insert(t.training.batch_size);
    rates.insert(t.training.learning_rate);
  }
  // 16 draws reach both choices, several layer counts and 16 distinct rates.
  EXPECT_EQ(batches.size(), 2u);
  EXPECT_GE(layers.size(), 3u);
  EXPECT_EQ(rates.size(), 16u);
}

TEST(RandomSearchTest, ASeedChangesTheDrawsAndAnotherAxisLeavesThemAlone) {
  const auto base = Expand(kRandom);
  const auto reseeded = Expand(Replace(kRandom, "seed: 3", "seed: 4"));
  const auto fewer = Expand(Replace(kRandom, "        nLayer: {intUniform: [2, 6]}\n", ""));
  ASSERT_EQ(base.size(), 16u);
  ASSERT_EQ(reseeded.size(), 16u);
  ASSERT_EQ(fewer.size(), 16u);
  int same_rate = 0;
  for (size_t i = 0; i < base.size(); ++i) {
    same_rate += base[i].training.learning_rate == reseeded[i].training.learning_rate;
    EXPECT_EQ(base[i].training.learning_rate, fewer[i].training.learning_rate);
    EXPECT_EQ(fewer[i].model.n_layer, 2);  // the base value
  }
  EXPECT_EQ(same_rate, 0);
}

TEST(RandomSearchTest, DistributionsCoverTheirRanges) {
  RandomAxis ints{"nLayer", Distribution::kIntUniform, int64_t{1}, int64_t{4}, {}};
  RandomAxis logs{"learningRate", Distribution::kLogUniform, 1e-4, 1e-2, {}};
  std::map<int64_t, int> counts;
  int below_1e3 = 0;
  const int n = 4000;
  for (int i = 0; i < n; ++i) {
    ++counts[std::get<int64_t>(DrawValue(ints, 7, i))];
    const double lr = std::get<double>(DrawValue(logs, 7, i));
    ASSERT_GE(lr, 1e-4);
    ASSERT_LE(lr, 1e-2);
    below_1e3 += lr < 1e-3;
  }
  ASSERT_EQ(counts.size(), 4u);  // both ends included
  for (const auto& [v, c] : counts) EXPECT_NEAR(c, n / 4, n / 20) << v;
  // Log-uniform: half the draws below the geometric middle 1e-3.
  EXPECT_NEAR(below_1e3, n / 2, n / 20);
  // Rounded to 6 significant digits.
  const double v = std::get<double>(DrawValue(logs, 7, 1));
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.6g", v);
  EXPECT_EQ(std::strtod(buf, nullptr), v);
}

struct BadRandom {
  std::string from, to, path, rule;
};

class BadRandomTest : public ::testing::TestWithParam<BadRandom> {};

TEST_P(BadRandomTest, RejectedWithFieldPath) {
  const auto& c = GetParam();
  auto job = ParseJobYaml(Replace(kRandom, c.from, c.to), "/base");
  ASSERT_FALSE(job.ok()) << c.to;
  EXPECT_THAT(job.status().message(), HasSubstr(c.path + ": "));
  EXPECT_THAT(job.status().message(), HasSubstr(c.rule));
}

INSTANTIATE_TEST_SUITE_P(
    Table, BadRandomTest,
    ::testing::Values(
        BadRandom{"    random:", "    grid: {seed: [1, 2]}\n    random:", "spec.search.random",
                  "exclusive"},
        BadRandom{"trials: 16", "trials: 0", "spec.search.random.trials", "from 1 to 256"},
        BadRandom{"trials: 16", "trials: 257", "spec.search.random.trials", "from 1 to 256"},
        BadRandom{"      trials: 16\n", "", "spec.search.random.trials", "required"},
        BadRandom{"seed: 3", "seed: -1", "spec.search.random.seed", "from 0 to 9.2e18"},
        BadRandom{"nLayer: {intUniform: [2, 6]}", "nLayer: {uniform: [2, 6]}",
                  "spec.search.random.space.nLayer.uniform", "integer field"},
        BadRandom{"weightDecay: {uniform: [0.0, 0.1]}", "weightDecay: {intUniform: [0, 1]}",
                  "spec.search.random.space.weightDecay.intUniform", "float field"},
        BadRandom{"nLayer: {intUniform: [2, 6]}", "nLayer: {intUniform: [6, 2]}",
                  "spec.search.random.space.nLayer.intUniform", "low must be <= high"},
        BadRandom{"nLayer: {intUniform: [2, 6]}", "nLayer: {intUniform: [0, 6]}",
                  "spec.search.random.space.nLayer.intUniform[0]", "must be >= 1"},
        BadRandom{"learningRate: {logUniform: [1.0e-4, 3.0e-3]}",
                  "learningRate: {logUniform: [1.0e-4, 30]}",
                  "spec.search.random.space.learningRate.logUniform[1]", "must be <= 1e+01"},
        BadRandom{"weightDecay: {uniform: [0.0, 0.1]}", "weightDecay: {logUniform: [0.0, 0.1]}",
                  "spec.search.random.space.weightDecay.logUniform[0]", "low > 0"},
        BadRandom{"batchSize: {choice: [8, 16]}", "batchSize: {choice: [8, x]}",
                  "spec.search.random.space.batchSize.choice[1]", "integer"},
        BadRandom{"batchSize: {choice: [8, 16]}", "batchSize: {normal: [8, 16]}",
                  "spec.search.random.space.batchSize.normal", "unknown distribution"},
        BadRandom{"batchSize: {choice: [8, 16]}", "dropout: {choice: [0.1]}",
                  "spec.search.random.space.dropout", "unknown field"},
        BadRandom{"batchSize: {choice: [8, 16]}", "batchSize: [8, 16]",
                  "spec.search.random.space.batchSize", "one distribution"},
        BadRandom{"algorithm: asha", "algorithm: hyperband", "spec.search.earlyStopping.algorithm",
                  "asha, median, none"},
        BadRandom{"metric: validationLoss", "metric: accuracy", "spec.search.earlyStopping.metric",
                  "validationLoss"},
        BadRandom{"      minSteps: 20\n", "", "spec.search.earlyStopping.minSteps",
                  "required with algorithm asha"},
        BadRandom{"minSteps: 20", "minSteps: 200", "spec.search.earlyStopping.minSteps",
                  "in trial rs-0: minSteps (200) must be below steps (200)"},
        BadRandom{"reductionFactor: 3", "reductionFactor: 1",
                  "spec.search.earlyStopping.reductionFactor", "from 2 to 256"},
        BadRandom{"algorithm: asha", "algorithm: median\n      stop: 1",
                  "spec.search.earlyStopping.stop", "unknown field"}));

TEST(RandomSearchTest, MedianStoppingNeedsEvaluations) {
  auto job = ParseJobYaml(Replace(Replace(kRandom, "algorithm: asha", "algorithm: median"),
                                  "evalEverySteps: 50", "evalEverySteps: 0"),
                          "/base");
  ASSERT_FALSE(job.ok());
  EXPECT_THAT(job.status().message(), HasSubstr("spec.training.evalEverySteps"));
}

TEST(RandomSearchTest, EarlyStoppingWorksWithAGridAndDefaultsToNone) {
  const std::string all = kRandom;
  const std::string random_block =
      all.substr(all.find("    random:"), all.find("    earlyStopping:") - all.find("    random:"));
  const std::string grid =
      Replace(kRandom, random_block, "    grid: {learningRate: [1.0e-3, 3.0e-3]}\n");
  auto job = ParseJobYaml(grid, "/base");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_FALSE(job->spec.random.has_value());
  EXPECT_EQ(job->spec.grid.size(), 1u);
  EXPECT_EQ(job->spec.early_stopping.algorithm, EarlyStoppingAlgorithm::kAsha);
  const auto trials = Expand(grid);
  ASSERT_EQ(trials.size(), 2u);
  EXPECT_EQ(trials[0].name, "rs-lr1e-3");  // grid names stay the abbreviated values
  const std::string none = Replace(grid, R"(    earlyStopping:
      algorithm: asha
      metric: validationLoss
      minSteps: 20
      reductionFactor: 3
)",
                                   "");
  job = ParseJobYaml(none, "/base");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->spec.early_stopping.algorithm, EarlyStoppingAlgorithm::kNone);
}

}  // namespace
}  // namespace hydra
