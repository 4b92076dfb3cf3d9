#include "cli/local_runner.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "cli/progress.h"
#include "cli/results.h"
#include "common/file_util.h"
#include "tests/fakes/fake_executor.h"

namespace hydra::cli {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class RecordingProgress : public ProgressSinkInterface {
 public:
  void OnJobStart(const std::string&, const std::vector<TrialResult>&) override {}
  void OnTrialUpdate(size_t, const TrialResult&) override { ++updates; }
  void OnMessage(const std::string& m) override { messages.push_back(m); }
  void OnJobEnd(const std::vector<TrialResult>&) override {}
  int updates = 0;
  std::vector<std::string> messages;
};

class LocalRunnerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("hydra_runner_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    std::ofstream(dir_ / "corpus.txt") << std::string(4000, 'a');
  }
  void TearDown() override { fs::remove_all(dir_); }

  MultiModelJob Job(int64_t steps = 20) {
    std::string yaml = R"(apiVersion: hydra.dev/v1alpha1
kind: MultiModelJob
metadata: {name: j}
spec:
  model: {family: gpt2, nLayer: 1, nEmbd: 8, nHead: 2, contextLength: 8}
  dataset: {path: corpus.txt}
  search: {grid: {learningRate: [0.001, 0.003, 0.002]}}
  training: {steps: )" +
                       std::to_string(steps) +
                       R"(, evalEverySteps: 5, checkpointEverySteps: 4}
)";
    auto job = ParseJobYaml(yaml, dir_.string());
    EXPECT_TRUE(job.ok()) << job.status();
    return *job;
  }

  Status Run(const MultiModelJob& job, std::vector<TrialResult>* results, bool restart = false,
             const std::atomic<bool>* interrupted = nullptr, int devices = 1,
             Schedule* schedule = nullptr) {
    RunOptions o;
    o.output_dir = (dir_ / "out").string();
    o.restart = restart;
    o.interrupted = interrupted;
    o.devices = devices;
    LocalRunner runner(&factory_, &progress_, o);
    auto trials = ExpandTrials(job);
    EXPECT_TRUE(trials.ok());
    Status s = runner.Run(job, *trials, results);
    if (schedule) *schedule = runner.schedule();
    return s;
  }

  fs::path dir_;
  fakes::FakeExecutorFactory factory_;
  RecordingProgress progress_;
};

TEST_F(LocalRunnerTest, TrainsEveryTrialWithEvaluationsAndCheckpoints) {
  std::vector<TrialResult> results;
  ASSERT_TRUE(Run(Job(), &results).ok());
  ASSERT_EQ(results.size(), 3u);
  for (const auto& r : results) {
    EXPECT_EQ(r.state, "Succeeded") << r.message;
    EXPECT_EQ(r.step, 20);
    EXPECT_EQ(r.train_curve.size(), 20u);
    // Evaluations at 5, 10, 15 and the final one at 20.
    ASSERT_EQ(r.val_curve.size(), 4u);
    EXPECT_EQ(r.val_curve[0].step, 5);
    EXPECT_EQ(r.val_curve.back().step, 20);
    EXPECT_DOUBLE_EQ(r.final_val_loss, r.val_curve.back().loss);
    EXPECT_GT(r.tokens_per_second, 0);
    EXPECT_TRUE(fs::exists(dir_ / "out" / "trials" / r.trial.name / "result.json"));
    // Checkpoints of steps 16 and 20 are kept.
    EXPECT_TRUE(
        fs::exists(dir_ / "out" / "trials" / r.trial.name / "checkpoints" / "ckpt-0000000020.hck"));
  }
  auto ranked = RankResults(results);
  EXPECT_EQ(ranked[0].trial.name, "j-lr3e-3");  // the largest learning rate decays fastest
  EXPECT_LE(ranked[0].final_val_loss, ranked[1].final_val_loss);
  EXPECT_LE(ranked[1].final_val_loss, ranked[2].final_val_loss);
}

