// The hydra command: train a MultiModelJob manifest on this machine with no cluster.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <thread>

#include "agent/executor/spilling_executor.h"
#include "cli/local_runner.h"
#include "cli/progress.h"
#include "cli/results.h"
#include "common/cost_model.h"
#include "common/job.h"
#include "common/job_json.h"
#include "common/partitioner.h"
#include "common/units.h"

namespace {

std::atomic<bool> g_interrupted{false};

void OnSignal(int) {
  if (g_interrupted.exchange(true)) _exit(130);  // second Ctrl-C: stop now
  const char msg[] = "\ninterrupt: checkpointing the running trial (Ctrl-C again to abort)\n";
  ssize_t ignored = write(STDERR_FILENO, msg, sizeof(msg) - 1);
  (void)ignored;
}

int LoadOrExplain(const std::string& path, hydra::MultiModelJob* job,
                  std::vector<hydra::Trial>* trials) {
  auto loaded = hydra::LoadJobFile(path);
  if (!loaded.ok()) {
    std::cerr << "error: " << loaded.status().message() << "\n";
    return 2;
  }
  auto expanded = hydra::ExpandTrials(*loaded);
  if (!expanded.ok()) {
    std::cerr << "error: " << path << ": " << expanded.status().message() << "\n";
    return 2;
  }
  *job = std::move(loaded).value();
  *trials = std::move(expanded).value();
  return 0;
}

int Validate(const std::string& path) {
  hydra::MultiModelJob job;
  std::vector<hydra::Trial> trials;
  if (int rc = LoadOrExplain(path, &job, &trials)) return rc;
  std::cout << path << ": valid MultiModelJob '" << job.metadata.name << "', " << trials.size()
            << " trial" << (trials.size() == 1 ? "" : "s") << "\n";
  for (const auto& t : trials) {
    const auto fp = hydra::EstimateTrialFootprint(t);
    std::cout << "  " << t.name << "  " << hydra::HyperparametersJson(t).dump() << "  "
              << fp.parameters << " parameters, ~" << hydra::FormatBytes(fp.total_bytes())
              << " to train unsharded\n";
  }
  return 0;
}

int Plan(const std::string& path) {
  hydra::MultiModelJob job;
  std::vector<hydra::Trial> trials;
  if (int rc = LoadOrExplain(path, &job, &trials)) return rc;
  int rc = 0;
  for (const auto& t : trials) {
    auto plan = hydra::PlanShards(t, hydra::PartitionOptionsFor(t));
    if (!plan.ok()) {
      std::cout << t.name << ": cannot be planned: " << plan.status().message() << "\n";
      rc = 1;
      continue;
    }
    std::cout << hydra::FormatPlan(t, *plan) << "\n";
  }
  std::cout << "(est. s: forward + backward (+ recompute) seconds per step at 100 GFLOP/s)\n";
  return rc;
}

int Run(const std::string& path, std::string output, int threads, bool restart,
        const std::string& progress_mode, std::string spill_dir) {
  hydra::MultiModelJob job;
  std::vector<hydra::Trial> trials;
  if (int rc = LoadOrExplain(path, &job, &trials)) return rc;
  if (output.empty()) output = (std::filesystem::path("hydra-runs") / job.metadata.name).string();

  std::string mode = progress_mode;
  if (mode == "auto") mode = isatty(STDOUT_FILENO) ? "tty" : "log";
  std::unique_ptr<hydra::cli::ProgressSinkInterface> progress =
      mode == "tty"   ? hydra::cli::MakeTerminalProgress(stdout)
      : mode == "log" ? hydra::cli::MakeLogProgress(stdout)
                      : hydra::cli::MakeQuietProgress(stderr);

  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  hydra::executor::ExecutorOptions exec_options;
  exec_options.threads = threads;
  exec_options.spill_dir =
      spill_dir.empty() ? (std::filesystem::path(output) / "spill").string() : spill_dir;
  auto factory = hydra::executor::MakeExecutorFactory(exec_options);
  hydra::cli::RunOptions options;
  options.output_dir = output;
  options.restart = restart;
  options.interrupted = &g_interrupted;
  hydra::cli::LocalRunner runner(factory.get(), progress.get(), options);

  std::cout << "hydra run: " << trials.size() << " trials of '" << job.metadata.name << "' with "
            << threads << " threads; output in " << output << "\n";
  std::vector<hydra::cli::TrialResult> results;
  hydra::Status status = runner.Run(job, trials, &results);
  if (!status.ok() && status.code() != hydra::StatusCode::kCancelled) {
    std::cerr << "error: " << status.message() << "\n";
    return 1;
  }
  auto ranked = hydra::cli::RankResults(results);
  if (auto s = hydra::cli::WriteResults(output, job.metadata.name, ranked); !s.ok()) {
    std::cerr << "error: writing results: " << s.message() << "\n";
    return 1;
  }
  if (status.code() == hydra::StatusCode::kCancelled) {
    std::cerr << status.message() << "\n";
    return 130;
  }
  if (auto s = hydra::cli::PlotLossCurves(output, ranked); !s.ok()) {
    std::cerr << "warning: " << s.message() << "\n";
  }
  std::cout << "\n" << hydra::cli::FormatRankedTable(ranked) << "\n";
  std::cout << "results: " << output << "/results.json, " << output << "/results.csv, " << output
            << "/loss.png\n";
  for (const auto& r : results) {
    if (r.state != "Succeeded") return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "hydra: train many models at once (model selection) with model spilling and shard "
      "parallelism.\nRuns a MultiModelJob manifest on this machine, without a cluster."};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("hydra ") + HYDRA_VERSION);

  std::string manifest, output, progress = "auto", spill_dir;
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  bool restart = false;
  auto* run = app.add_subcommand("run", "Train every trial of a manifest and rank them");
  run->add_option("manifest", manifest, "MultiModelJob YAML file")
      ->required()
      ->check(CLI::ExistingFile);
  run->add_option("-o,--output", output,
                  "Output directory: checkpoints, results.json, results.csv, loss.png "
                  "(default: hydra-runs/<job name>)");
  run->add_option("--threads", threads, "Intra-op threads for training")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  run->add_flag("--restart", restart,
                "Discard checkpoints and results of an earlier run in the output directory");
  run->add_option("--progress", progress,
                  "auto (a live table on a terminal, log lines otherwise), tty, log or quiet")
      ->check(CLI::IsMember({"auto", "tty", "log", "quiet"}))
      ->capture_default_str();

  run->add_option("--spill-dir", spill_dir,
                  "Directory for shards spilled to disk (spec.resources.offload: disk); "
                  "default: <output>/spill");

  std::string plan_manifest;
  auto* plan = app.add_subcommand(
      "plan", "Print each trial's shard plan: layer ranges, bytes per shard, policies, times");
  plan->add_option("manifest", plan_manifest, "MultiModelJob YAML file")
      ->required()
      ->check(CLI::ExistingFile);

  std::string validate_manifest;
  auto* validate = app.add_subcommand("validate", "Check a manifest and list its trials");
  validate->add_option("manifest", validate_manifest, "MultiModelJob YAML file")
      ->required()
      ->check(CLI::ExistingFile);

  CLI11_PARSE(app, argc, argv);
  if (run->parsed()) return Run(manifest, output, threads, restart, progress, spill_dir);
  if (plan->parsed()) return Plan(plan_manifest);
  if (validate->parsed()) return Validate(validate_manifest);
  return 2;
}
