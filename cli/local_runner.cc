#include "cli/local_runner.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>

#include "cli/results.h"
#include "common/devices.h"
#include "common/early_stopper.h"

namespace hydra::cli {
namespace {
namespace fs = std::filesystem;

/// What a stopped trial's result.json fingerprint carries besides the trial's own: it is
/// reused only by a run with the same early stopping (else it resumes from its checkpoint).
std::string StoppedUnder(const EarlyStoppingSpec& spec) {
  return "+earlyStopping:" + std::string(EarlyStoppingAlgorithmName(spec.algorithm)) + "/" +
         std::to_string(spec.min_steps) + "/" + std::to_string(spec.reduction_factor);
}

agent::TrialSchedulerOptions SchedulerOptions(const RunOptions& o) {
  agent::TrialSchedulerOptions so;
  so.devices = std::max(1, o.devices);
  so.device_memory_bytes = o.device_memory_bytes;
  so.host_memory_bytes = o.host_memory_bytes;
  so.spill_dir = o.spill_dir;
  so.hold = o.interrupted;
  so.threads = o.threads;
  so.cpu = CpuModelName();
  return so;
}

/// Whether `trial`'s result.json at `path` is an earlier run's with the same configuration
/// (`fingerprint`) that finished it, or stopped it early under the same early stopping: then
/// `*out` is that result and the trial is not trained again. Any other result.json is removed.
bool FinishedEarlier(const std::string& path, const std::string& fingerprint, const Trial& trial,
                     const EarlyStoppingSpec& stopping, TrialResult* out) {
  if (!fs::exists(path)) return false;
  std::string previous_fingerprint;
  auto previous = ReadTrialResultFile(path, trial, &previous_fingerprint);
  const bool same = previous.ok() &&
                    ((previous->state == kTrialSucceeded && previous_fingerprint == fingerprint) ||
                     (previous->state == kTrialEarlyStopped &&
                      previous_fingerprint == fingerprint + StoppedUnder(stopping)));
  if (same) {
    *out = std::move(previous).value();
    return true;
  }
  std::error_code ec;
  fs::remove(path, ec);
  return false;
}
}  // namespace

/// Forwards the scheduler's reports to the progress sink, by trial index, one at a time, and
/// writes result.json as a trial succeeds or stops early. With spec.search.earlyStopping it
/// feeds every new evaluation to the job's EarlyStopper and applies its decisions to the
/// scheduler (step limits, stops): the scheduler never calls back on the calling thread, so
/// this may call it from inside an update.
class LocalRunner::Observer : public agent::TrialObserverInterface {
 public:
  Observer(ProgressSinkInterface* progress, const std::map<std::string, size_t>* index,
           const std::map<std::string, std::pair<std::string, std::string>>* result_files)
      : progress_(progress), index_(index), result_files_(result_files) {}

  /// Early stopping over `trials` (indices as in the runner), applied to `scheduler`.
  void StopEarly(const EarlyStoppingSpec& spec, const std::vector<Trial>& trials,
                 agent::TrialScheduler* scheduler) {
    std::vector<int64_t> steps;
    for (const auto& t : trials) {
      steps.push_back(t.training.steps);
      keys_.push_back(TrialKey(t));
    }
    std::lock_guard<std::mutex> lock(stop_mu_);
    spec_ = spec;
    stopper_ = std::make_unique<EarlyStopper>(spec, std::move(steps));
    fed_.assign(trials.size(), -1);
    scheduler_ = scheduler;
  }
  /// The step trial `i` may train to before any decision.
  int64_t InitialLimit(size_t i) const {
    std::lock_guard<std::mutex> lock(stop_mu_);
    return stopper_ ? stopper_->Limit(static_cast<int>(i)) : 0;
  }

