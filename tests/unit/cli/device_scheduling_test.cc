// The local runner's Sharded-LRTF over several CPU devices with the real executor: losses equal
// those of trials trained alone, the recorded schedule never overlaps, and the simulator fed
// with the measured step times predicts the measured makespan.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>

#include "agent/executor/spilling_executor.h"
#include "cli/local_runner.h"
#include "cli/progress.h"

namespace hydra::cli {
namespace {

namespace fs = std::filesystem;

MultiModelJob Job(const fs::path& dir) {
  const std::string yaml = R"(apiVersion: hydra.dev/v1alpha1
kind: MultiModelJob
metadata: {name: sched}
spec:
  model: {family: gpt2, nLayer: 2, nEmbd: 128, nHead: 4, contextLength: 64}
  dataset: {path: )" + std::string(HYDRA_SOURCE_DIR) +
                           R"(/examples/data/corpus.txt, evalSequences: 8}
  search:
    grid:
      steps: [24, 12, 36, 6]
  training: {steps: 10, batchSize: 8, evalEverySteps: 0, checkpointEverySteps: 0}
)";
  auto job = ParseJobYaml(yaml, dir.string());
  EXPECT_TRUE(job.ok()) << job.status();
  return *job;
}

TEST(DeviceSchedulingTest, ParallelTrialsMatchAloneAndTheSimulator) {
  const fs::path dir = fs::temp_directory_path() / ("hydra_sched_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  executor::ExecutorOptions eo;
  eo.threads = 1;  // 2 CPU devices of one thread each share the 2 cores
  auto factory = executor::MakeExecutorFactory(eo);
  auto progress = MakeQuietProgress(stderr);
  MultiModelJob job = Job(dir);
  auto trials = ExpandTrials(job);
  ASSERT_TRUE(trials.ok());

  auto run = [&](int devices, std::vector<TrialResult>* results, Schedule* schedule) {
    RunOptions o;
    o.output_dir = (dir / ("out" + std::to_string(devices))).string();
    o.devices = devices;
    LocalRunner runner(factory.get(), progress.get(), o);
    ASSERT_TRUE(runner.Run(job, *trials, results).ok());
    *schedule = runner.schedule();
  };
  std::vector<TrialResult> alone, parallel;
  Schedule s1, s2;
  run(1, &alone, &s1);
  run(2, &parallel, &s2);

  // Every trial ends with the losses it has when trained alone.
  for (size_t i = 0; i < alone.size(); ++i) {
    ASSERT_EQ(parallel[i].state, "Succeeded") << parallel[i].message;
    ASSERT_EQ(parallel[i].train_curve.size(), alone[i].train_curve.size());
    for (size_t k = 0; k < alone[i].train_curve.size(); ++k) {
      EXPECT_EQ(parallel[i].train_curve[k].loss, alone[i].train_curve[k].loss) << i << " " << k;
    }
  }
  // The recorded schedule: each task is one step; no overlap per device or per trial.
  std::vector<TrialProfile> profiles;
  std::map<size_t, double> busy;
  std::map<size_t, int64_t> count;
  for (const auto& t : s2.tasks) {
    busy[t.trial] += t.end - t.start;
    ++count[t.trial];
  }
  for (size_t i = 0; i < trials->size(); ++i) {
    // Measured mean step time of each trial: its profile.
    profiles.push_back({(*trials)[i].name, {{"step", busy[i] / count[i], 0}}, count[i]});
  }
  Schedule reindexed = s2;
  for (auto& t : reindexed.tasks) t.task = 0;
  std::map<size_t, int64_t> seen;
  std::sort(reindexed.tasks.begin(), reindexed.tasks.end(),
            [](const ScheduledTask& a, const ScheduledTask& b) { return a.start < b.start; });
  for (auto& t : reindexed.tasks) t.minibatch = seen[t.trial]++;
  Status check = CheckSchedule(profiles, reindexed);
  EXPECT_TRUE(check.ok()) << check;

  // The simulator, given the measured step times, predicts the measured makespan within 15%.
  double first = 1e300, last = 0;
  for (const auto& t : s2.tasks) {
    first = std::min(first, t.start);
    last = std::max(last, t.end);
  }
  SimulationOptions so;
  so.devices = 2;
  auto lrtf = MakeShardedLrtfPolicy();
  const double simulated = Simulate(profiles, lrtf.get(), so).makespan;
  const double measured = last - first;
  std::cout << "measured makespan " << measured << " s, simulated " << simulated << " s\n";
  EXPECT_NEAR(simulated, measured, 0.15 * measured);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace hydra::cli

namespace hydra::cli {
namespace {

TEST(DeviceSchedulingTest, ShardTasksOfOneTrialRunOnAnyDeviceWithTheLossesOfTrainingAlone) {
  const fs::path dir = fs::temp_directory_path() / ("hydra_shards_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const std::string yaml = R"(apiVersion: hydra.dev/v1alpha1
kind: MultiModelJob
metadata: {name: shards}
spec:
  model: {family: gpt2, nLayer: 3, nEmbd: 64, nHead: 2, contextLength: 32}
  dataset: {path: )" + std::string(HYDRA_SOURCE_DIR) +
                           R"(/examples/data/corpus.txt, evalSequences: 4}
  search:
    grid:
      learningRate: [1.0e-3, 2.0e-3, 3.0e-3]
  training: {steps: 8, batchSize: 4, gradClipNorm: 1.0, evalEverySteps: 0,
             checkpointEverySteps: 0}
  resources: {deviceMemoryBudget: 3Mi}
)";
  auto job = ParseJobYaml(yaml, dir.string());
  ASSERT_TRUE(job.ok()) << job.status();
  auto trials = ExpandTrials(*job);
  ASSERT_TRUE(trials.ok());
  executor::ExecutorOptions eo;
  eo.threads = 1;
  auto factory = executor::MakeExecutorFactory(eo);
  auto progress = MakeQuietProgress(stderr);
  auto run = [&](int devices, std::vector<TrialResult>* results, Schedule* schedule,
                 std::unique_ptr<SchedulingPolicyInterface> policy = nullptr) {
    RunOptions o;
    o.output_dir = (dir / ("out" + std::to_string(devices) + (policy ? "p" : ""))).string();
    o.devices = devices;
    LocalRunner runner(factory.get(), progress.get(), o, std::move(policy));
    ASSERT_TRUE(runner.Run(*job, *trials, results).ok());
    *schedule = runner.schedule();
  };
  std::vector<TrialResult> alone, parallel, rotated;
  Schedule s1, s2, s3;
  run(1, &alone, &s1);
  run(2, &parallel, &s2);
  // FIFO hands a released trial to whichever device frees up next: with 3 trials on 2 devices
  // its next shard-task runs on the other device.
  run(2, &rotated, &s3, MakeFifoPolicy());
  ASSERT_GE(alone[0].shards, 3) << "the budget must cut the model into several shards";

  // Losses equal to training alone, bit for bit.
  for (const auto* runs : {&parallel, &rotated}) {
    for (size_t i = 0; i < alone.size(); ++i) {
      ASSERT_EQ((*runs)[i].state, "Succeeded") << (*runs)[i].message;
      ASSERT_EQ((*runs)[i].train_curve.size(), alone[i].train_curve.size());
      for (size_t k = 0; k < alone[i].train_curve.size(); ++k) {
        EXPECT_EQ((*runs)[i].train_curve[k].loss, alone[i].train_curve[k].loss) << i << " " << k;
      }
    }
  }
  const size_t per_step = 3 * static_cast<size_t>(alone[0].shards) - 1;
  auto check = [&](const Schedule& schedule) -> int {
    // The schedule holds shard-tasks: 2S-1 per step, plus S applies with clipping.
    EXPECT_EQ(schedule.tasks.size(), trials->size() * 8 * per_step);
    if (schedule.tasks.size() != trials->size() * 8 * per_step) return 0;
    std::map<size_t, std::vector<ScheduledTask>> by_trial;
    std::map<int, std::vector<ScheduledTask>> by_device;
    for (const auto& t : schedule.tasks) {
      by_trial[t.trial].push_back(t);
      by_device[t.device].push_back(t);
    }
    auto by_start = [](std::vector<ScheduledTask>& ts) {
      std::sort(ts.begin(), ts.end(),
                [](const ScheduledTask& a, const ScheduledTask& b) { return a.start < b.start; });
    };
    for (auto& [d, ts] : by_device) {
      by_start(ts);
      for (size_t i = 1; i < ts.size(); ++i)
        EXPECT_GE(ts[i].start, ts[i - 1].end) << "device " << d;
    }
    int steps_on_two_devices = 0;
    for (auto& [trial, ts] : by_trial) {
      by_start(ts);
      for (size_t i = 0; i < ts.size(); ++i) {
        // A trial's tasks run one at a time, in order: step by step, task by task.
        EXPECT_EQ(ts[i].minibatch, static_cast<int64_t>(i / per_step)) << trial << " " << i;
        EXPECT_EQ(ts[i].task, i % per_step) << trial << " " << i;
        if (i > 0) {
          EXPECT_GE(ts[i].start, ts[i - 1].end) << trial << " " << i;
        }
      }
      for (size_t s = 0; s < ts.size(); s += per_step) {
        std::set<int> devices;
        for (size_t i = s; i < s + per_step; ++i) devices.insert(ts[i].device);
        steps_on_two_devices += devices.size() > 1;
      }
    }
    return steps_on_two_devices;
  };
  const int lrtf_spread = check(s2), fifo_spread = check(s3);
  std::cout << "steps whose shard-tasks ran on both devices, of " << trials->size() * 8
            << ": Sharded-LRTF " << lrtf_spread << ", FIFO " << fifo_spread << "\n";
  EXPECT_GT(fifo_spread, 0);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace hydra::cli
