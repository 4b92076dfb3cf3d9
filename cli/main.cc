// The hydra command: train a MultiModelJob manifest on this machine with no cluster.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <optional>
#include <thread>

#include "agent/executor/cpu_threads.h"
#include "agent/executor/gpus.h"
#include "agent/executor/model_loader.h"
#include "agent/executor/pilot.h"
#include "agent/executor/spilling_executor.h"
#include "cli/eval.h"
#include "cli/export.h"
#include "cli/local_runner.h"
#include "cli/progress.h"
#include "cli/results.h"
#include "cli/simulate.h"
#include "common/cost_model.h"
#include "common/job.h"
#include "common/job_json.h"
#include "common/partitioner.h"
#include "common/schedule_profile.h"
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
  // A TorchScript model is loaded and checked now: a bad file is an error before anything
  // runs, and its layers are known to the planner.
  for (auto& t : *trials) {
    if (auto s = hydra::executor::ResolveModel(&t); !s.ok()) {
      std::cerr << "error: " << path << ": " << s.message() << "\n";
      return 2;
    }
  }
  return 0;
}

int Validate(const std::string& path) {
  hydra::MultiModelJob job;
  std::vector<hydra::Trial> trials;
  if (int rc = LoadOrExplain(path, &job, &trials)) return rc;
  std::cout << path << ": valid MultiModelJob '" << job.metadata.name << "', " << trials.size()
            << " trial" << (trials.size() == 1 ? "" : "s");
  if (job.spec.random) {
    std::cout << " drawn at random (seed " << job.spec.random->seed << ")";
  }
  std::cout << "\n";
  int64_t longest = 0;
  for (const auto& t : trials) longest = std::max(longest, t.training.steps);
  if (auto es = hydra::DescribeEarlyStopping(job.spec.early_stopping, longest); !es.empty()) {
    std::cout << "early stopping: " << es << "\n";
  }
  if (const auto& a = job.spec.agents) {
    std::cout << "agents (in Kubernetes; hydra run ignores them): the job's own pods, "
              << a->min_agents << " to " << a->max_agents << ", "
              << (a->gpus_per_agent > 0 ? std::to_string(a->gpus_per_agent) + " GPU"
                                        : std::string("a CPU agent"))
              << (a->gpus_per_agent > 1 ? "s" : "") << " each (container " << a->container << ")\n";
  }
  for (const auto& t : trials) {
    const auto fp = hydra::EstimateTrialFootprint(t);
    std::cout << "  " << t.name << "  " << hydra::HyperparametersJson(t).dump() << "  "
              << fp.parameters << " parameters, ~" << hydra::FormatBytes(fp.total_bytes())
              << " to train unsharded\n";
  }
  return 0;
}

/// The device `hydra plan --pilot-device` names: "cpu", or a GPU of the CUDA build ("cuda":
/// the first visible one, "cuda:I").
hydra::StatusOr<hydra::DeviceSpec> PilotDevice(const std::string& flag) {
  if (flag == "cpu") return hydra::DeviceSpec();
  auto request = hydra::ParseDevicesRequest(flag);
  if (!request.ok() || request->kind != hydra::DeviceKind::kCuda ||
      request->cuda_indices.size() > 1 || request->budget) {
    return hydra::InvalidArgumentError("--pilot-device: expected cpu, cuda or cuda:I, got '" +
                                       flag + "'");
  }
  auto devices = hydra::executor::FindDevices(*request, 0);
  hydra::Status usable =
      devices.ok() ? hydra::executor::CheckExecutorsCanUse(*devices) : devices.status();
  if (!usable.ok()) {
    std::string m = usable.message();
    if (m.rfind("--devices: ", 0) == 0) m = m.substr(11);
    return hydra::Status(usable.code(), "--pilot-device: " + m);
  }
  return devices->front();
}

