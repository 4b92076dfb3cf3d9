#include "cli/local_runner.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>

#include "agent/executor/checkpoint.h"
#include "cli/results.h"
#include "common/job_json.h"

namespace hydra::cli {
namespace {

namespace fs = std::filesystem;
using executor::CheckpointData;
using executor::CheckpointStore;

nlohmann::json CurveJson(const std::vector<CurvePoint>& curve) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& p : curve) out.push_back({p.step, p.loss});
  return out;
}

std::vector<CurvePoint> CurveFromJson(const nlohmann::json& j) {
  std::vector<CurvePoint> out;
  for (const auto& p : j) out.push_back({p.at(0).get<int64_t>(), p.at(1).get<double>()});
  return out;
}

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

LocalRunner::LocalRunner(executor::ExecutorFactoryInterface* factory,
                         ProgressSinkInterface* progress, RunOptions options)
    : factory_(factory), progress_(progress), options_(std::move(options)) {}

std::string LocalRunner::TrialDir(const Trial& trial) const {
  return (fs::path(options_.output_dir) / "trials" / trial.name).string();
}

Status LocalRunner::Run(const MultiModelJob& job, const std::vector<Trial>& trials,
                        std::vector<TrialResult>* results) {
  results->clear();
  for (const auto& t : trials) {
    TrialResult r;
    r.trial = t;
    results->push_back(std::move(r));
  }
  std::error_code ec;
  fs::create_directories(options_.output_dir, ec);
  if (ec) {
    return FailedPreconditionError("cannot create output directory " + options_.output_dir + ": " +
                                   ec.message());
  }
  // Pre-flight: every dataset opens and every trial passes admission before any training.
  std::map<std::pair<std::string, int64_t>, std::shared_ptr<const executor::TokenDataset>> data;
  for (const auto& t : trials) {
    const auto key = std::make_pair(t.dataset.resolved_path, t.model.context_length + 1);
    if (!data.count(key)) {
      ASSIGN_OR_RETURN(data[key],
                       executor::TokenDataset::Open(t.dataset, t.model.context_length + 1));
    }
    RETURN_IF_ERROR(factory_->Check(t, *data[key]));
  }
  progress_->OnJobStart(job.metadata.name, *results);
  Status status;
  for (size_t i = 0; i < trials.size(); ++i) {
    const auto key =
        std::make_pair(trials[i].dataset.resolved_path, trials[i].model.context_length + 1);
    Status s = RunTrial(i, data[key], &(*results)[i]);
    if (s.code() == StatusCode::kCancelled) {
      status = s;
      break;
    }
    if (!s.ok()) {
      (*results)[i].state = "Failed";
      (*results)[i].message = s.message();
      progress_->OnTrialUpdate(i, (*results)[i]);
    }
  }
  progress_->OnJobEnd(*results);
  return status;
}

