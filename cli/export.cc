#include "cli/export.h"

#include <algorithm>
#include <filesystem>
#include <vector>

#include "agent/executor/checkpoint.h"
#include "agent/executor/hf_gpt2.h"
#include "common/job.h"
#include "common/job_json.h"

namespace hydra::cli {
namespace {

namespace fs = std::filesystem;

/// The trials of a run directory (names of RUN_DIR/trials/*), sorted, as "a, b, c".
std::string TrialsIn(const fs::path& trials) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(trials, ec)) names.push_back(e.path().filename());
  std::sort(names.begin(), names.end());
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out.empty() ? "none" : out;
}

}  // namespace

StatusOr<ExportReport> ExportTrial(const std::string& run_dir, const std::string& trial,
                                   const std::string& out_dir, std::vector<std::string>* warnings) {
  if (!IsDnsLabel(trial)) {
    return InvalidArgumentError("--trial: '" + trial + "' is not a trial name (a DNS-1123 label)");
  }
  const fs::path trials = fs::path(run_dir) / "trials";
  std::error_code ec;
  if (!fs::is_directory(trials, ec)) {
    return NotFoundError(run_dir + ": not a hydra run output directory (no trials/ in it)");
  }
  if (!fs::is_directory(trials / trial, ec)) {
    return NotFoundError(run_dir + ": no trial '" + trial + "'; its trials: " + TrialsIn(trials));
  }
  executor::CheckpointStore store((trials / trial / "checkpoints").string());
  auto latest = store.LoadLatest(warnings);
  if (!latest.ok()) {
    return Status(latest.status().code(), "trial " + trial + ": " + latest.status().message());
  }
  const int64_t step = latest->meta.value("step", int64_t{0});
  const std::string path = store.PathFor(step);
  if (!latest->meta.contains("model")) {
    return FailedPreconditionError(path +
                                   ": the checkpoint does not record its model (written by an "
                                   "older hydra); resume the run to write a newer one");
  }
  auto model = ModelSpecFromJson(latest->meta["model"]);
  if (!model.ok()) return InvalidArgumentError(path + ": " + model.status().message());
  if (model->family != ModelFamily::kGpt2) {
    return InvalidArgumentError("trial " + trial + " is a " + NameOf(model->family) +
                                " model; only gpt2 exports to Hugging Face's format" +
                                (model->family == ModelFamily::kTorchScript
                                     ? " (its weights are in checkpoints/model.pt when it succeeds)"
                                     : ""));
  }
  if (Status s = executor::WriteHfGpt2(*model, latest->buffers, out_dir); !s.ok()) {
    return Status(s.code(), path + ": " + s.message());
  }
  return ExportReport{path, step, out_dir};
}

}  // namespace hydra::cli