  void OnTrialUpdate(const TrialResult& snapshot) override {
    auto it = index_->find(snapshot.trial.name);
    if (it == index_->end()) return;
    if (snapshot.state == kTrialEarlyStopped) {
      const auto& [path, fingerprint] = result_files_->at(snapshot.trial.name);
      if (Status s = WriteTrialResultFile(path, snapshot, fingerprint + StoppedUnder(spec_));
          !s.ok()) {
        Message(snapshot.trial.name + ": " + s.message());
      }
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      progress_->OnTrialUpdate(it->second, snapshot);
    }
    Decide(it->second, snapshot);
  }
  void OnTrialMessage(const Trial& trial, const std::string& message) override {
    Message(trial.name + ": " + message);
  }
  Status OnTrialSucceeding(const TrialResult& result) override {
    const auto& [path, fingerprint] = result_files_->at(result.trial.name);
    return WriteTrialResultFile(path, result, fingerprint);
  }
  void Message(const std::string& message) {
    std::lock_guard<std::mutex> lock(mu_);
    progress_->OnMessage(message);
  }
  void JobStart(const std::string& job, const std::vector<TrialResult>& trials) {
    std::lock_guard<std::mutex> lock(mu_);
    progress_->OnJobStart(job, trials);
  }
  void JobEnd(const std::vector<TrialResult>& trials) {
    std::lock_guard<std::mutex> lock(mu_);
    progress_->OnJobEnd(trials);
  }

 private:
  /// Feeds the trial's new evaluations (and its end) to the stopper and applies what follows,
  /// in order, under stop_mu_ (the scheduler's calls take only its own lock briefly).
  void Decide(size_t i, const TrialResult& snapshot) {
    std::lock_guard<std::mutex> lock(stop_mu_);
    if (!stopper_) return;
    std::vector<StopDecision> decisions;
    auto add = [&](std::vector<StopDecision> d) {
      decisions.insert(decisions.end(), d.begin(), d.end());
    };
    const int trial = static_cast<int>(i);
    for (const auto& p : snapshot.val_curve) {
      if (p.step <= fed_[i]) continue;
      fed_[i] = p.step;
      add(stopper_->Report(trial, p.step, p.loss));
    }
    if (IsFinalTrialState(snapshot.state) || snapshot.state == kTrialInterrupted) {
      add(stopper_->Ended(trial));
    }
    for (const auto& d : decisions) {
      // A trial that ended meanwhile refuses (FAILED_PRECONDITION): nothing to do then.
      if (d.kind == StopDecision::Kind::kLimit) {
        (void)scheduler_->SetStepLimit(keys_[d.trial], d.step);
      } else {
        (void)scheduler_->StopEarly(keys_[d.trial], Reason(d));
      }
    }
  }
  std::string Reason(const StopDecision& d) const {
    if (spec_.algorithm == EarlyStoppingAlgorithm::kMedian) {
      return "median: its best validation loss by step " + std::to_string(d.step) +
             " is worse than the median of the other trials'";
    }
    return "asha: not in the top 1/" + std::to_string(spec_.reduction_factor) +
           " of the validation losses at step " + std::to_string(d.step);
  }