TEST_F(LocalRunnerTest, SecondRunReusesFinishedTrials) {
  std::vector<TrialResult> first, second;
  ASSERT_TRUE(Run(Job(), &first).ok());
  EXPECT_EQ(factory_.created, 3);
  ASSERT_TRUE(Run(Job(), &second).ok());
  EXPECT_EQ(factory_.created, 3) << "finished trials must not be trained again";
  for (size_t i = 0; i < first.size(); ++i) {
    EXPECT_EQ(second[i].state, "Succeeded");
    EXPECT_EQ(second[i].final_val_loss, first[i].final_val_loss);
    EXPECT_EQ(second[i].train_curve.size(), first[i].train_curve.size());
  }
  ASSERT_TRUE(Run(Job(), &second, /*restart=*/true).ok());
  EXPECT_EQ(factory_.created, 6) << "--restart trains again";
}

TEST_F(LocalRunnerTest, InterruptedRunResumesToTheSameLosses) {
  std::vector<TrialResult> straight;
  ASSERT_TRUE(Run(Job(), &straight).ok());
  fs::remove_all(dir_ / "out");

  std::atomic<bool> stop{false};
  factory_.on_step = [&](const std::string& trial, int64_t step) {
    if (trial == "j-lr3e-3" && step == 7) stop = true;  // not on a checkpoint boundary
  };
  std::vector<TrialResult> partial;
  Status s = Run(Job(), &partial, false, &stop);
  EXPECT_EQ(s.code(), StatusCode::kCancelled);
  // Sharded-LRTF interleaves the trials' steps on the device, in an order that follows the
  // measured step times; whatever ran, the interrupted trial stopped exactly where it was.
  EXPECT_EQ(partial[1].state, "Interrupted");
  EXPECT_EQ(partial[1].step, 7);
  // The interrupted trial checkpointed where it stopped.
  EXPECT_TRUE(fs::exists(dir_ / "out/trials/j-lr3e-3/checkpoints/ckpt-0000000007.hck"));

  factory_.on_step = nullptr;
  std::vector<TrialResult> resumed;
  ASSERT_TRUE(Run(Job(), &resumed).ok());
  EXPECT_EQ(resumed[1].resumed_from_step, 7);
  bool resumed_message = false;
  for (const auto& m : progress_.messages) {
    resumed_message =
        resumed_message || m.find("resumed from the checkpoint of step 7") != std::string::npos;
  }
  EXPECT_TRUE(resumed_message);
  for (size_t i = 0; i < straight.size(); ++i) {
    ASSERT_EQ(resumed[i].train_curve.size(), straight[i].train_curve.size());
    for (size_t k = 0; k < straight[i].train_curve.size(); ++k) {
      EXPECT_EQ(resumed[i].train_curve[k].loss, straight[i].train_curve[k].loss);
    }
    EXPECT_EQ(resumed[i].final_val_loss, straight[i].final_val_loss);
  }
}

TEST_F(LocalRunnerTest, ChangedConfigurationIsNotResumedSilently) {
  std::atomic<bool> stop{false};
  factory_.on_step = [&](const std::string& trial, int64_t step) {
    if (trial == "j-lr1e-3" && step == 6) stop = true;
  };
  std::vector<TrialResult> results;
  EXPECT_EQ(Run(Job(20), &results, false, &stop).code(), StatusCode::kCancelled);
  factory_.on_step = nullptr;
  // Same trial names, different step budget: the checkpoint belongs to another configuration.
  std::vector<TrialResult> other;
  ASSERT_TRUE(Run(Job(30), &other).ok());
  EXPECT_EQ(other[0].state, "Failed");
  EXPECT_THAT(other[0].message, HasSubstr("different configuration"));
  EXPECT_THAT(other[0].message, HasSubstr("--restart"));
  ASSERT_TRUE(Run(Job(30), &other, /*restart=*/true).ok());
  EXPECT_EQ(other[0].state, "Succeeded");
}