/// The executor options `hydra run` would plan with on the pilot's device: the pilot's rate, and
/// on a GPU the rates `hydra run` measures there (UseMeasuredLinkRates), which it prints. 0:
/// ready (`*pilot_line` says what the pilot measured); otherwise the exit code.
int PilotOptions(const hydra::Trial& first, const std::string& pilot_device,
                 hydra::executor::ExecutorOptions* options, std::string* pilot_line) {
  auto device = PilotDevice(pilot_device.empty() ? "cpu" : pilot_device);
  if (!device.ok()) {
    std::cerr << "error: " << device.status().message() << "\n";
    return 2;
  }
  hydra::executor::ConfigureCudaAllocator();
  hydra::executor::ConfigureCpuThreads(options->threads);
  auto p = hydra::executor::RunPilot(first, *device);
  if (!p.ok()) {
    std::cerr << "error: " << p.status().message() << "\n";
    return 1;
  }
  options->flops_per_second = p->flops_per_second;
  if (device->kind == hydra::DeviceKind::kCuda) {
    options->devices.devices = {*device};
    const std::string rates = hydra::executor::UseMeasuredLinkRates(options);
    if (rates.rfind("warning: ", 0) == 0) {
      std::cerr << "error: " << rates.substr(9) << "\n";
      return 1;
    }
    std::cout << rates << "\n";
  }
  char line[512];
  std::snprintf(line, sizeof line,
                "pilot (%s) on %s: layer %s forward+backward (attention %s) took %.4f s; the cost "
                "model's %.3g FLOPs at 100 GFLOP/s predict %.4f s (measured/predicted %.2f)",
                first.name.c_str(), p->device.c_str(), p->layer.c_str(),
                hydra::AttentionMemoryName(p->attention), p->layer_seconds, p->layer_flops,
                p->layer_flops / 1e11, p->layer_seconds / (p->layer_flops / 1e11));
  *pilot_line = line;
  return 0;
}

int Plan(const std::string& path, bool pilot, const std::string& pilot_device, int threads,
         const std::string& optimizer) {
  hydra::MultiModelJob job;
  std::vector<hydra::Trial> trials;
  if (int rc = LoadOrExplain(path, &job, &trials)) return rc;
  // The options `hydra run` gives its executors, so that these plans are the ones it trains.
  hydra::executor::ExecutorOptions options;
  options.threads = threads;
  options.optimizer_placement = *hydra::ParseOptimizerFlag(optimizer);  // checked by CLI11
  if (pilot || !pilot_device.empty()) {
    std::string pilot_line;
    if (int rc = PilotOptions(trials.front(), pilot_device, &options, &pilot_line)) return rc;
    char bf16[64] = "";  // on a GPU, the measured rate bf16 trials plan with
    if (options.bf16_flops_per_second > 0) {
      std::snprintf(bf16, sizeof bf16, " (bf16 trials: %.1f GFLOP/s)",
                    options.bf16_flops_per_second / 1e9);
    }
    std::printf("%s; estimates below use %.1f GFLOP/s%s\n\n", pilot_line.c_str(),
                options.flops_per_second / 1e9, bf16);
  }
  int rc = 0;
  for (const auto& given : trials) {
    const hydra::Trial t = hydra::executor::WithDeviceBudget(given, options.devices);
    auto plan = hydra::PlanShards(t, hydra::executor::ExecutorPartitionOptions(t, options));
    if (!plan.ok()) {
      std::cout << t.name << ": cannot be planned: " << plan.status().message() << "\n";
      rc = 1;
      continue;
    }
    std::cout << hydra::FormatPlan(t, *plan) << "\n";
  }
  std::printf("(est. s: forward + backward (+ recompute) seconds per step at %.1f GFLOP/s%s)\n",
              options.flops_per_second / 1e9, pilot ? ", measured" : "; --pilot measures it");
  return rc;
}

struct SimulateArgs {
  std::string manifest, profile, chart, device_memory, stopped_at;
  double stop_fraction = -1;
  int devices = 1;
  int micro_batches = 0;
  double flops = 1e11;
  double link = 0;
  bool json = false;
};

