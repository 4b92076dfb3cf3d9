#include "agent/scheduler/trial_scheduler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>

#include "agent/executor/checkpoint.h"
#include "common/partitioner.h"
#include "tests/fakes/fake_executor.h"

namespace hydra::agent {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class RecordingObserver : public TrialObserverInterface {
 public:
  void OnTrialUpdate(const TrialResult& r) override {
    std::lock_guard<std::mutex> lock(mu);
    states[r.trial.name].push_back(r.state);
  }
  void OnTrialMessage(const Trial& trial, const std::string& m) override {
    std::lock_guard<std::mutex> lock(mu);
    messages.push_back(trial.name + ": " + m);
  }
  void OnStep(const std::string& trial, int device, double, int64_t, bool) override {
    std::lock_guard<std::mutex> lock(mu);
    steps_per_device[device] += 1;
    step_devices[trial].push_back(device);
  }
  void OnCheckpoint(const std::string&, double seconds) override {
    std::lock_guard<std::mutex> lock(mu);
    checkpoints += 1;
    EXPECT_GE(seconds, 0);
  }
  std::mutex mu;
  std::map<std::string, std::vector<std::string>> states;
  std::map<int, int> steps_per_device;
  std::map<std::string, std::vector<int>> step_devices;  // trial -> the device of each step
  std::vector<std::string> messages;
  int checkpoints = 0;
};

/// Counts the executors alive (a disk-tier trial's spill files exist while it has one), and
/// the admissions made and handed to Build.
class HoldingFactory : public executor::ExecutorFactoryInterface {
 public:
  explicit HoldingFactory(executor::ExecutorFactoryInterface* inner) : inner_(inner) {}
  StatusOr<Admission> Admit(const Trial& t, const executor::TokenDataset& d) override {
    ++admitted;
    return inner_->Admit(t, d);
  }
  StatusOr<std::unique_ptr<executor::TrialExecutorInterface>> Build(
      const Trial& t, std::shared_ptr<const executor::TokenDataset> d, const Admission& a,
      int device) override {
    {
      std::lock_guard<std::mutex> lock(mu);
      built_with.push_back(a);
    }
    auto e = inner_->Build(t, d, a, device);
    if (!e.ok()) return e.status();
    return std::unique_ptr<executor::TrialExecutorInterface>(new Held(std::move(e).value(), &held));
  }
  std::atomic<int> held{0};
  std::atomic<int> admitted{0};
  std::mutex mu;
  std::vector<Admission> built_with;  // guarded by mu

 private:
  class Held : public executor::TrialExecutorInterface {
   public:
    Held(std::unique_ptr<executor::TrialExecutorInterface> e, std::atomic<int>* n)
        : e_(std::move(e)), n_(n) {
      ++*n_;
    }
    ~Held() override { --*n_; }
    StatusOr<executor::StepMetrics> TrainStep() override { return e_->TrainStep(); }
    StatusOr<executor::TaskResult> RunTask() override { return e_->RunTask(); }
    bool InStep() const override { return e_->InStep(); }
    StatusOr<double> Evaluate() override { return e_->Evaluate(); }
    int64_t step() const override { return e_->step(); }
    StatusOr<std::vector<executor::NamedBuffer>> ExportState() override {
      return e_->ExportState();
    }
    Status ImportState(int64_t step, const std::vector<executor::NamedBuffer>& s) override {
      return e_->ImportState(step, s);
    }
    executor::ExecutorStats stats() const override { return e_->stats(); }
    int BoundDevice() const override { return e_->BoundDevice(); }
    Status MoveTo(int device) override { return e_->MoveTo(device); }
    bool MayMoveNow() const override { return e_->MayMoveNow(); }

   private:
    std::unique_ptr<executor::TrialExecutorInterface> e_;
    std::atomic<int>* n_;
  };
  executor::ExecutorFactoryInterface* inner_;
};

class TrialSchedulerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("hydra_sched_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    std::ofstream(dir_ / "corpus.txt") << std::string(4000, 'a');
  }
  void TearDown() override { fs::remove_all(dir_); }

  Trial MakeTrial(const std::string& name, int64_t steps, double lr = 1e-3) {
    Trial t;
    t.name = name;
    t.model = {ModelFamily::kGpt2, 1, 8, 2, 8, 256};
    t.training.steps = steps;
    t.training.learning_rate = lr;
    t.training.batch_size = 2;
    t.training.eval_every_steps = 5;
    t.training.checkpoint_every_steps = 4;
    t.dataset.path = t.dataset.resolved_path = (dir_ / "corpus.txt").string();
    return t;
  }
  std::string Ckpt(const std::string& name) { return (dir_ / "ckpt" / name).string(); }
  /// The device peak of `t`'s plan (its executors' DeviceNeed); 0 and a failure if unplanned.
  static int64_t PlannedPeak(const Trial& t) {
    auto planned = PlanAdmission(t, PartitionOptionsFor(t));
    EXPECT_TRUE(planned.ok()) << planned.status();
    return planned.ok() ? planned->plan.peak_device_bytes : 0;
  }

  /// Device 1 holds one trial at a time, device 0 two. Three trials of 60 steps: the one on
  /// device 1 ends when the two sharing device 0 are half done, and device 1, with nothing of
  /// its own left, takes one of them over (MoveTo). Every trial succeeds, every step runs where
  /// the trial's executor is, and only device 1 ran out of work. How many moves there were.
  int TakenOver() {
    factory_.bind_to_devices = true;
    factory_.step_delay = std::chrono::milliseconds(2);
    Trial probe = MakeTrial("probe", 60);
    const int64_t need = PlannedPeak(probe);
    if (need <= 0) return 0;
    std::atomic<bool> hold{true};
    TrialSchedulerOptions o;
    o.devices = 2;
    o.device_memory_bytes = {2 * need, need};
    o.hold = &hold;
    TrialScheduler s(&factory_, &observer_, o, MakeRoundRobinPolicy());
    for (const char* name : {"a", "b", "c"}) EXPECT_TRUE(Submit(s, MakeTrial(name, 60)).ok());
    hold = false;
    EXPECT_TRUE(s.WaitIdle(std::chrono::seconds(30)));
    std::lock_guard<std::mutex> lock(observer_.mu);
    std::lock_guard<std::mutex> log(factory_.devices.mu);
    int moved = 0;
    for (const char* name : {"a", "b", "c"}) {
      SCOPED_TRACE(name);
      EXPECT_EQ(s.Get(name)->state, kTrialSucceeded);
      EXPECT_EQ(observer_.step_devices[name], factory_.devices.stepped_on[name]);
      for (int to : factory_.devices.moves[name]) {
        EXPECT_EQ(to, 1) << "only device 1 ran out";
        ++moved;
      }
    }
    return moved;
  }