TEST_F(LocalRunnerTest, CorruptLatestCheckpointFallsBackToThePreviousOne) {
  std::atomic<bool> stop{false};
  factory_.on_step = [&](const std::string& trial, int64_t step) {
    if (trial == "j-lr1e-3" && step == 10) stop = true;
  };
  std::vector<TrialResult> results;
  EXPECT_EQ(Run(Job(), &results, false, &stop).code(), StatusCode::kCancelled);
  const fs::path ckpts = dir_ / "out/trials/j-lr1e-3/checkpoints";
  ASSERT_TRUE(fs::exists(ckpts / "ckpt-0000000010.hck"));
  fs::resize_file(ckpts / "ckpt-0000000010.hck", 16);
  factory_.on_step = nullptr;
  ASSERT_TRUE(Run(Job(), &results).ok());
  EXPECT_EQ(results[0].resumed_from_step, 8);
  EXPECT_EQ(results[0].state, "Succeeded");
  bool warned = false;
  for (const auto& m : progress_.messages)
    warned = warned || m.find("corrupt") != std::string::npos;
  EXPECT_TRUE(warned);
}

TEST_F(LocalRunnerTest, DevicesRunTrialsInParallelWithoutOverlap) {
  std::vector<TrialResult> alone, parallel;
  ASSERT_TRUE(Run(Job(), &alone).ok());
  Schedule schedule;
  ASSERT_TRUE(Run(Job(), &parallel, /*restart=*/true, nullptr, /*devices=*/3, &schedule).ok());
  ASSERT_EQ(schedule.tasks.size(), 60u);  // 3 trials x 20 steps
  std::map<int, std::vector<ScheduledTask>> by_device;
  std::map<size_t, std::vector<ScheduledTask>> by_trial;
  for (const auto& t : schedule.tasks) {
    by_device[t.device].push_back(t);
    by_trial[t.trial].push_back(t);
  }
  auto no_overlap = [](std::vector<ScheduledTask> ts) {
    std::sort(ts.begin(), ts.end(),
              [](const ScheduledTask& a, const ScheduledTask& b) { return a.start < b.start; });
    for (size_t i = 1; i < ts.size(); ++i) {
      if (ts[i].start < ts[i - 1].end) return false;
    }
    return true;
  };
  for (const auto& [d, ts] : by_device) EXPECT_TRUE(no_overlap(ts)) << "device " << d;
  for (const auto& [t, ts] : by_trial) {
    EXPECT_TRUE(no_overlap(ts)) << "trial " << t;
    EXPECT_EQ(ts.size(), 20u);  // no trial starves
  }
  EXPECT_GT(by_device.size(), 1u);
  for (size_t i = 0; i < alone.size(); ++i) {
    ASSERT_EQ(parallel[i].state, "Succeeded");
    ASSERT_EQ(parallel[i].train_curve.size(), alone[i].train_curve.size());
    for (size_t k = 0; k < alone[i].train_curve.size(); ++k) {
      EXPECT_EQ(parallel[i].train_curve[k].loss, alone[i].train_curve[k].loss);
    }
  }
}

TEST_F(LocalRunnerTest, TrialWithLostResultFinishesFromItsFinalCheckpoint) {
  std::vector<TrialResult> first, second;
  ASSERT_TRUE(Run(Job(), &first).ok());
  fs::remove(dir_ / "out/trials/j-lr3e-3/result.json");
  ASSERT_TRUE(Run(Job(), &second).ok());
  EXPECT_EQ(factory_.created, 4);  // only the trial without result.json is rebuilt
  EXPECT_EQ(second[1].state, "Succeeded");
  EXPECT_EQ(second[1].step, 20);  // not one step past the budget
  EXPECT_EQ(second[1].train_curve.size(), 20u);
  EXPECT_EQ(second[1].final_val_loss, first[1].final_val_loss);
}