Status LocalRunner::RunTrial(size_t index, std::shared_ptr<const executor::TokenDataset> data,
                             TrialResult* r) {
  const Trial& trial = r->trial;
  const auto& tr = trial.training;
  const std::string dir = TrialDir(trial);
  const std::string fingerprint = TrialFingerprint(trial);
  const std::string result_path = (fs::path(dir) / "result.json").string();
  std::error_code ec;
  if (options_.restart) fs::remove_all(dir, ec);

  // A finished trial of the same configuration is not trained again.
  if (fs::exists(result_path)) {
    std::string previous_fingerprint;
    auto previous = ReadTrialResultFile(result_path, trial, &previous_fingerprint);
    if (previous.ok() && previous->state == "Succeeded" && previous_fingerprint == fingerprint) {
      *r = std::move(previous).value();
      progress_->OnTrialUpdate(index, *r);
      return OkStatus();
    }
    fs::remove(result_path, ec);
  }

  auto created = factory_->Create(trial, data);
  if (!created.ok()) return created.status();
  auto exec = std::move(created).value();
  const auto stats = exec->stats();
  r->shards = stats.shards;
  r->peak_device_bytes = stats.peak_device_bytes;

  CheckpointStore store((fs::path(dir) / "checkpoints").string());
  if (!store.Steps().empty()) {
    std::vector<std::string> warnings;
    auto ckpt = store.LoadLatest(&warnings);
    for (const auto& w : warnings) progress_->OnMessage(trial.name + ": " + w);
    if (!ckpt.ok()) return ckpt.status().WithContext("resuming " + trial.name);
    const std::string found = ckpt->meta.value("fingerprint", "");
    if (found != fingerprint) {
      return FailedPreconditionError(
          "the checkpoints in " + store.dir() + " were made for a different configuration of " +
          trial.name + "; pass --restart to discard them, or choose another --output");
    }
    try {
      RestoreProgress(ckpt->meta, r);
    } catch (const nlohmann::json::exception& e) {
      return DataLossError("checkpoint metadata in " + store.dir() + ": " + e.what());
    }
    RETURN_IF_ERROR(exec->ImportState(r->step, ckpt->buffers)
                        .WithContext("resuming " + trial.name + " from " + store.dir()));
    r->resumed_from_step = r->step;
    progress_->OnMessage(trial.name + ": resumed from the checkpoint of step " +
                         std::to_string(r->step));
  }

  auto save = [&]() -> Status {
    auto state = exec->ExportState();
    if (!state.ok()) return state.status();
    CheckpointData c{ProgressMeta(*r, fingerprint), std::move(state).value()};
    return store.Save(r->step, c);
  };
  auto evaluate = [&]() -> Status {
    auto val = exec->Evaluate();
    if (!val.ok()) return val.status();
    if (r->val_curve.empty() || r->val_curve.back().step != r->step) {
      r->val_curve.push_back({r->step, *val});
    }
    return OkStatus();
  };

  r->state = "Running";
  progress_->OnTrialUpdate(index, *r);
  auto last = std::chrono::steady_clock::now();
  auto tick = [&]() {
    const auto now = std::chrono::steady_clock::now();
    r->wall_seconds += std::chrono::duration<double>(now - last).count();
    last = now;
  };
  int64_t saved_step = r->resumed_from_step;
  while (r->step < tr.steps) {
    if (options_.interrupted && options_.interrupted->load()) {
      tick();
      if (r->step > saved_step) RETURN_IF_ERROR(save());
      r->state = "Interrupted";
      r->message = "interrupted at step " + std::to_string(r->step);
      progress_->OnTrialUpdate(index, *r);
      return CancelledError("interrupted; run the same command again to resume");
    }
    auto m = exec->TrainStep();
    if (!m.ok()) return m.status();
    r->step = exec->step();
    r->train_curve.push_back({r->step, m->loss});
    r->last_loss = m->loss;
    r->train_seconds += m->seconds;
    r->trained_tokens += m->tokens;
    r->tokens_per_second = static_cast<double>(r->trained_tokens) / r->train_seconds;
    if (tr.eval_every_steps > 0 && r->step % tr.eval_every_steps == 0 && r->step < tr.steps) {
      RETURN_IF_ERROR(evaluate());
    }
    tick();
    if (tr.checkpoint_every_steps > 0 && r->step % tr.checkpoint_every_steps == 0 &&
        r->step < tr.steps) {
      RETURN_IF_ERROR(save());
      saved_step = r->step;
      tick();
    }
    r->eta_seconds =
        r->wall_seconds / static_cast<double>(r->step) * static_cast<double>(tr.steps - r->step);
    progress_->OnTrialUpdate(index, *r);
  }
  RETURN_IF_ERROR(evaluate());
  r->final_val_loss = r->val_curve.back().loss;
  r->final_train_loss = MeanOfLast(r->train_curve, 10);
  tick();
  if (saved_step != r->step) RETURN_IF_ERROR(save());
  tick();
  r->state = "Succeeded";
  r->eta_seconds = 0;
  r->peak_device_bytes = exec->stats().peak_device_bytes;
  RETURN_IF_ERROR(WriteTrialResultFile(result_path, *r, fingerprint));
  progress_->OnTrialUpdate(index, *r);
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
