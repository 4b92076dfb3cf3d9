#include "proto/trial_proto.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "common/job_json.h"

namespace hydra::wire {
namespace {

using ::testing::HasSubstr;

const char kGpt2[] = R"(apiVersion: hydra.dev/v1alpha1
kind: MultiModelJob
metadata: {name: j, namespace: team-a, uid: 6f1c2d3e-aaaa-4bbb-8ccc-0123456789ab}
spec:
  model: {family: gpt2, nLayer: 3, nEmbd: 32, nHead: 4, contextLength: 16}
  dataset: {path: /data/corpus.txt, evalSequences: 7, validationFraction: 0.1}
  search: {grid: {learningRate: [0.001], optimizer: [sgd]}}
  training: {steps: 30, batchSize: 4, gradientAccumulationSteps: 2, gradClipNorm: 1.5,
             lrSchedule: cosine, warmupSteps: 3, momentum: 0.8, precision: bf16}
  resources: {deviceMemoryBudget: 64Mi, hostMemoryBudget: 1Gi, offload: disk}
)";

const char kImages[] = R"(apiVersion: hydra.dev/v1alpha1
kind: MultiModelJob
metadata: {name: j}
spec:
  model: {family: resnet, nLayer: 3, nEmbd: 16, numClasses: 7}
  dataset: {format: images-u8, path: /data/images.bin, imageShape: [1, 28, 20]}
  training: {steps: 30, batchSize: 4}
)";

Trial Sample(const std::string& yaml = kGpt2) {
  auto job = ParseJobYaml(yaml, "/");
  EXPECT_TRUE(job.ok()) << job.status();
  return ExpandTrials(*job)->front();
}

TEST(TrialProtoTest, RoundTripKeepsTheWholeConfiguration) {
  for (const char* yaml : {kGpt2, kImages}) {
    const Trial t = Sample(yaml);
    v1::TrialSpec spec;
    TrialToProto(t, &spec);
    EXPECT_EQ(spec.job(), "j");
    EXPECT_EQ(spec.namespace_(), t.namespace_);
    EXPECT_EQ(spec.job_uid(), t.job_uid);
    auto back = TrialFromProto(spec);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(TrialKey(*back), TrialKey(t)) << "the identity crosses the wire whole";
    EXPECT_EQ(TrialConfigJson(*back), TrialConfigJson(t));
    EXPECT_EQ(TrialFingerprint(*back), TrialFingerprint(t)) << "a checkpoint moves with the trial";
    EXPECT_EQ(HyperparametersJson(*back), HyperparametersJson(t));
    EXPECT_EQ(back->name, t.name);
    EXPECT_EQ(back->model.num_classes, t.model.num_classes);
    EXPECT_EQ(back->dataset.image_shape, t.dataset.image_shape);
  }
  EXPECT_EQ(Sample(kImages).dataset.image_shape, (std::vector<int64_t>{1, 28, 20}));
  const Trial t = Sample();
  EXPECT_EQ(t.namespace_, "team-a");
  EXPECT_EQ(t.job, "j");
  EXPECT_EQ(t.job_uid, "6f1c2d3e-aaaa-4bbb-8ccc-0123456789ab");
  EXPECT_EQ(TrialKeyOf(TrialRefOf(t)), TrialKey(t));
}

TEST(TrialProtoTest, KeysTellTrialsOfTheSameNameApart) {
  Trial a = Sample(), b = Sample(), c = Sample();
  b.namespace_ = "team-b";
  c.job_uid = "another-uid";
  EXPECT_NE(TrialKey(a), TrialKey(b));
  EXPECT_NE(TrialKey(a), TrialKey(c));
  Trial bare;
  bare.name = "x";
  EXPECT_EQ(TrialKey(bare), "x") << "a trial without an owner is its name";
}