TEST_F(LocalRunnerTest, RestartDiscardsNothingWhenPreflightFails) {
  std::vector<TrialResult> results;
  ASSERT_TRUE(Run(Job(), &results).ok());
  factory_.refuse["j-lr2e-3"] = true;
  EXPECT_EQ(Run(Job(), &results, /*restart=*/true).code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(fs::exists(dir_ / "out/trials/j-lr1e-3/result.json"));
}

TEST_F(LocalRunnerTest, FailedTrialDoesNotStopTheOthers) {
  factory_.fail_at["j-lr3e-3"] = 3;
  std::vector<TrialResult> results;
  ASSERT_TRUE(Run(Job(), &results).ok());
  EXPECT_EQ(results[0].state, "Succeeded");
  EXPECT_EQ(results[1].state, "Failed");
  EXPECT_THAT(results[1].message, HasSubstr("injected failure at step 3"));
  EXPECT_EQ(results[2].state, "Succeeded");
  auto ranked = RankResults(results);
  EXPECT_EQ(ranked.back().state, "Failed");
  EXPECT_THAT(FormatRankedTable(ranked), HasSubstr("j-lr3e-3 failed: "));
}

TEST_F(LocalRunnerTest, PreflightErrorsComeBeforeAnyTraining) {
  factory_.refuse["j-lr2e-3"] = true;
  std::vector<TrialResult> results;
  Status s = Run(Job(), &results);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(factory_.created, 0);

  factory_.refuse.clear();
  fs::remove(dir_ / "corpus.txt");
  s = Run(Job(), &results);
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("corpus.txt"));
}

TEST_F(LocalRunnerTest, ResultsFilesHoldTheRequiredFields) {
  std::vector<TrialResult> results;
  ASSERT_TRUE(Run(Job(), &results).ok());
  auto ranked = RankResults(results);
  const std::string out = (dir_ / "out").string();
  ASSERT_TRUE(WriteResults(out, "j", ranked).ok());
  auto json = nlohmann::json::parse(*ReadFile(out + "/results.json"));
  EXPECT_EQ(json["job"], "j");
  ASSERT_EQ(json["trials"].size(), 3u);
  for (const char* key : {"name", "hyperparameters", "finalTrainLoss", "finalValLoss", "steps",
                          "tokensPerSecond", "wallSeconds", "shards", "peakDeviceBytes"}) {
    EXPECT_TRUE(json["trials"][0].contains(key)) << key;
  }
  EXPECT_EQ(json["trials"][0]["hyperparameters"]["learningRate"], 0.003);
  EXPECT_EQ(json["trials"][0]["shards"], 1);
  EXPECT_EQ(json["trials"][0]["peakDeviceBytes"], 1000);
  auto csv = *ReadFile(out + "/results.csv");
  EXPECT_THAT(csv, HasSubstr("rank,trial,learningRate,state,finalTrainLoss,finalValLoss"));
  EXPECT_THAT(csv, HasSubstr("\n1,j-lr3e-3,0.003,Succeeded,"));
  EXPECT_THAT(csv, HasSubstr(",shards,peakDeviceBytes,precision\n"));
  EXPECT_THAT(csv, HasSubstr(",1,1000,fp32\n"));
  Status plot = PlotLossCurves(out, ranked);
  if (plot.code() != StatusCode::kUnavailable) {
    ASSERT_TRUE(plot.ok()) << plot;
    EXPECT_GT(fs::file_size(out + "/loss.png"), 1000u);
  }
}

TEST_F(LocalRunnerTest, ProgressSinksRenderWithoutErrors) {
  std::vector<TrialResult> results;
  char* buf = nullptr;
  size_t len = 0;
  FILE* mem = open_memstream(&buf, &len);
  for (auto& sink : {MakeLogProgress(mem), MakeTerminalProgress(mem, 1000)}) {
    RunOptions o;
    o.output_dir = (dir_ / "out").string();
    o.restart = true;
    LocalRunner runner(&factory_, sink.get(), o);
    auto job = Job();
    ASSERT_TRUE(runner.Run(job, *ExpandTrials(job), &results).ok());
  }
  std::fclose(mem);
  std::string text(buf, len);
  free(buf);
  EXPECT_THAT(text, HasSubstr("j-lr1e-3 step 10/20 loss"));
  EXPECT_THAT(text, HasSubstr("3/3 trials succeeded"));
  EXPECT_THAT(text, HasSubstr("\x1b[1A\x1b[2K"));  // the live table redraws in place
  EXPECT_THAT(text, HasSubstr("[####################]"));
}

}  // namespace
}  // namespace hydra::cli
