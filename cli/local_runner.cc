#include "cli/local_runner.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>

#include "cli/results.h"
#include "common/devices.h"

namespace hydra::cli {
namespace {
namespace fs = std::filesystem;
}  // namespace

/// Forwards the scheduler's reports to the progress sink, by trial index, one at a time, and
/// writes result.json as a trial succeeds.
class LocalRunner::Observer : public agent::TrialObserverInterface {
 public:
  Observer(ProgressSinkInterface* progress, const std::map<std::string, size_t>* index,
           const std::map<std::string, std::pair<std::string, std::string>>* result_files)
      : progress_(progress), index_(index), result_files_(result_files) {}

  void OnTrialUpdate(const TrialResult& snapshot) override {
    auto it = index_->find(snapshot.trial.name);
    if (it == index_->end()) return;
    std::lock_guard<std::mutex> lock(mu_);
    progress_->OnTrialUpdate(it->second, snapshot);
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
  ProgressSinkInterface* progress_;
  const std::map<std::string, size_t>* index_;
  const std::map<std::string, std::pair<std::string, std::string>>* result_files_;
  std::mutex mu_;
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
  agent::TrialSchedulerOptions so;
  so.devices = std::max(1, options_.devices);
  so.host_memory_bytes = options_.host_memory_bytes;
  so.spill_dir = options_.spill_dir;
  so.hold = options_.interrupted;
  so.threads = options_.threads;
  so.cpu = CpuModelName();
  agent::TrialScheduler scheduler(factory_, &observer, so,
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
  // Trials finished by an earlier run with the same configuration are not trained again.
  std::vector<bool> finished(trials.size(), false);
  for (size_t i = 0; i < prepared.size(); ++i) {
    const auto& [path, fingerprint] = result_files[trials[i].name];
    if (!fs::exists(path)) continue;
    std::string previous_fingerprint;
    auto previous = ReadTrialResultFile(path, trials[i], &previous_fingerprint);
    if (previous.ok() && previous->state == kTrialSucceeded &&
        previous_fingerprint == fingerprint) {
      (*results)[i] = std::move(previous).value();
      finished[i] = true;
      observer.OnTrialUpdate((*results)[i]);
    } else {
      fs::remove(path, ec);
    }
  }
  for (size_t i = 0; i < prepared.size(); ++i) {
    if (!finished[i]) RETURN_IF_ERROR(scheduler.Submit(std::move(prepared[i])));
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
  std::vector<TrialResult> ranked = results;
  std::stable_sort(ranked.begin(), ranked.end(), [](const TrialResult& a, const TrialResult& b) {
    const bool ga = a.state == "Succeeded" && std::isfinite(a.final_val_loss);
    const bool gb = b.state == "Succeeded" && std::isfinite(b.final_val_loss);
    if (ga != gb) return ga;
    if (ga) return a.final_val_loss < b.final_val_loss;
    return false;
  });
  return ranked;
}

}  // namespace hydra::cli