int Simulate(const SimulateArgs& a) {
  std::vector<hydra::TrialProfile> profiles;
  double link = a.link;
  if (!a.profile.empty()) {
    auto loaded = hydra::cli::LoadProfileFile(a.profile, &link);
    if (!loaded.ok()) {
      std::cerr << "error: " << loaded.status().message() << "\n";
      return 2;
    }
    profiles = std::move(loaded).value();
    if (a.link > 0) link = a.link;
  } else {
    hydra::MultiModelJob job;
    std::vector<hydra::Trial> trials;
    if (int rc = LoadOrExplain(a.manifest, &job, &trials)) return rc;
    for (auto& t : trials) {
      if (!a.device_memory.empty()) {
        auto bytes = hydra::ParseByteQuantity(a.device_memory);
        if (!bytes.ok()) {
          std::cerr << "error: --device-memory: " << bytes.status().message() << "\n";
          return 2;
        }
        t.resources.device_memory_budget = *bytes;
      }
      auto plan = hydra::PlanShards(t, hydra::PartitionOptionsFor(t));
      if (!plan.ok()) {
        std::cerr << "error: " << t.name << ": " << plan.status().message() << "\n";
        return 1;
      }
      profiles.push_back(hydra::ProfileFromPlan(t, *plan, a.flops));
    }
    auto modelled =
        hydra::cli::ModelEarlyStopping(job, trials, a.stop_fraction, a.stopped_at, &profiles);
    if (!modelled.ok()) {
      std::cerr << "error: " << modelled.status().message() << "\n";
      return 2;
    }
    if (!a.json) std::cout << *modelled;
  }
  hydra::SimulationOptions options;
  options.devices = a.devices;
  options.link_bytes_per_second = link;
  const int m = a.micro_batches > 0 ? a.micro_batches : 4 * a.devices;
  auto report = hydra::cli::RunSimulation(profiles, options, m);
  if (a.json) {
    std::cout << hydra::cli::SimulationJson(report).dump(2) << "\n";
  } else {
    std::cout << hydra::cli::FormatSimulation(report, options);
  }
  if (!a.chart.empty()) {
    auto s =
        hydra::cli::DrawGantt(report.schedule, profiles, a.devices, a.chart,
                              "Sharded-LRTF schedule, " + std::to_string(a.devices) + " devices");
    if (!s.ok()) {
      std::cerr << "error: " << s.message() << "\n";
      return 1;
    }
    if (!a.json) std::cout << "chart: " << a.chart << "\n";
  }
  return 0;
}

struct RunArgs {
  std::string manifest, output, progress = "auto", spill_dir, devices = "auto", host_memory, chart;
  std::string optimizer = "auto";  // --optimizer (ParseOptimizerFlag)
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  bool restart = false;
};

