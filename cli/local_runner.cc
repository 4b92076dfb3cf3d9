#include "cli/local_runner.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <thread>

#include "agent/executor/checkpoint.h"
#include "cli/results.h"
#include "common/cost_model.h"
#include "common/job_json.h"
#include "common/partitioner.h"

namespace hydra::cli {
namespace {

namespace fs = std::filesystem;
using executor::CheckpointData;
using executor::CheckpointStore;

double MeanOfLast(const std::vector<CurvePoint>& curve, size_t n) {
  if (curve.empty()) return std::numeric_limits<double>::quiet_NaN();
  n = std::min(n, curve.size());
  double sum = 0;
  for (size_t i = curve.size() - n; i < curve.size(); ++i) sum += curve[i].loss;
  return sum / static_cast<double>(n);
}

/// What a checkpoint carries besides the tensors: enough to continue the trial's record.
nlohmann::json ProgressMeta(const TrialResult& r, const std::string& fingerprint) {
  return {{"trial", r.trial.name},
          {"fingerprint", fingerprint},
          {"step", r.step},
          {"wallSeconds", r.wall_seconds},
          {"trainSeconds", r.train_seconds},
          {"trainedTokens", r.trained_tokens},
          {"trainCurve", CurveJson(r.train_curve)},
          {"valCurve", CurveJson(r.val_curve)}};
}

void RestoreProgress(const nlohmann::json& meta, TrialResult* r) {
  r->step = meta.at("step").get<int64_t>();
  r->wall_seconds = meta.at("wallSeconds").get<double>();
  r->train_seconds = meta.at("trainSeconds").get<double>();
  r->trained_tokens = meta.at("trainedTokens").get<int64_t>();
  r->train_curve = CurveFromJson(meta.at("trainCurve"));
  r->val_curve = CurveFromJson(meta.at("valCurve"));
  if (!r->train_curve.empty()) r->last_loss = r->train_curve.back().loss;
}

}  // namespace

/// One trial's run-time state. Scheduling fields (admitted, running, done, failed,
/// est_step_seconds) are guarded by the runner's mutex; the rest belongs to the worker that runs
/// the trial, one at a time.
struct LocalRunner::Slot {
  size_t index = 0;
  TrialResult* r = nullptr;
  std::shared_ptr<const executor::TokenDataset> data;
  std::unique_ptr<executor::TrialExecutorInterface> exec;
  std::unique_ptr<CheckpointStore> store;
  std::string fingerprint, dir, result_path;
  int64_t host_bytes = 0;
  int64_t saved_step = 0;
  bool admitted = false, started = false, running = false, done = false;
  double est_step_seconds = 0;
  double ready_since = 0;
};

LocalRunner::LocalRunner(executor::ExecutorFactoryInterface* factory,
                         ProgressSinkInterface* progress, RunOptions options,
                         std::unique_ptr<SchedulingPolicyInterface> policy)
    : factory_(factory),
      progress_(progress),
      options_(std::move(options)),
      policy_(policy ? std::move(policy) : MakeShardedLrtfPolicy()) {}

LocalRunner::~LocalRunner() = default;

std::string LocalRunner::TrialDir(const Trial& trial) const {
  return (fs::path(options_.output_dir) / "trials" / trial.name).string();
}

void LocalRunner::Report(size_t index) {
  std::lock_guard<std::mutex> lock(progress_mu_);
  progress_->OnTrialUpdate(index, (*results_)[index]);
}

Status LocalRunner::Run(const MultiModelJob& job, const std::vector<Trial>& trials,
                        std::vector<TrialResult>* results) {
  results->clear();
  for (const auto& t : trials) {
    TrialResult r;
    r.trial = t;
    results->push_back(std::move(r));
  }
  results_ = results;
  std::error_code ec;
  fs::create_directories(options_.output_dir, ec);
  if (ec) {
    return FailedPreconditionError("cannot create output directory " + options_.output_dir + ": " +
                                   ec.message());
  }
  // Pre-flight: every dataset opens and every trial passes admission before any training.
  std::map<std::pair<std::string, int64_t>, std::shared_ptr<const executor::TokenDataset>> data;
  slots_.clear();
  for (size_t i = 0; i < trials.size(); ++i) {
    const Trial& t = trials[i];
    const auto key = std::make_pair(t.dataset.resolved_path, t.model.context_length + 1);
    if (!data.count(key)) {
      ASSIGN_OR_RETURN(data[key],
                       executor::TokenDataset::Open(t.dataset, t.model.context_length + 1));
    }
    RETURN_IF_ERROR(factory_->Check(t, *data[key]));
    auto slot = std::make_unique<Slot>();
    slot->index = i;
    slot->r = &(*results)[i];
    slot->data = data[key];
    slot->dir = TrialDir(t);
    slot->fingerprint = TrialFingerprint(t);
    slot->result_path = (fs::path(slot->dir) / "result.json").string();
    // Host memory while admitted: on a CPU device the device tier is host memory too.
    auto plan = PlanShards(t, PartitionOptionsFor(t));
    slot->host_bytes = plan.ok() ? (plan->state_tier == StateTier::kHost
                                        ? plan->total_state_bytes + plan->peak_device_bytes
                                        : plan->peak_device_bytes)
                                 : EstimateTrialFootprint(t).total_bytes();
    // First estimate of a step: 6 FLOPs per parameter per token at 100 GFLOP/s; replaced by
    // measured step times as the trial runs.
    const auto fp = EstimateTrialFootprint(t);
    slot->est_step_seconds = 6.0 * static_cast<double>(fp.parameters) *
                             static_cast<double>(t.training.batch_size * t.model.context_length) /
                             1e11;
    slots_.push_back(std::move(slot));
  }
  // Only once every trial passed pre-flight: --restart discards the earlier run's files.
  if (options_.restart) {
    for (const auto& slot : slots_) {
      fs::remove_all(slot->dir, ec);
      if (ec) {
        return FailedPreconditionError("--restart: cannot remove " + slot->dir + ": " +
                                       ec.message());
      }
    }
  }
  {
    std::lock_guard<std::mutex> lock(progress_mu_);
    progress_->OnJobStart(job.metadata.name, *results);
  }
  // Trials finished by an earlier run with the same configuration are not trained again.
  for (auto& slot : slots_) {
    if (!fs::exists(slot->result_path)) continue;
    std::string previous_fingerprint;
    auto previous = ReadTrialResultFile(slot->result_path, slot->r->trial, &previous_fingerprint);
    if (previous.ok() && previous->state == "Succeeded" &&
        previous_fingerprint == slot->fingerprint) {
      *slot->r = std::move(previous).value();
      slot->done = true;
      Report(slot->index);
    } else {
      fs::remove(slot->result_path, ec);
    }
  }

  start_ = std::chrono::steady_clock::now();
  schedule_ = Schedule();
  const int devices = std::max(1, options_.devices);
  schedule_.busy_seconds.assign(devices, 0.0);
  std::vector<std::thread> workers;
  for (int d = 0; d < devices; ++d) workers.emplace_back(&LocalRunner::Worker, this, d);
  for (auto& w : workers) w.join();
  schedule_.makespan =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();

  Status status;
  if (options_.interrupted && options_.interrupted->load()) {
    // Every started, unfinished trial checkpoints where it stopped.
    for (auto& slot : slots_) {
      if (!slot->started || slot->done || slot->r->state == "Failed") continue;
      if (slot->r->step > slot->saved_step) {
        Status s = SaveCheckpoint(*slot);
        if (!s.ok()) progress_->OnMessage(slot->r->trial.name + ": " + s.message());
      }
      slot->r->state = "Interrupted";
      slot->r->message = "interrupted at step " + std::to_string(slot->r->step);
      Report(slot->index);
    }
    status = CancelledError("interrupted; run the same command again to resume");
  }
  for (auto& slot : slots_) slot->exec.reset();
  {
    std::lock_guard<std::mutex> lock(progress_mu_);
    progress_->OnJobEnd(*results);
  }
  return status;
}

void LocalRunner::Worker(int device) {
  int64_t host_limit = options_.host_memory_bytes;
  if (host_limit <= 0) {
    host_limit = static_cast<int64_t>(0.75 * static_cast<double>(sysconf(_SC_PHYS_PAGES)) *
                                      static_cast<double>(sysconf(_SC_PAGESIZE)));
  }
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    if (options_.interrupted && options_.interrupted->load()) break;
    // Admission: trials join, in order, while their state fits the host memory.
    int64_t admitted_bytes = 0;
    for (auto& s : slots_) {
      if (s->admitted && !s->done) admitted_bytes += s->host_bytes;
    }
    for (auto& s : slots_) {
      if (s->admitted || s->done) continue;
      // The first waiting trial is admitted even alone over the limit: it must run sometime.
      if (admitted_bytes > 0 && admitted_bytes + s->host_bytes > host_limit) break;
      s->admitted = true;
      admitted_bytes += s->host_bytes;
    }
    std::vector<RunnableTrial> runnable;
    bool any_left = false;
    for (auto& s : slots_) {
      if (s->done) continue;
      any_left = true;
      if (!s->admitted || s->running) continue;
      const double remaining =
          s->est_step_seconds * static_cast<double>(s->r->trial.training.steps - s->r->step);
      runnable.push_back({s->index, remaining, s->ready_since, s->r->step});
    }
    if (!any_left) break;
    if (runnable.empty()) {
      cv_.wait_for(lock, std::chrono::milliseconds(200));
      continue;
    }
    Slot& slot = *slots_[runnable[policy_->Pick(runnable)].index];
    slot.running = true;
    lock.unlock();

    Status s;
    bool stepped = false;
    std::chrono::steady_clock::time_point t0, t1;
    try {
      if (!slot.started) s = Start(slot);
      // A trial resumed from its final checkpoint (result.json lost) only needs finishing.
      if (s.ok() && slot.r->step < slot.r->trial.training.steps) {
        t0 = std::chrono::steady_clock::now();
        s = StepOnce(slot);
        t1 = std::chrono::steady_clock::now();
        stepped = true;
      }
      if (s.ok() && slot.r->step >= slot.r->trial.training.steps) s = Finish(slot);
    } catch (const std::exception& e) {
      // Nothing may escape a worker thread: the trial fails, the job goes on.
      s = InternalError(std::string("unexpected error: ") + e.what());
    }

    lock.lock();
    if (!s.ok()) {
      slot.r->state = "Failed";
      slot.r->message = s.message();
      slot.done = true;
      slot.exec.reset();
    }
    if (stepped) {
      // One task per optimizer step, timed without set-up and finishing.
      const double start = std::chrono::duration<double>(t0 - start_).count();
      const double end = std::chrono::duration<double>(t1 - start_).count();
      schedule_.tasks.push_back({slot.index, slot.r->step - 1, 0, device, start, end});
      schedule_.busy_seconds[device] += end - start;
      slot.ready_since = end;
    }
    // Report a copy taken while the trial is still ours: once `running` is cleared another
    // device may step it and grow its curves.
    const TrialResult snapshot = *slot.r;
    slot.running = false;
    cv_.notify_all();
    lock.unlock();
    {
      std::lock_guard<std::mutex> progress_lock(progress_mu_);
      progress_->OnTrialUpdate(slot.index, snapshot);
    }
    lock.lock();
  }
  cv_.notify_all();
}