  ProgressSinkInterface* progress_;
  const std::map<std::string, size_t>* index_;
  const std::map<std::string, std::pair<std::string, std::string>>* result_files_;
  std::mutex mu_;
  mutable std::mutex stop_mu_;  // guards the early-stopping state below
  EarlyStoppingSpec spec_;
  std::unique_ptr<EarlyStopper> stopper_;
  std::vector<int64_t> fed_;  // per trial: the last evaluation step fed to the stopper
  std::vector<std::string> keys_;
  agent::TrialScheduler* scheduler_ = nullptr;
};

LocalRunner::LocalRunner(executor::ExecutorFactoryInterface* factory,
                         ProgressSinkInterface* progress, RunOptions options,
                         std::unique_ptr<SchedulingPolicyInterface> policy)
    : factory_(factory),
      progress_(progress),
      options_(std::move(options)),
      policy_(std::move(policy)) {}

LocalRunner::~LocalRunner() = default;

std::string LocalRunner::TrialDir(const Trial& trial) const {
  return (fs::path(options_.output_dir) / "trials" / trial.name).string();
}

Status LocalRunner::Run(const MultiModelJob& job, const std::vector<Trial>& trials,
                        std::vector<TrialResult>* results) {
  results->clear();
  std::map<std::string, size_t> index;
  std::map<std::string, std::pair<std::string, std::string>> result_files;
  for (size_t i = 0; i < trials.size(); ++i) {
    TrialResult r;
    r.trial = trials[i];
    results->push_back(std::move(r));
    index[trials[i].name] = i;
  }
  std::error_code ec;
  fs::create_directories(options_.output_dir, ec);
  if (ec) {
    return FailedPreconditionError("cannot create output directory " + options_.output_dir + ": " +
                                   ec.message());
  }
  Observer observer(progress_, &index, &result_files);
  agent::TrialScheduler scheduler(factory_, &observer, SchedulerOptions(options_),
                                  policy_ ? std::move(policy_) : MakeShardedLrtfPolicy());
  // Pre-flight: every dataset opens and every trial passes admission before any training.
  std::vector<agent::PreparedTrial> prepared;
  for (const Trial& t : trials) {
    ASSIGN_OR_RETURN(auto p,
                     scheduler.Prepare(t, (fs::path(TrialDir(t)) / "checkpoints").string()));
    result_files[t.name] = {(fs::path(TrialDir(t)) / "result.json").string(), p.fingerprint};
    prepared.push_back(std::move(p));
  }
  // Only once every trial passed pre-flight: --restart discards the earlier run's files.
  if (options_.restart) {
    for (const Trial& t : trials) {
      const std::string dir = TrialDir(t);
      fs::remove_all(dir, ec);
      if (ec) {
        return FailedPreconditionError("--restart: cannot remove " + dir + ": " + ec.message());
      }
    }
  }
  observer.JobStart(job.metadata.name, *results);
  if (job.spec.early_stopping.algorithm != EarlyStoppingAlgorithm::kNone) {
    observer.StopEarly(job.spec.early_stopping, trials, &scheduler);
  }
  // Trials finished (or stopped early) by an earlier run with the same configuration are not
  // trained again; their results are replayed to the stopper once the others are queued.
  std::vector<bool> finished(trials.size(), false);
  for (size_t i = 0; i < prepared.size(); ++i) {
    const auto& [path, fingerprint] = result_files[trials[i].name];
    finished[i] =
        FinishedEarlier(path, fingerprint, trials[i], job.spec.early_stopping, &(*results)[i]);
  }
  for (size_t i = 0; i < prepared.size(); ++i) {
    if (finished[i]) continue;
    prepared[i].step_limit = observer.InitialLimit(i);
    RETURN_IF_ERROR(scheduler.Submit(std::move(prepared[i])));
  }
  for (size_t i = 0; i < prepared.size(); ++i) {
    if (finished[i]) observer.OnTrialUpdate((*results)[i]);
  }

  Status status;
  while (!scheduler.WaitIdle(std::chrono::milliseconds(20))) {
    if (options_.interrupted && options_.interrupted->load()) {
      // Every started, unfinished trial checkpoints where it stopped.
      Status s = scheduler.Drain("interrupted");
      if (!s.ok()) observer.Message(s.message());
      status = CancelledError("interrupted; run the same command again to resume");
      break;
    }
  }
  schedule_ = scheduler.schedule();
  for (const auto& r : scheduler.Snapshot()) (*results)[index.at(r.trial.name)] = r;
  observer.JobEnd(*results);
  return status;
}

std::vector<TrialResult> RankResults(const std::vector<TrialResult>& results) {
  // Succeeded trials by final validation loss, then early-stopped ones by their last, then
  // the rest in trial order.
  auto group = [](const TrialResult& r) {
    if (!std::isfinite(r.final_val_loss)) return 2;
    return r.state == kTrialSucceeded ? 0 : r.state == kTrialEarlyStopped ? 1 : 2;
  };
  std::vector<TrialResult> ranked = results;
  std::stable_sort(ranked.begin(), ranked.end(), [&](const TrialResult& a, const TrialResult& b) {
    if (group(a) != group(b)) return group(a) < group(b);
    if (group(a) < 2) return a.final_val_loss < b.final_val_loss;
    return false;
  });
  return ranked;
}

}  // namespace hydra::cli