int Run(const RunArgs& a) {
  const std::string& path = a.manifest;
  std::string output = a.output;
  const std::string& progress_mode = a.progress;
  int devices = 0;
  std::vector<hydra::DeviceSpec> device_specs;
  if (a.devices != "auto") {
    // A CPU device's memory is each trial's resources.deviceMemoryBudget here, not a flag; a
    // GPU's is its memory, or budget= (which caps what its trials may use together).
    auto found = [&]() -> hydra::StatusOr<std::vector<hydra::DeviceSpec>> {
      ASSIGN_OR_RETURN(auto request, hydra::ParseDevicesRequest(a.devices));
      if (request.budget && request.kind == hydra::DeviceKind::kCpu) {
        return hydra::InvalidArgumentError(
            "--devices: hydra run takes no budget= for CPU devices (a trial's device memory is "
            "its spec.resources.deviceMemoryBudget); budget= caps GPUs (cuda,budget=20Gi)");
      }
      ASSIGN_OR_RETURN(auto devices, hydra::executor::FindDevices(request, 0));
      RETURN_IF_ERROR(hydra::executor::CheckExecutorsCanUse(devices));
      return devices;
    }();
    if (!found.ok()) {
      std::cerr << "error: " << found.status().message() << "\n";
      return 2;
    }
    devices = static_cast<int>(found->size());
    device_specs = *found;
  }
  int64_t host_memory = 0;
  if (!a.host_memory.empty()) {
    auto bytes = hydra::ParseByteQuantity(a.host_memory);
    if (!bytes.ok()) {
      std::cerr << "error: --host-memory: " << bytes.status().message() << "\n";
      return 2;
    }
    host_memory = *bytes;
  }

  hydra::MultiModelJob job;
  std::vector<hydra::Trial> trials;
  if (int rc = LoadOrExplain(path, &job, &trials)) return rc;
  if (job.spec.suspend) {
    std::cerr << "error: " << path
              << ": spec.suspend is true: the job is suspended; set it to false (or remove it) to "
                 "train\n";
    return 2;
  }
  if (output.empty()) output = (std::filesystem::path("hydra-runs") / job.metadata.name).string();
  // auto: one single-threaded CPU device per core (small models train far faster this way
  // than with threads fighting over one trial), but no more devices than trials.
  if (devices == 0)
    devices = std::max(1, std::min<int>(a.threads, static_cast<int>(trials.size())));
  // CPU devices share the cores without oversubscribing them.
  const bool gpus = !device_specs.empty() && device_specs[0].kind == hydra::DeviceKind::kCuda;
  const int threads = gpus ? a.threads : std::max(1, a.threads / devices);

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
  exec_options.devices.devices = device_specs;
  exec_options.optimizer_placement = *hydra::ParseOptimizerFlag(a.optimizer);  // checked by CLI11
  if (gpus) {
    if (auto capped = hydra::executor::CapGpuMemory(device_specs); !capped.ok()) {
      std::cerr << "error: " << capped.message() << "\n";
      return 2;
    }
    const std::string rates = hydra::executor::UseMeasuredLinkRates(&exec_options);
    (rates.rfind("warning: ", 0) == 0 ? std::cerr : std::cout) << rates << "\n";
  }
  exec_options.spill_dir =
      a.spill_dir.empty() ? (std::filesystem::path(output) / "spill").string() : a.spill_dir;
  auto factory = hydra::executor::MakeExecutorFactory(exec_options);
  hydra::cli::RunOptions options;
  options.output_dir = output;
  options.restart = a.restart;
  options.interrupted = &g_interrupted;
  options.devices = devices;
  options.device_memory_bytes = hydra::DiscreteDeviceMemory(device_specs);
  options.host_memory_bytes = host_memory;
  options.spill_dir = exec_options.spill_dir;
  options.threads = threads;
  hydra::cli::LocalRunner runner(factory.get(), progress.get(), options);

  std::cout << "hydra run: " << trials.size() << " trials of '" << job.metadata.name << "' on ";
  if (gpus) {
    for (size_t i = 0; i < device_specs.size(); ++i) {
      std::cout << (i ? ", " : "") << device_specs[i].name << " (" << device_specs[i].model << ", "
                << hydra::FormatBytes(device_specs[i].memory_bytes) << ")";
    }
  } else {
    std::cout << devices << " CPU device" << (devices == 1 ? "" : "s") << " of " << threads
              << " thread" << (threads == 1 ? "" : "s");
  }
  std::cout << ", Sharded-LRTF; output in " << output << "\n";
  std::vector<hydra::cli::TrialResult> results;
  hydra::Status status = runner.Run(job, trials, &results);
  std::error_code ignored;
  std::filesystem::remove(exec_options.spill_dir, ignored);  // only if empty: spills are gone
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
  if (!a.chart.empty()) {
    std::vector<hydra::TrialProfile> names;
    for (const auto& t : trials) names.push_back({t.name, {}, 0});
    if (auto s = hydra::cli::DrawGantt(runner.schedule(), names, devices, a.chart,
                                       "hydra run schedule (one box per optimizer step)");
        !s.ok()) {
      std::cerr << "warning: " << s.message() << "\n";
    }
  }
  std::cout << "\n" << hydra::cli::FormatRankedTable(ranked) << "\n";
  std::cout << "results: " << output << "/results.json, " << output << "/results.csv, " << output
            << "/loss.png\n";
  for (const auto& r : results) {
    if (r.state != hydra::kTrialSucceeded && r.state != hydra::kTrialEarlyStopped) return 1;
  }
  return 0;
}