Status LocalRunner::Start(Slot& slot) {
  TrialResult* r = slot.r;
  const Trial& trial = r->trial;
  auto created = factory_->Create(trial, slot.data);
  if (!created.ok()) return created.status();
  slot.exec = std::move(created).value();
  const auto stats = slot.exec->stats();
  r->shards = stats.shards;
  r->peak_device_bytes = stats.peak_device_bytes;
  slot.store = std::make_unique<CheckpointStore>((fs::path(slot.dir) / "checkpoints").string());
  if (!slot.store->Steps().empty()) {
    std::vector<std::string> warnings;
    auto ckpt = slot.store->LoadLatest(&warnings);
    for (const auto& w : warnings) {
      std::lock_guard<std::mutex> lock(progress_mu_);
      progress_->OnMessage(trial.name + ": " + w);
    }
    if (!ckpt.ok()) return ckpt.status().WithContext("resuming " + trial.name);
    const std::string found = ckpt->meta.value("fingerprint", "");
    if (found != slot.fingerprint) {
      return FailedPreconditionError(
          "the checkpoints in " + slot.store->dir() +
          " were made for a different configuration of " + trial.name +
          "; pass --restart to discard them, or choose another --output");
    }
    try {
      RestoreProgress(ckpt->meta, r);
    } catch (const nlohmann::json::exception& e) {
      return DataLossError("checkpoint metadata in " + slot.store->dir() + ": " + e.what());
    }
    RETURN_IF_ERROR(slot.exec->ImportState(r->step, ckpt->buffers)
                        .WithContext("resuming " + trial.name + " from " + slot.store->dir()));
    r->resumed_from_step = r->step;
    slot.saved_step = r->step;
    std::lock_guard<std::mutex> lock(progress_mu_);
    progress_->OnMessage(trial.name + ": resumed from the checkpoint of step " +
                         std::to_string(r->step));
  }
  slot.started = true;
  r->state = "Running";
  return OkStatus();
}