  /// Trains `t` on a scheduler of its own until it reaches `step`, then drains it there (its
  /// checkpoint in Ckpt(t.name), as a node that went away leaves it); its record then.
  TrialResult DrainedAt(const Trial& t, int64_t step, const std::string& reason) {
    std::atomic<bool> hold{false};
    factory_.on_step = [&](const std::string&, int64_t s) {
      if (s == step) hold = true;
    };
    TrialSchedulerOptions o;
    o.hold = &hold;
    TrialResult drained;
    {
      TrialScheduler first(&factory_, &observer_, o);
      EXPECT_TRUE(Submit(first, t).ok());
      while (!hold) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      EXPECT_TRUE(first.Drain(reason).ok());
      drained = *first.Get(TrialKey(t));
    }
    factory_.on_step = nullptr;
    return drained;
  }

  /// Submits `t`, which may train to `step_limit` only (early stopping's limit; 0: to the end).
  Status Submit(TrialScheduler& s, const Trial& t, int64_t step_limit = 0) {
    auto p = s.Prepare(t, Ckpt(t.name));
    if (!p.ok()) return p.status();
    p->step_limit = step_limit;
    return s.Submit(std::move(p).value());
  }

  fs::path dir_;
  fakes::FakeExecutorFactory factory_;
  RecordingObserver observer_;
};

TEST_F(TrialSchedulerTest, TrialsSubmittedWhileOthersRunAllFinish) {
  TrialScheduler s(&factory_, &observer_, {2});
  ASSERT_TRUE(Submit(s, MakeTrial("a", 12)).ok());
  ASSERT_TRUE(Submit(s, MakeTrial("b", 8)).ok());
  ASSERT_TRUE(s.WaitIdle(std::chrono::seconds(20)));
  ASSERT_TRUE(Submit(s, MakeTrial("c", 6)).ok());  // after the first ones ended
  ASSERT_TRUE(s.WaitIdle(std::chrono::seconds(20)));
  auto all = s.Snapshot();
  ASSERT_EQ(all.size(), 3u);
  for (const auto& r : all) {
    EXPECT_EQ(r.state, kTrialSucceeded) << r.trial.name << ": " << r.message;
    EXPECT_EQ(r.step, r.trial.training.steps);
    EXPECT_EQ(r.last_checkpoint_step, r.step);
  }
  EXPECT_TRUE(fs::exists(Ckpt("c") + "/ckpt-0000000006.hck"));
  EXPECT_GT(observer_.checkpoints, 0);
  EXPECT_EQ(observer_.states["c"].front(), kTrialPending);
  EXPECT_EQ(observer_.states["c"].back(), kTrialSucceeded);
}

TEST_F(TrialSchedulerTest, DuplicateNamesAreRefusedUntilTheTrialEnds) {
  factory_.step_delay = std::chrono::milliseconds(5);
  TrialScheduler s(&factory_, &observer_, {1});
  ASSERT_TRUE(Submit(s, MakeTrial("a", 50)).ok());
  Status again = Submit(s, MakeTrial("a", 50));
  EXPECT_EQ(again.code(), StatusCode::kAlreadyExists) << again;
  ASSERT_TRUE(s.Cancel("a").ok());
  ASSERT_TRUE(s.WaitIdle(std::chrono::seconds(10)));
  // Cancelled: it may be assigned again, and resumes from its checkpoint.
  ASSERT_TRUE(Submit(s, MakeTrial("a", 50)).ok());
  ASSERT_TRUE(s.WaitIdle(std::chrono::seconds(20)));
  auto r = s.Get("a");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->state, kTrialSucceeded);
  EXPECT_EQ(s.Snapshot().size(), 1u) << "the replaced run is no longer listed";
  EXPECT_EQ(Submit(s, MakeTrial("a", 50)).code(), StatusCode::kAlreadyExists)
      << "a succeeded trial is not trained again";
}