int Export(const std::string& run_dir, const std::string& trial, const std::string& out) {
  std::vector<std::string> warnings;
  auto report = hydra::cli::ExportTrial(run_dir, trial, out, &warnings);
  for (const auto& w : warnings) std::cerr << "warning: " << w << "\n";
  if (!report.ok()) {
    std::cerr << "error: " << report.status().message() << "\n";
    return 2;
  }
  std::cout << "exported " << trial << " at step " << report->step << " (" << report->checkpoint
            << ") to " << out << ": model.safetensors, config.json\n"
            << "load it with transformers.GPT2LMHeadModel.from_pretrained(\"" << out << "\")\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Before anything touches a GPU: the caching allocator reads its settings once.
  hydra::executor::ConfigureCudaAllocator();
  CLI::App app{
      "hydra: train many models at once (model selection) with model spilling and shard "
      "parallelism.\nRuns a MultiModelJob manifest on this machine, without a cluster."};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("hydra ") + HYDRA_VERSION);

  RunArgs ra;
  auto* run = app.add_subcommand("run", "Train every trial of a manifest and rank them");
  run->add_option("manifest", ra.manifest, "MultiModelJob YAML file")
      ->required()
      ->check(CLI::ExistingFile);
  run->add_option("-o,--output", ra.output,
                  "Output directory: checkpoints, results.json, results.csv, loss.png "
                  "(default: hydra-runs/<job name>)");
  run->add_option("--threads", ra.threads, "CPU threads for training, shared by the devices")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  run->add_flag("--restart", ra.restart,
                "Discard checkpoints and results of an earlier run in the output directory");
  run->add_option("--progress", ra.progress,
                  "auto (a live table on a terminal, log lines otherwise), tty, log or quiet")
      ->check(CLI::IsMember({"auto", "tty", "log", "quiet"}))
      ->capture_default_str();

  run->add_option("--spill-dir", ra.spill_dir,
                  "Directory for shards spilled to disk (spec.resources.offload: disk); "
                  "default: <output>/spill");

  run->add_option(
         "--devices", ra.devices,
         "Devices that train trials at once: cpu:N splits the threads into N CPU "
         "devices; auto: one per thread, at most one per trial; cuda, cuda:0,2: GPUs "
         "(the CUDA build, scripts/build-cuda.sh); cuda,budget=20Gi caps each GPU (default: 90% "
         "of its free memory)")
      ->capture_default_str();
  run->add_option("--host-memory", ra.host_memory,
                  "Host memory the admitted trials may use (e.g. 16Gi); others wait in order "
                  "(default: 75% of the machine's memory, or of its cgroup's limit if less)");
  run->add_option("--chart", ra.chart, "Write a Gantt chart of the run's schedule to this PNG");
  run->add_option("--optimizer", ra.optimizer, hydra::kOptimizerFlagHelp)
      ->check(CLI::IsMember(hydra::kOptimizerFlagChoices))
      ->capture_default_str();

  std::string plan_manifest;
  bool plan_pilot = false;
  std::string plan_pilot_device;
  auto* plan = app.add_subcommand(
      "plan", "Print each trial's shard plan: layer ranges, bytes per shard, policies, times");
  plan->add_option("manifest", plan_manifest, "MultiModelJob YAML file")
      ->required()
      ->check(CLI::ExistingFile);
  plan->add_flag("--pilot", plan_pilot,
                 "Time the model's heaviest layer on this machine first and use the measured "
                 "rate for the estimates");
  plan->add_option("--pilot-device", plan_pilot_device,
                   "Where --pilot times (implies it): cpu (default), or a GPU of the CUDA build: "
                   "cuda (the first) or cuda:I, whose host link, host AdamW and block rates "
                   "are measured too and planned with as `hydra run` does there (stashed "
                   "graphs kept in the GPU's memory; a trial without a device budget gets the "
                   "GPU's)");
  std::string plan_optimizer = "auto";
  plan->add_option("--optimizer", plan_optimizer, hydra::kOptimizerFlagHelp)
      ->check(CLI::IsMember(hydra::kOptimizerFlagChoices))
      ->capture_default_str();

  SimulateArgs sim;
  auto* simulate = app.add_subcommand(
      "simulate",
      "Simulate the Sharded-LRTF schedule of a job (or a profile file) over N devices, with the "
      "lower bound and the baselines");
  simulate->add_option("manifest", sim.manifest, "MultiModelJob YAML file")
      ->check(CLI::ExistingFile);
  simulate
      ->add_option("--profile", sim.profile,
                   "JSON profile of per-shard compute times and bytes instead of a manifest")
      ->check(CLI::ExistingFile);
  simulate->add_option("--devices", sim.devices, "Number of devices")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  simulate->add_option("--device-memory", sim.device_memory,
                       "Device memory for planning shards (e.g. 16Gi); default: the manifest's "
                       "deviceMemoryBudget");
  simulate->add_option("--flops", sim.flops, "Device compute rate, FLOP/s")->capture_default_str();
  simulate
      ->add_option("--link-bandwidth", sim.link,
                   "Host<->device bytes/s (0: free, as for CPU devices)")
      ->capture_default_str();
  simulate->add_option("--micro-batches", sim.micro_batches,
                       "Micro-batches of the GPipe baseline (default: 4 x devices; at most each "
                       "trial's batchSize)");
  simulate
      ->add_option("--stop-fraction", sim.stop_fraction,
                   "Early stopping: the fraction of trials that stop at each rung (default: the "
                   "manifest's algorithm's own, ASHA 1 - 1/reductionFactor, median 0.5)")
      ->check(CLI::Range(0.0, 1.0));
  simulate
      ->add_option("--stopped-at", sim.stopped_at,
                   "Early stopping as measured: a hydra run results.json whose trials' steps "
                   "the simulated trials train")
      ->check(CLI::ExistingFile);
  simulate->add_flag("--json", sim.json, "Print the result as JSON");
  simulate->add_option("--chart", sim.chart, "Write a Gantt chart of the schedule to this PNG");

  std::string validate_manifest;
  auto* validate = app.add_subcommand("validate", "Check a manifest and list its trials");
  validate->add_option("manifest", validate_manifest, "MultiModelJob YAML file")
      ->required()
      ->check(CLI::ExistingFile);

  std::string export_run, export_trial, export_out;
  auto* exp = app.add_subcommand(
      "export",
      "Write a trained gpt2 trial of a hydra run as a Hugging Face model directory "
      "(model.safetensors, config.json) that GPT2LMHeadModel.from_pretrained loads");
  exp->add_option("run_dir", export_run, "The run's output directory (hydra run -o)")
      ->required()
      ->check(CLI::ExistingDirectory);
  exp->add_option("--trial", export_trial, "The trial's name (as in results.json)")->required();
  exp->add_option("-o,--output", export_out, "Directory to write (created if missing)")->required();

  hydra::cli::EvalArgs ea;
  ea.threads = ra.threads;
  auto* eval = app.add_subcommand(
      "eval",
      "Print the mean next-token cross-entropy of a pretrained gpt2 checkpoint over a token file, "
      "cut into non-overlapping windows of contextLength + 1 tokens (the last partial window "
      "is dropped)");
  eval->add_option("manifest", ea.manifest,
                   "MultiModelJob YAML file: its spec.model fields and spec.dataset.format")
      ->required()
      ->check(CLI::ExistingFile);
  eval->add_option("--init", ea.init, "A Hugging Face GPT2LMHeadModel model.safetensors")
      ->required();
  eval->add_option("--data", ea.data, "The token file to score, in spec.dataset.format")
      ->required();
  eval->add_flag("--json", ea.json, "Print {\"loss\": ..., \"tokens\": ...}");
  eval->add_option("--threads", ea.threads, "CPU threads")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();

  CLI11_PARSE(app, argc, argv);
  if (run->parsed()) return Run(ra);
  if (plan->parsed()) {
    return Plan(plan_manifest, plan_pilot, plan_pilot_device, ra.threads, plan_optimizer);
  }
  if (simulate->parsed()) {
    if (sim.manifest.empty() == sim.profile.empty()) {
      std::cerr << "error: hydra simulate takes a manifest or --profile FILE (one of them)\n";
      return 2;
    }
    return Simulate(sim);
  }
  if (validate->parsed()) return Validate(validate_manifest);
  if (exp->parsed()) return Export(export_run, export_trial, export_out);
  if (eval->parsed()) return hydra::cli::Eval(ea);
  return 2;
}