Status LocalRunner::SaveCheckpoint(Slot& slot) {
  auto state = slot.exec->ExportState();
  if (!state.ok()) return state.status();
  CheckpointData c{ProgressMeta(*slot.r, slot.fingerprint), std::move(state).value()};
  RETURN_IF_ERROR(slot.store->Save(slot.r->step, c));
  slot.saved_step = slot.r->step;
  return OkStatus();
}

Status LocalRunner::StepOnce(Slot& slot) {
  TrialResult* r = slot.r;
  const auto& tr = r->trial.training;
  const auto start = std::chrono::steady_clock::now();
  auto m = slot.exec->TrainStep();
  if (!m.ok()) return m.status();
  r->step = slot.exec->step();
  r->train_curve.push_back({r->step, m->loss});
  r->last_loss = m->loss;
  r->train_seconds += m->seconds;
  r->trained_tokens += m->tokens;
  r->tokens_per_second = static_cast<double>(r->trained_tokens) / r->train_seconds;
  if (tr.eval_every_steps > 0 && r->step % tr.eval_every_steps == 0 && r->step < tr.steps) {
    auto val = slot.exec->Evaluate();
    if (!val.ok()) return val.status();
    r->val_curve.push_back({r->step, *val});
  }
  const double step_wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  r->wall_seconds += step_wall;
  if (tr.checkpoint_every_steps > 0 && r->step % tr.checkpoint_every_steps == 0 &&
      r->step < tr.steps) {
    const auto c0 = std::chrono::steady_clock::now();
    RETURN_IF_ERROR(SaveCheckpoint(slot));
    r->wall_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - c0).count();
  }
  {
    // Online refinement of the remaining-time estimate: the measured mean step time.
    std::lock_guard<std::mutex> lock(mu_);
    slot.est_step_seconds = r->wall_seconds / static_cast<double>(r->step);
  }
  r->eta_seconds = slot.est_step_seconds * static_cast<double>(tr.steps - r->step);
  return OkStatus();
}

Status LocalRunner::Finish(Slot& slot) {
  TrialResult* r = slot.r;
  const auto start = std::chrono::steady_clock::now();
  if (r->val_curve.empty() || r->val_curve.back().step != r->step) {
    auto val = slot.exec->Evaluate();
    if (!val.ok()) return val.status();
    r->val_curve.push_back({r->step, *val});
  }
  r->final_val_loss = r->val_curve.back().loss;
  r->final_train_loss = MeanOfLast(r->train_curve, 10);
  if (slot.saved_step != r->step) RETURN_IF_ERROR(SaveCheckpoint(slot));
  r->wall_seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  r->state = "Succeeded";
  r->eta_seconds = 0;
  r->peak_device_bytes = slot.exec->stats().peak_device_bytes;
  RETURN_IF_ERROR(WriteTrialResultFile(slot.result_path, *r, slot.fingerprint));
  slot.exec.reset();  // free the trial's memory for the trials still waiting
  std::lock_guard<std::mutex> lock(mu_);
  slot.done = true;
  return OkStatus();
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