TEST(TrialProtoTest, AnIdentityWithABadPartIsRefused) {
  for (auto mutate : std::vector<std::function<void(v1::TrialSpec*)>>{
           [](v1::TrialSpec* s) { s->set_namespace_("Team/A"); },
           [](v1::TrialSpec* s) { s->set_job("a/b"); },
           [](v1::TrialSpec* s) { s->set_job_uid("u/1"); },
           [](v1::TrialSpec* s) { s->set_name(std::string(64, 'a')); }}) {
    v1::TrialSpec spec;
    TrialToProto(Sample(), &spec);
    mutate(&spec);
    EXPECT_EQ(TrialFromProto(spec).status().code(), StatusCode::kInvalidArgument)
        << spec.ShortDebugString();
  }
}

TEST(TrialProtoTest, ANonFiniteHyperparameterIsRefused) {
  // Found by fuzz_trial_proto: a NaN grid value decoded, then compared unequal to itself.
  for (double bad : {std::nan(""), HUGE_VAL, -HUGE_VAL}) {
    v1::TrialSpec spec;
    TrialToProto(Sample(), &spec);
    spec.mutable_hyperparameters(0)->set_float_value(bad);
    auto t = TrialFromProto(spec);
    ASSERT_EQ(t.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(t.status().message(), HasSubstr("trial.hyperparameters[0]: must be a finite"));
  }
}

TEST(TrialProtoTest, PrecisionCrossesTheWireAndAnUnknownOneIsRefused) {
  v1::TrialSpec spec;
  TrialToProto(Sample(), &spec);
  EXPECT_EQ(spec.training().precision(), v1::PRECISION_BF16);
  spec.mutable_training()->set_precision(v1::PRECISION_UNSPECIFIED);
  auto old = TrialFromProto(spec);
  ASSERT_TRUE(old.ok()) << old.status();
  EXPECT_EQ(old->training.precision, Precision::kFp32) << "an older controller means fp32";
  spec.mutable_training()->set_precision(static_cast<v1::Precision>(9));
  auto t = TrialFromProto(spec);
  ASSERT_EQ(t.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(t.status().message(), HasSubstr("trial.training.precision: unknown value 9"));
}

TEST(TrialProtoTest, ModelInitCrossesTheWireAndAnUnknownFormatIsRefused) {
  std::string yaml = kGpt2;
  yaml.replace(yaml.find("contextLength: 16}"), 18,
               "contextLength: 16, init: {path: /data/gpt2/model.safetensors}}");
  const Trial t = Sample(yaml);
  v1::TrialSpec spec;
  TrialToProto(t, &spec);
  EXPECT_EQ(spec.model().init().format(), v1::INIT_FORMAT_SAFETENSORS);
  EXPECT_EQ(spec.model().init().path(), "/data/gpt2/model.safetensors");
  auto back = TrialFromProto(spec);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_TRUE(back->model.init.has_value());
  EXPECT_EQ(back->model.init->resolved_path, "/data/gpt2/model.safetensors");
  EXPECT_EQ(TrialFingerprint(*back), TrialFingerprint(t));
  spec.mutable_model()->mutable_init()->set_format(v1::INIT_FORMAT_UNSPECIFIED);
  EXPECT_THAT(TrialFromProto(spec).status().message(),
              HasSubstr("trial.model.init.format: unknown value 0"));
}

TEST(TrialProtoTest, HostMemoryBudgetZeroIsNotUnlimited) {
  // 0 means "no RAM for stashed activations" (recompute, trim), unset means unlimited.
  for (std::optional<int64_t> budget :
       {std::optional<int64_t>{}, std::optional<int64_t>{0}, std::optional<int64_t>{64 << 20}}) {
    Trial t = Sample();
    t.resources.host_memory_budget = budget;
    v1::TrialSpec spec;
    TrialToProto(t, &spec);
    auto back = TrialFromProto(spec);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->resources.host_memory_budget, budget);
  }
}

TEST(TrialProtoTest, EveryProblemIsNamedWithItsField) {
  v1::TrialSpec spec;
  TrialToProto(Sample(), &spec);
  spec.mutable_training()->set_learning_rate(-1);
  spec.mutable_training()->set_optimizer("lion");
  spec.mutable_dataset()->set_eval_sequences(0);
  spec.mutable_resources()->set_offload("tape");
  auto t = TrialFromProto(spec);
  ASSERT_EQ(t.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(t.status().message(), HasSubstr("trial.training.learningRate: must be > 0"));
  EXPECT_THAT(t.status().message(), HasSubstr("trial.training.optimizer: must be one of"));
  EXPECT_THAT(t.status().message(), HasSubstr("trial.dataset.evalSequences"));
  EXPECT_THAT(t.status().message(), HasSubstr("trial.resources.offload"));
}

TEST(TrialProtoTest, StatesMapBothWays) {
  for (const char* s : {kTrialPending, kTrialRunning, kTrialSucceeded, kTrialFailed,
                        kTrialInterrupted, kTrialCancelled}) {
    EXPECT_EQ(TrialStateFromProto(TrialStateToProto(s)), s);
  }
}

TEST(TrialProtoTest, ShardPlanBoundaries) {
  const Trial t = Sample();
  auto plan = PlanShards(t, PartitionOptionsFor(t));
  ASSERT_TRUE(plan.ok()) << plan.status();
  v1::ShardPlan p;
  ShardPlanToProto(*plan, &p);
  ASSERT_EQ(p.shards_size(), static_cast<int>(plan->shards.size()));
  EXPECT_EQ(p.state_tier(), "disk");
  auto bounds = ShardBoundaries(p);
  ASSERT_EQ(bounds.size(), plan->shards.size() - 1);
  for (size_t i = 0; i < bounds.size(); ++i) EXPECT_EQ(bounds[i], plan->shards[i + 1].first_layer);
  EXPECT_EQ(p.attention(), AttentionMemoryName(plan->attention));
  EXPECT_FALSE(p.selective_recompute());
  EXPECT_EQ(p.offloaded_bytes(), 0);
}

TEST(TrialProtoTest, APlansSelectiveRecomputeAndOffloadedGraphsReachTheStatus) {
  // What a GPU's plan adds: graphs offloaded, LayerNorm and GELU recomputed, attention fused.
  const Trial t = Sample();
  auto plan = PlanShards(t, PartitionOptionsFor(t));
  ASSERT_TRUE(plan.ok()) << plan.status();
  plan->attention = AttentionMemory::kFused;
  plan->selective_recompute = true;
  plan->offloaded_bytes = 123456789;
  plan->shards.front().policy = ActivationPolicy::kOffload;
  v1::ShardPlan p;
  ShardPlanToProto(*plan, &p);
  EXPECT_EQ(p.attention(), "fused");
  EXPECT_TRUE(p.selective_recompute());
  EXPECT_EQ(p.offloaded_bytes(), 123456789);
  EXPECT_EQ(p.shards(0).activations(), "offload");
  EXPECT_FALSE(p.shards(0).resident());
  EXPECT_EQ(p.resident_bytes(), 0);
}

TEST(TrialProtoTest, APlansResidentShardsAndLinkTimeReachTheStatus) {
  const Trial t = Sample();
  auto plan = PlanShards(t, PartitionOptionsFor(t));
  ASSERT_TRUE(plan.ok()) << plan.status();
  plan->shards.back().resident = true;
  plan->shards.front().input_offloaded = true;
  plan->resident_bytes = plan->shards.back().state_bytes;
  plan->link_seconds = 0.25;
  v1::ShardPlan p;
  ShardPlanToProto(*plan, &p);
  ASSERT_EQ(p.shards_size(), static_cast<int>(plan->shards.size()));
  EXPECT_TRUE(p.shards(p.shards_size() - 1).resident());
  EXPECT_TRUE(p.shards(0).input_offloaded());
  EXPECT_EQ(p.resident_bytes(), plan->shards.back().state_bytes);
  EXPECT_DOUBLE_EQ(p.link_seconds(), 0.25);
}

}  // namespace
}  // namespace hydra::wire