TEST_F(TrialSchedulerTest, CancelStopsARunningTrialAndAPendingOne) {
  factory_.step_delay = std::chrono::milliseconds(20);
  TrialSchedulerOptions o;
  o.devices = 1;
  TrialScheduler s(&factory_, &observer_, o);
  ASSERT_TRUE(Submit(s, MakeTrial("long", 1000)).ok());
  ASSERT_TRUE(Submit(s, MakeTrial("other", 1000, 2e-3)).ok());
  // Wait until one of them runs.
  for (int i = 0; i < 200; ++i) {
    auto a = s.Get("long"), b = s.Get("other");
    if (a->step + b->step > 2) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(s.Cancel("long").ok());
  ASSERT_TRUE(s.Cancel("other").ok());
  ASSERT_TRUE(s.WaitIdle(std::chrono::seconds(5)));
  for (const char* name : {"long", "other"}) {
    auto r = s.Get(name);
    EXPECT_EQ(r->state, kTrialCancelled);
    EXPECT_THAT(r->message, HasSubstr("cancelled at step"));
    EXPECT_LT(r->step, 1000);
  }
  EXPECT_EQ(s.Cancel("long").code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.Cancel("nobody").code(), StatusCode::kNotFound);
}

/// Polls until the trial of `key` reached `step` (at most 20 s).
bool WaitForStep(TrialScheduler& s, const std::string& key, int64_t step) {
  for (int i = 0; i < 2000; ++i) {
    if (s.Get(key)->step >= step) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

TEST_F(TrialSchedulerTest, AStepLimitHoldsATrialEvaluatedThereUntilItRises) {
  TrialScheduler s(&factory_, &observer_, {1});
  ASSERT_TRUE(Submit(s, MakeTrial("a", 20), 7)
                  .ok());  // not an evaluation step (evalEverySteps 5): evaluated anyway
  ASSERT_TRUE(WaitForStep(s, "a", 7));
  EXPECT_FALSE(s.WaitIdle(std::chrono::milliseconds(300)));  // it waits, not ends
  auto held = s.Get("a");
  EXPECT_EQ(held->step, 7);
  EXPECT_EQ(held->state, kTrialRunning);
  ASSERT_FALSE(held->val_curve.empty());
  EXPECT_EQ(held->val_curve.back().step, 7);
  EXPECT_DOUBLE_EQ(held->eta_seconds, 0);  // nothing left to reach for now
  EXPECT_EQ(held->step_limit, 7);
  EXPECT_TRUE(IsWaitingAtLimit(*held));
  ASSERT_TRUE(s.SetStepLimit("a", 20).ok());
  ASSERT_TRUE(s.WaitIdle(std::chrono::seconds(20)));
  EXPECT_EQ(s.Get("a")->state, kTrialSucceeded);
  EXPECT_EQ(s.Get("a")->step, 20);
  EXPECT_EQ(s.Get("a")->step_limit, 0);
  EXPECT_FALSE(IsWaitingAtLimit(*s.Get("a")));
  EXPECT_EQ(s.SetStepLimit("a", 30).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.StopEarly("nobody", "x").code(), StatusCode::kNotFound);
}

TEST_F(TrialSchedulerTest, StopEarlyEndsAWaitingTrialWithItsCheckpoint) {
  TrialScheduler s(&factory_, &observer_, {1});
  ASSERT_TRUE(Submit(s, MakeTrial("a", 20), 7).ok());
  ASSERT_TRUE(WaitForStep(s, "a", 7));
  ASSERT_TRUE(s.StopEarly("a", "asha: not in the top third").ok());
  ASSERT_TRUE(s.WaitIdle(std::chrono::seconds(20)));
  auto r = s.Get("a");
  EXPECT_EQ(r->state, kTrialEarlyStopped);
  EXPECT_EQ(r->step, 7);
  EXPECT_THAT(r->message, HasSubstr("stopped early (asha: not in the top third) at step 7"));
  EXPECT_EQ(r->final_val_loss, r->val_curve.back().loss);
  EXPECT_TRUE(std::isfinite(r->final_train_loss));
  EXPECT_EQ(r->last_checkpoint_step, 7);
  executor::CheckpointStore store(Ckpt("a"));
  ASSERT_FALSE(store.Steps()->empty());
  EXPECT_EQ(store.Steps()->back(), 7);  // kept: the trial can be resumed or inspected
  EXPECT_TRUE(IsFinalTrialState(r->state));
}

TEST_F(TrialSchedulerTest, SuspendCheckpointsARunningTrialAndASecondSubmitResumesIt) {
  factory_.step_delay = std::chrono::milliseconds(5);
  TrialScheduler s(&factory_, &observer_, {1});
  auto p = s.Prepare(MakeTrial("a", 400), Ckpt("a"));
  ASSERT_TRUE(p.ok());
  ASSERT_TRUE(s.Submit(std::move(p).value()).ok());
  ASSERT_TRUE(WaitForStep(s, "a", 3));
  ASSERT_TRUE(s.Suspend("a", "suspended").ok());
  ASSERT_TRUE(s.WaitIdle(std::chrono::seconds(20)));
  auto r = s.Get("a");
  EXPECT_EQ(r->state, kTrialInterrupted);
  EXPECT_THAT(r->message, HasSubstr("suspended at step " + std::to_string(r->step)));
  EXPECT_EQ(r->last_checkpoint_step, r->step);
  EXPECT_TRUE(std::isnan(r->final_val_loss)) << "not final: it resumes";
  const int64_t at = r->step;
  EXPECT_EQ(executor::CheckpointStore(Ckpt("a")).Steps()->back(), at);
  EXPECT_EQ(s.Suspend("a", "again").code(), StatusCode::kFailedPrecondition);
  // Submitted again (as the controller does on resume): it goes on from that checkpoint.
  auto again = s.Prepare(MakeTrial("a", 400), Ckpt("a"));
  ASSERT_TRUE(again.ok());
  ASSERT_TRUE(s.Submit(std::move(again).value()).ok());
  ASSERT_TRUE(WaitForStep(s, "a", at + 2));
  EXPECT_EQ(s.Get("a")->resumed_from_step, at);
}

TEST_F(TrialSchedulerTest, TrialsWaitingAtTheirLimitMakeRoomAndResumeToTheSameLosses) {
  std::vector<CurvePoint> straight;
  {
    TrialScheduler s(&factory_, &observer_, {1});
    ASSERT_TRUE(Submit(s, MakeTrial("t1", 12)).ok());
    ASSERT_TRUE(s.WaitIdle(std::chrono::seconds(20)));
    straight = s.Get("t1")->train_curve;
  }
  fs::remove_all(dir_ / "ckpt");
  TrialSchedulerOptions o;
  o.devices = 1;
  o.host_memory_bytes = 1;  // one trial admitted at a time
  TrialScheduler s(&factory_, &observer_, o);
  for (const char* name : {"t1", "t2"}) ASSERT_TRUE(Submit(s, MakeTrial(name, 12), 6).ok());
  // t1 waits at 6 holding the only admission: it is checkpointed and parked so t2 can run.
  ASSERT_TRUE(WaitForStep(s, "t2", 6));
  EXPECT_EQ(s.Get("t1")->step, 6);
  ASSERT_TRUE(s.SetStepLimit("t1", 0).ok());
  ASSERT_TRUE(s.SetStepLimit("t2", 0).ok());
  ASSERT_TRUE(s.WaitIdle(std::chrono::seconds(20)));
  for (const char* name : {"t1", "t2"}) {
    auto r = s.Get(name);
    EXPECT_EQ(r->state, kTrialSucceeded) << name << ": " << r->message;
    EXPECT_EQ(r->step, 12);
  }
  EXPECT_EQ(s.Get("t1")->resumed_from_step, 6);
  const auto curve = s.Get("t1")->train_curve;
  ASSERT_EQ(curve.size(), straight.size());
  for (size_t i = 0; i < curve.size(); ++i) EXPECT_EQ(curve[i].loss, straight[i].loss) << i;
}

TEST_F(TrialSchedulerTest, ATrialResumedPastItsLimitIsEvaluatedWhereItStands) {
  const TrialResult drained = DrainedAt(MakeTrial("x", 20), 8, "stopped");
  ASSERT_EQ(drained.step, 8);
  ASSERT_EQ(drained.val_curve.back().step, 5);  // evaluations every 5 steps
  TrialScheduler s(&factory_, &observer_, {1});
  ASSERT_TRUE(
      Submit(s, MakeTrial("x", 20), 5).ok());  // early stopping's first rung, behind the checkpoint
  auto last_evaluation = [&] {
    const auto curve = s.Get("x")->val_curve;
    return curve.empty() ? int64_t{-1} : curve.back().step;
  };
  for (int i = 0; i < 2000 && last_evaluation() != 8; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(last_evaluation(), 8);  // a result to decide on
  EXPECT_EQ(s.Get("x")->step, 8);   // and no step past the limit
  ASSERT_TRUE(s.StopEarly("x", "median").ok());
  ASSERT_TRUE(s.WaitIdle(std::chrono::seconds(20)));
  EXPECT_EQ(s.Get("x")->state, kTrialEarlyStopped);
  EXPECT_EQ(s.Get("x")->final_val_loss, s.Get("x")->val_curve.back().loss);
}

TEST_F(TrialSchedulerTest, DrainCheckpointsEveryUnfinishedTrialAndRefusesMore) {
  factory_.step_delay = std::chrono::milliseconds(10);
  TrialSchedulerOptions o;
  o.devices = 2;
  o.host_memory_bytes = 1;  // admits one trial at a time: the others stay pending
  TrialScheduler s(&factory_, &observer_, o);
  for (const char* name : {"t1", "t2", "t3"}) ASSERT_TRUE(Submit(s, MakeTrial(name, 1000)).ok());
  for (int i = 0; i < 300 && s.Get("t1")->step < 3; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(s.Drain("drained").ok());
  EXPECT_TRUE(s.draining());
  auto t1 = s.Get("t1");
  EXPECT_EQ(t1->state, kTrialInterrupted);
  EXPECT_THAT(t1->message, HasSubstr("drained at step " + std::to_string(t1->step)));
  EXPECT_EQ(t1->last_checkpoint_step, t1->step);
  executor::CheckpointStore store(Ckpt("t1"));
  ASSERT_FALSE(store.Steps()->empty());
  EXPECT_EQ(store.Steps()->back(), t1->step);
  EXPECT_EQ(s.Get("t3")->state, kTrialInterrupted);
  EXPECT_EQ(s.Get("t3")->step, 0);
  EXPECT_EQ(Submit(s, MakeTrial("t4", 5)).code(), StatusCode::kUnavailable);
  // Idle soon after (a generous bound: a loaded CI machine is slow, not wrong).
  EXPECT_TRUE(s.WaitIdle(std::chrono::seconds(10)));
}

TEST_F(TrialSchedulerTest, InterruptedTrialResumesOnAnotherSchedulerToTheSameLosses) {
  std::vector<CurvePoint> straight;
  {
    TrialScheduler s(&factory_, &observer_, {1});
    ASSERT_TRUE(Submit(s, MakeTrial("x", 30)).ok());
    ASSERT_TRUE(s.WaitIdle(std::chrono::seconds(20)));
    straight = s.Get("x")->train_curve;
  }
  fs::remove_all(dir_ / "ckpt");
  EXPECT_EQ(DrainedAt(MakeTrial("x", 30), 11, "node lost").step, 11);
  TrialScheduler second(&factory_, &observer_, {1});  // another node, same shared storage
  ASSERT_TRUE(Submit(second, MakeTrial("x", 30)).ok());
  ASSERT_TRUE(second.WaitIdle(std::chrono::seconds(20)));
  auto r = second.Get("x");
  EXPECT_EQ(r->resumed_from_step, 11);
  ASSERT_EQ(r->train_curve.size(), straight.size());
  for (size_t i = 0; i < straight.size(); ++i) {
    EXPECT_EQ(r->train_curve[i].loss, straight[i].loss) << i;
  }
}

TEST_F(TrialSchedulerTest, ADivergedTrialResumesFromItsCheckpoint) {
  // A learning rate too large for the fake model: its loss is infinite from about step 103, and
  // the checkpoints' curves hold it (as null: JSON has no infinity). A resume once failed on
  // them ("checkpoint metadata ...": DATA_LOSS), every time, and the trial ended Failed.
  const Trial t = MakeTrial("x", 120, /*lr=*/10);
  const TrialResult drained = DrainedAt(t, 110, "node lost");
  ASSERT_EQ(drained.step, 110);
  ASSERT_TRUE(std::isinf(drained.train_curve.back().loss));
  TrialScheduler second(&factory_, &observer_, {1});
  ASSERT_TRUE(Submit(second, t).ok());
  ASSERT_TRUE(second.WaitIdle(std::chrono::seconds(20)));
  auto r = second.Get("x");
  EXPECT_EQ(r->state, kTrialSucceeded) << r->message;
  EXPECT_EQ(r->resumed_from_step, 110);
  ASSERT_EQ(r->train_curve.size(), 120u);
  EXPECT_TRUE(std::isfinite(r->train_curve.front().loss));
  EXPECT_TRUE(std::isnan(r->train_curve[108].loss)) << "what the checkpoint recorded";
  EXPECT_TRUE(std::isinf(r->train_curve.back().loss)) << "trained after the resume";
}

TEST_F(TrialSchedulerTest, AResumeUnderAnotherThreadCountSaysItIsNotBitExact) {
  auto run_until_drained = [&](int threads, const std::string& cpu) {
    std::atomic<bool> hold{false};
    factory_.on_step = [&](const std::string&, int64_t step) {
      if (step % 4 == 3) hold = true;
    };
    TrialSchedulerOptions o;
    o.hold = &hold;
    o.threads = threads;
    o.cpu = cpu;
    TrialScheduler s(&factory_, &observer_, o);
    ASSERT_TRUE(Submit(s, MakeTrial("x", 30)).ok());
    while (!hold) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ASSERT_TRUE(s.Drain("stopped").ok());
    factory_.on_step = nullptr;
  };
  auto notices = [&] {
    std::lock_guard<std::mutex> lock(observer_.mu);
    std::vector<std::string> out;
    for (const auto& m : observer_.messages) {
      if (m.find("bit-exactly") != std::string::npos) out.push_back(m);
    }
    observer_.messages.clear();
    return out;
  };
  run_until_drained(2, "cpu A");
  run_until_drained(2, "cpu A");  // the same numerics: nothing to say
  EXPECT_THAT(notices(), ::testing::IsEmpty());
  run_until_drained(1, "cpu A");
  EXPECT_THAT(notices(), ::testing::ElementsAre(HasSubstr("2 threads per device, now 1")));
  run_until_drained(1, "cpu B");
  EXPECT_THAT(notices(), ::testing::ElementsAre(HasSubstr("CPU cpu A, now cpu B")));
}

TEST_F(TrialSchedulerTest, RefusesATrialLargerThanTheHostMemoryWhenAskedTo) {
  TrialSchedulerOptions o;
  o.host_memory_bytes = 1000;
  o.refuse_over_host_memory = true;
  TrialScheduler s(&factory_, &observer_, o);
  auto p = s.Prepare(MakeTrial("big", 10), Ckpt("big"));
  ASSERT_EQ(p.status().code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(p.status().message(), HasSubstr("host memory"));
  EXPECT_THAT(p.status().message(), HasSubstr("1000 bytes"));
  EXPECT_TRUE(s.Snapshot().empty());
}

TEST_F(TrialSchedulerTest, DiskSpillingTrialsAreAdmittedWhileAllTheirSpillFilesFit) {
  // Four trials whose state lives on disk; the spill directory holds two trials' files.
  std::vector<Trial> trials;
  for (const char* n : {"d1", "d2", "d3", "d4"}) {
    Trial t = MakeTrial(n, 6);
    t.model = {ModelFamily::kGpt2, 4, 32, 2, 16, 256};
    t.resources.device_memory_budget = 900 * 1024;
    t.resources.offload = OffloadTier::kDisk;
    trials.push_back(t);
  }
  auto plan = PlanShards(trials[0], PartitionOptionsFor(trials[0]));
  ASSERT_TRUE(plan.ok()) << plan.status();
  const int64_t need = SpillDiskBytes(trials[0], *plan);
  ASSERT_GT(need, 0) << "the trial must spill to disk";
  TrialSchedulerOptions o;
  o.devices = 4;  // devices and host memory are plentiful: only the disk limits
  o.spill_dir = (dir_ / "spill").string();
  // Free space as a disk would show it: each trial holding an executor has its files there.
  factory_.step_delay = std::chrono::milliseconds(20);
  HoldingFactory holding(&factory_);
  std::vector<std::string> asked;
  o.free_disk_bytes = [&](const std::string& d) {
    asked.push_back(d);
    return need * 5 / 2 - need * holding.held.load();
  };
  TrialScheduler s(&holding, &observer_, o);
  for (const auto& t : trials) ASSERT_TRUE(Submit(s, t).ok());
  ASSERT_TRUE(s.WaitIdle(std::chrono::seconds(30)));
  for (const auto& r : s.Snapshot()) EXPECT_EQ(r.state, kTrialSucceeded) << r.message;
  EXPECT_FALSE(asked.empty());
  EXPECT_EQ(asked.front(), o.spill_dir);
  // Never more than two trials held at once: count overlaps of their first and last steps.
  std::map<size_t, std::pair<double, double>> span;
  for (const auto& t : s.schedule().tasks) {
    auto [it, fresh] = span.emplace(t.trial, std::make_pair(t.start, t.end));
    if (!fresh) {
      it->second.first = std::min(it->second.first, t.start);
      it->second.second = std::max(it->second.second, t.end);
    }
  }
  ASSERT_EQ(span.size(), 4u);
  for (const auto& [i, a] : span) {
    int together = 0;
    for (const auto& [j, b] : span) together += b.first <= a.first && a.first < b.second;
    EXPECT_LE(together, 2) << "trial " << i << " started while two others held the disk";
  }
}

TEST_F(TrialSchedulerTest, TheAdmissionIsMadeOnceAndEveryBuildOfTheTrialUsesIt) {
  HoldingFactory holding(&factory_);
  TrialScheduler s(&holding, &observer_, {1});
  auto p = s.Prepare(MakeTrial("once", 12), Ckpt("once"));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(holding.admitted.load(), 1);
  EXPECT_GT(p->admission.host_bytes, 0);
  EXPECT_GT(p->admission.est_step_seconds, 0);
  ASSERT_EQ(p->admission.plan.shards.size(), 1u);
  // Marked, so that a Build from a fresh plan would show: the scheduler must carry this one.
  p->admission.est_step_seconds = 123.0;
  p->admission.plan.peak_device_bytes = 4242;
  ASSERT_TRUE(s.Submit(std::move(p).value()).ok());
  ASSERT_TRUE(s.WaitIdle(std::chrono::seconds(20)));
  EXPECT_EQ(s.Get("once")->state, kTrialSucceeded);
  EXPECT_EQ(holding.admitted.load(), 1);
  std::lock_guard<std::mutex> lock(holding.mu);
  ASSERT_FALSE(holding.built_with.empty());
  for (const auto& a : holding.built_with) {
    EXPECT_EQ(a.est_step_seconds, 123.0);
    EXPECT_EQ(a.plan.peak_device_bytes, 4242);
  }
}

TEST_F(TrialSchedulerTest, ATrialBoundToADeviceRunsWhereItsExecutorIs) {
  // As on GPUs: an executor keeps its trial's state on the device it was built for, and every
  // step runs on the device its executor is on at that step (without binding, steps of one
  // trial land on any device).
  factory_.bind_to_devices = true;
  factory_.step_delay = std::chrono::milliseconds(1);
  TrialScheduler s(&factory_, &observer_, {2});
  for (const char* name : {"a", "b", "c"}) ASSERT_TRUE(Submit(s, MakeTrial(name, 40)).ok());
  ASSERT_TRUE(s.WaitIdle(std::chrono::seconds(20)));
  std::lock_guard<std::mutex> lock(observer_.mu);
  std::lock_guard<std::mutex> log(factory_.devices.mu);
  for (const char* name : {"a", "b", "c"}) {
    SCOPED_TRACE(name);
    EXPECT_EQ(observer_.step_devices[name].size(), 40u);
    EXPECT_EQ(observer_.step_devices[name], factory_.devices.stepped_on[name]);
  }
  EXPECT_EQ(observer_.steps_per_device.size(), 2u) << "both devices trained";
}

TEST_F(TrialSchedulerTest, AnIdleDeviceTakesOverATrialWhoseDeviceIsBusy) {
  // Between its steps (MoveTo).
  EXPECT_EQ(TakenOver(), 1);
}

TEST_F(TrialSchedulerTest, AnIdleDeviceTakesOverATrialWithinItsStep) {
  // A spilled trial's next shard may run on any free GPU: executors whose steps are 8 tasks
  // and which may move only in a step's midst (the scheduler asks them, MayMoveNow) are taken
  // over there.
  factory_.tasks.per_step = 8;
  factory_.tasks.move_only_within_steps = true;
  EXPECT_EQ(TakenOver(), 1);
  std::lock_guard<std::mutex> log(factory_.devices.mu);
  int within = 0;
  for (const auto& [name, n] : factory_.devices.moves_within_step) within += n;
  EXPECT_EQ(within, 1);
}

TEST_F(TrialSchedulerTest, AMoveThatFindsNoRoomLeavesTheTrialOnItsOwnDevice) {
  // Memory that no plan counted (another process on the GPU): the executors' moves are undone
  // (MoveTo's UNAVAILABLE). The trials train to the end on the devices they were built on,
  // each told why; the moves are tried again ever more rarely (after 1, 2, 4 ... steps), not
  // at every step of the 60.
  factory_.tasks.per_step = 8;
  factory_.tasks.move_only_within_steps = true;
  factory_.tasks.moves_find_no_room = true;
  EXPECT_EQ(TakenOver(), 0);
  std::lock_guard<std::mutex> lock(observer_.mu);
  std::lock_guard<std::mutex> built(factory_.mu);
  std::lock_guard<std::mutex> log(factory_.devices.mu);
  size_t tried = 0;
  for (const auto& [name, moves] : factory_.devices.no_room) {
    SCOPED_TRACE(name);
    tried += moves.size();
    for (size_t i = 1; i < moves.size(); ++i) {
      EXPECT_GE(moves[i].second - moves[i - 1].second, int64_t{1} << (i - 1))
          << "tried again at step " << moves[i].second << " after " << moves[i - 1].second;
    }
    EXPECT_LE(moves.size(), 7u);  // steps s, s+1, s+3, s+7, s+15, s+31 (, s+63) of 60
    ASSERT_EQ(factory_.built_on[name].size(), 1u);
    for (int on : factory_.devices.stepped_on[name]) EXPECT_EQ(on, factory_.built_on[name][0]);
  }
  EXPECT_GE(tried, 1u);
  EXPECT_EQ(std::count_if(observer_.messages.begin(), observer_.messages.end(),
                          [](const std::string& m) { return m.find("no room") != m.npos; }),
            static_cast<std::ptrdiff_t>(tried));
}

TEST_F(TrialSchedulerTest, AFailedGpuInterruptsTheTrialsItHeldAndRunsNoMore) {
  // A step fails and leaves its GPU lost (an illegal address poisons the CUDA context): the
  // trial is Interrupted, not Failed (it resumes from its last checkpoint elsewhere), and so
  // is every other unfinished trial whose state that GPU held; the other GPU trains its own to
  // the end and the lost one runs nothing more.
  factory_.bind_to_devices = true;
  factory_.tasks.failures_lose_devices = true;
  factory_.step_delay = std::chrono::milliseconds(1);
  factory_.fail_at["a"] = 5;
  const int64_t need = PlannedPeak(MakeTrial("probe", 30));
  ASSERT_GT(need, 0);
  std::atomic<bool> hold{true};
  TrialSchedulerOptions o;
  o.devices = 2;
  o.device_memory_bytes = {2 * need, 2 * need};  // two trials bound to each
  o.hold = &hold;
  TrialScheduler s(&factory_, &observer_, o, MakeRoundRobinPolicy());
  for (const char* name : {"a", "b", "c", "d"}) ASSERT_TRUE(Submit(s, MakeTrial(name, 30)).ok());
  hold = false;
  ASSERT_TRUE(s.WaitIdle(std::chrono::seconds(30)));
  int lost = -1;
  {
    std::lock_guard<std::mutex> log(factory_.devices.mu);
    ASSERT_EQ(factory_.devices.lost.size(), 1u);
    lost = *factory_.devices.lost.begin();
  }
  const auto failed = s.FailedDevices();
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_EQ(failed.begin()->first, lost);
  EXPECT_THAT(failed.begin()->second, HasSubstr("illegal memory access"));
  int interrupted = 0, succeeded = 0;
  std::lock_guard<std::mutex> built(factory_.mu);
  std::lock_guard<std::mutex> log(factory_.devices.mu);
  for (const char* name : {"a", "b", "c", "d"}) {
    SCOPED_TRACE(name);
    const auto r = s.Get(name);
    ASSERT_TRUE(r.ok());
    const auto& on = factory_.devices.stepped_on[name];
    const auto& moves = factory_.devices.moves[name];  // where it was bound last
    if (r->state == kTrialInterrupted) {
      EXPECT_EQ(moves.empty() ? factory_.built_on[name].back() : moves.back(), lost);
      EXPECT_THAT(r->message, HasSubstr("device " + std::to_string(lost) + " failed"));
      EXPECT_LT(on.size(), 30u);
      ++interrupted;
    } else {  // on the other GPU, or done before the failure
      EXPECT_EQ(r->state, kTrialSucceeded) << r->message;
      EXPECT_EQ(on.size(), 30u);
      ++succeeded;
    }
  }
  EXPECT_EQ(s.Get("a")->state, kTrialInterrupted);
  EXPECT_THAT(s.Get("a")->message, HasSubstr("injected failure at step 5"));
  EXPECT_GE(succeeded, 1);
  EXPECT_GE(interrupted, 1);
  const auto& order = factory_.devices.step_order;
  EXPECT_EQ(std::count(order.begin() + static_cast<std::ptrdiff_t>(factory_.devices.lost_after),
                       order.end(), lost),
            0)
      << "steps on the lost GPU after it was lost";
}

TEST_F(TrialSchedulerTest, AParkWhoseCheckpointMeetsALostGpuEndsTheTrialsThereAndKeepsItsState) {
  // "a" waits at its early-stopping limit holding the only admission; its GPU is lost as it
  // reaches it, so parking it for "b" cannot read its state. The checkpoint's failure is the
  // GPU's: "a" is Interrupted naming the device, its executor is not freed on the lost GPU,
  // and the device takes nothing more ("b" is never built there).
  factory_.bind_to_devices = true;
  factory_.tasks.failures_lose_devices = true;
  factory_.on_step = [&](const std::string& name, int64_t step) {
    if (name != "a" || step != 6) return;
    std::lock_guard<std::mutex> log(factory_.devices.mu);
    factory_.devices.lost.insert(0);
  };
  TrialSchedulerOptions o;
  o.devices = 1;
  o.host_memory_bytes = 1;  // one trial admitted at a time
  TrialScheduler s(&factory_, &observer_, o);
  for (const char* name : {"a", "b"}) ASSERT_TRUE(Submit(s, MakeTrial(name, 12), 6).ok());
  ASSERT_TRUE(s.WaitIdle(std::chrono::seconds(20)));
  const auto a = s.Get("a");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->state, kTrialInterrupted);
  EXPECT_THAT(a->message, AllOf(HasSubstr("device 0 failed"), HasSubstr("checkpoint while waiting"),
                                HasSubstr("state cannot be read")));
  EXPECT_EQ(s.FailedDevices().count(0), 1u);
  EXPECT_EQ(s.Get("b")->state, kTrialInterrupted);
  EXPECT_THAT(s.Get("b")->message, HasSubstr("device 0 failed"));
  std::lock_guard<std::mutex> built(factory_.mu);
  std::lock_guard<std::mutex> log(factory_.devices.mu);
  EXPECT_EQ(factory_.devices.freed_on_lost, 0) << "an executor freed on the lost GPU";
  EXPECT_EQ(factory_.built_on.count("b"), 0u) << "a trial built on the lost GPU";
}

TEST_F(TrialSchedulerTest, ATrialHeldByAMoveWhenItsGpuFailsEndsToo) {
  // Device 1's trial is cancelled, so device 1 tries to take over a trial of busy device 0,
  // finds no room, and while it holds the trial device 0 fails (the other trial there fails
  // its next step): the held trial, back on a device that runs nothing more, ends Interrupted.
  TrialScheduler* scheduler = nullptr;
  factory_.bind_to_devices = true;
  factory_.step_delay = std::chrono::milliseconds(2);
  factory_.tasks.moves_find_no_room = true;
  factory_.tasks.failures_lose_devices = true;
  factory_.tasks.no_room_loses_source = true;
  bool failed_while_held = false;
  factory_.tasks.after_no_room = [&] {
    for (int i = 0; i < 1000 && !failed_while_held; ++i) {
      failed_while_held = !scheduler->FailedDevices().empty();
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  };
  const int64_t need = PlannedPeak(MakeTrial("probe", 600));
  ASSERT_GT(need, 0);
  TrialSchedulerOptions o;
  o.devices = 2;
  o.device_memory_bytes = {2 * need, need};
  TrialScheduler s(&factory_, &observer_, o, MakeRoundRobinPolicy());
  scheduler = &s;
  for (const char* name : {"a", "b", "c"}) ASSERT_TRUE(Submit(s, MakeTrial(name, 600)).ok());
  std::string on_1;
  for (int i = 0; i < 2000 && on_1.empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::lock_guard<std::mutex> built(factory_.mu);
    if (factory_.built_on.size() < 3) continue;
    for (const auto& [name, devices] : factory_.built_on) {
      if (devices.front() == 1) on_1 = name;
    }
  }
  ASSERT_FALSE(on_1.empty()) << "no trial started on device 1";
  ASSERT_TRUE(s.Cancel(on_1).ok());
  ASSERT_TRUE(s.WaitIdle(std::chrono::seconds(30))) << "a trial never ended";
  EXPECT_TRUE(failed_while_held);
  ASSERT_EQ(s.FailedDevices().size(), 1u);
  EXPECT_EQ(s.FailedDevices().begin()->first, 0);
  std::lock_guard<std::mutex> log(factory_.devices.mu);
  ASSERT_EQ(factory_.devices.no_room.size(), 1u);
  const std::string held = factory_.devices.no_room.begin()->first;
  EXPECT_EQ(s.Get(held)->state, kTrialInterrupted);
  EXPECT_THAT(s.Get(held)->message, HasSubstr("device 0 failed"));
}

TEST_F(TrialSchedulerTest, WhenEveryDeviceFailedTheWaitingTrialsEndAndNoneIsTaken) {
  // One GPU, lost by a's step 3: every trial not yet finished ends Interrupted, bound to it or
  // not (no device will ever run them), the scheduler goes idle, and a new trial is refused.
  factory_.bind_to_devices = true;
  factory_.tasks.failures_lose_devices = true;
  factory_.fail_at["a"] = 3;
  std::atomic<bool> hold{true};
  TrialSchedulerOptions o;
  o.hold = &hold;
  o.host_memory_bytes = 1;  // one trial admitted at a time: the others wait, unbound
  TrialScheduler s(&factory_, &observer_, o);
  for (const char* name : {"a", "b", "c"}) ASSERT_TRUE(Submit(s, MakeTrial(name, 30)).ok());
  hold = false;
  ASSERT_TRUE(s.WaitIdle(std::chrono::seconds(20)));
  EXPECT_EQ(s.FailedDevices().size(), 1u);
  for (const char* name : {"a", "b", "c"}) {
    SCOPED_TRACE(name);
    EXPECT_EQ(s.Get(name)->state, kTrialInterrupted);
    EXPECT_THAT(s.Get(name)->message, HasSubstr("device 0 failed"));
  }
  const Status refused = Submit(s, MakeTrial("d", 30));
  EXPECT_EQ(refused.code(), StatusCode::kUnavailable) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("every device of this node failed"));
}

TEST_F(TrialSchedulerTest, ADevicesMemoryHoldsOnlyTheTrialsThatFitIt) {
  // One device whose memory holds one trial's plan at a time: the trials run one after the
  // other there, each started only once the previous one's executor (and state) is gone. With
  // room for both, round-robin interleaves them (Sharded-LRTF might not, by the fake's times).
  factory_.bind_to_devices = true;
  factory_.step_delay = std::chrono::milliseconds(1);
  const Trial a = MakeTrial("a", 30), b = MakeTrial("b", 30);
  const int64_t need = PlannedPeak(a);
  ASSERT_GT(need, 0);
  auto order_with = [&](int64_t memory) {
    std::vector<std::string> order;
    std::mutex mu;
    factory_.on_step = [&](const std::string& name, int64_t) {
      std::lock_guard<std::mutex> lock(mu);
      if (order.empty() || order.back() != name) order.push_back(name);
    };
    fs::remove_all(dir_ / "ckpt");
    std::atomic<bool> hold{true};  // both are queued before either runs
    TrialSchedulerOptions o;
    o.devices = 1;
    o.device_memory_bytes = {memory};
    o.hold = &hold;
    {
      TrialScheduler s(&factory_, &observer_, o, MakeRoundRobinPolicy());
      EXPECT_TRUE(Submit(s, a).ok());
      EXPECT_TRUE(Submit(s, b).ok());
      hold = false;
      EXPECT_TRUE(s.WaitIdle(std::chrono::seconds(20)));
      EXPECT_EQ(s.Get("a")->state, kTrialSucceeded);
      EXPECT_EQ(s.Get("b")->state, kTrialSucceeded);
    }
    factory_.on_step = nullptr;
    return order;
  };
  EXPECT_EQ(order_with(need * 3 / 2), (std::vector<std::string>{"a", "b"})) << "never interleaved";
  EXPECT_GT(order_with(need * 2).size(), 2u) << "interleaved";
}

TEST_F(TrialSchedulerTest, AGpusBytesInUseAreThePlansOfTheTrialsItHoldsBetweenStepsToo) {
  // Two trials bound to one GPU take turns: whichever is stepping, both hold their plans'
  // device peaks there (the agent's device metrics and its allocator check read this).
  factory_.bind_to_devices = true;
  const Trial a = MakeTrial("a", 20), b = MakeTrial("b", 20);
  const int64_t need = PlannedPeak(a);
  ASSERT_GT(need, 0);
  std::atomic<bool> hold{true};
  TrialSchedulerOptions o;
  o.devices = 1;
  o.device_memory_bytes = {3 * need};
  o.hold = &hold;
  TrialScheduler s(&factory_, &observer_, o, MakeRoundRobinPolicy());
  std::atomic<int64_t> seen{-1};
  factory_.on_step = [&](const std::string& name, int64_t step) {
    if (name == "a" && step == 10) seen = s.DeviceBytesInUse(0);
  };
  ASSERT_TRUE(Submit(s, a).ok());
  ASSERT_TRUE(Submit(s, b).ok());
  hold = false;
  ASSERT_TRUE(s.WaitIdle(std::chrono::seconds(20)));
  factory_.on_step = nullptr;
  EXPECT_EQ(seen, 2 * need);
  EXPECT_EQ(s.DeviceBytesInUse(0), 0) << "both finished";
}

TEST_F(TrialSchedulerTest, BusySecondsGrowOnlyOnDevicesThatRan) {
  factory_.step_delay = std::chrono::milliseconds(2);
  TrialScheduler s(&factory_, &observer_, {2});
  ASSERT_TRUE(Submit(s, MakeTrial("only", 20)).ok());
  ASSERT_TRUE(s.WaitIdle(std::chrono::seconds(10)));
  auto busy = s.BusySeconds();
  ASSERT_EQ(busy.size(), 2u);
  EXPECT_GT(busy[0] + busy[1], 0.03);
  EXPECT_EQ(s.DeviceBytesInUse(0) + s.DeviceBytesInUse(1), 0) << "nothing runs now";
}

}  // namespace
}  // namespace hydra::agent
