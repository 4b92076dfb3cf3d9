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

/// --devices: none for auto (CPU devices, as many as the threads and trials allow), else the
/// devices it names. A CPU device's memory is each trial's resources.deviceMemoryBudget here,
/// not a flag; a GPU's is its memory, or budget= (which caps what its trials may use together).
hydra::StatusOr<std::vector<hydra::DeviceSpec>> RunDevices(const std::string& flag) {
  if (flag == "auto") return std::vector<hydra::DeviceSpec>();
  ASSIGN_OR_RETURN(auto request, hydra::ParseDevicesRequest(flag));
  if (request.budget && request.kind == hydra::DeviceKind::kCpu) {
    return hydra::InvalidArgumentError(
        "--devices: hydra run takes no budget= for CPU devices (a trial's device memory is "
        "its spec.resources.deviceMemoryBudget); budget= caps GPUs (cuda,budget=20Gi)");
  }
  ASSIGN_OR_RETURN(auto devices, hydra::executor::FindDevices(request, 0));
  RETURN_IF_ERROR(hydra::executor::CheckExecutorsCanUse(devices));
  return devices;
}

/// --progress: a live table on a terminal, log lines, or nothing but errors.
std::unique_ptr<hydra::cli::ProgressSinkInterface> Progress(std::string mode) {
  if (mode == "auto") mode = isatty(STDOUT_FILENO) ? "tty" : "log";
  return mode == "tty"   ? hydra::cli::MakeTerminalProgress(stdout)
         : mode == "log" ? hydra::cli::MakeLogProgress(stdout)
                         : hydra::cli::MakeQuietProgress(stderr);
}

/// "hydra run: N trials of 'job' on <devices>, Sharded-LRTF; output in <dir>".
void PrintRunHeader(const hydra::MultiModelJob& job, size_t trials,
                    const std::vector<hydra::DeviceSpec>& gpus, int devices, int threads,
                    const std::string& output) {
  std::cout << "hydra run: " << trials << " trials of '" << job.metadata.name << "' on ";
  if (!gpus.empty()) {
    for (size_t i = 0; i < gpus.size(); ++i) {
      std::cout << (i ? ", " : "") << gpus[i].name << " (" << gpus[i].model << ", "
                << hydra::FormatBytes(gpus[i].memory_bytes) << ")";
    }
  } else {
    std::cout << devices << " CPU device" << (devices == 1 ? "" : "s") << " of " << threads
              << " thread" << (threads == 1 ? "" : "s");
  }
  std::cout << ", Sharded-LRTF; output in " << output << "\n";
}

/// After the run: the results files, the loss plot and the chart, the ranked table; the exit
/// code (130 when interrupted, 1 when a trial did not end well).
int ReportRun(const hydra::MultiModelJob& job, const std::vector<hydra::Trial>& trials,
              const hydra::Status& status, const std::vector<hydra::cli::TrialResult>& results,
              const hydra::cli::LocalRunner& runner, int devices, const std::string& output,
              const std::string& chart) {
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
  if (!chart.empty()) {
    std::vector<hydra::TrialProfile> names;
    for (const auto& t : trials) names.push_back({t.name, {}, 0});
    if (auto s = hydra::cli::DrawGantt(runner.schedule(), names, devices, chart,
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

int Run(const RunArgs& a) {
  auto device_specs = RunDevices(a.devices);
  if (!device_specs.ok()) {
    std::cerr << "error: " << device_specs.status().message() << "\n";
    return 2;
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
  if (int rc = LoadOrExplain(a.manifest, &job, &trials)) return rc;
  if (job.spec.suspend) {
    std::cerr << "error: " << a.manifest
              << ": spec.suspend is true: the job is suspended; set it to false (or remove it) to "
                 "train\n";
    return 2;
  }
  const std::string output =
      a.output.empty() ? (std::filesystem::path("hydra-runs") / job.metadata.name).string()
                       : a.output;
  // auto: one single-threaded CPU device per core (small models train far faster this way
  // than with threads fighting over one trial), but no more devices than trials.
  const int devices = !device_specs->empty()
                          ? static_cast<int>(device_specs->size())
                          : std::max(1, std::min<int>(a.threads, static_cast<int>(trials.size())));
  // CPU devices share the cores without oversubscribing them.
  const bool gpus = !device_specs->empty() && (*device_specs)[0].kind == hydra::DeviceKind::kCuda;
  const int threads = gpus ? a.threads : std::max(1, a.threads / devices);
  std::unique_ptr<hydra::cli::ProgressSinkInterface> progress = Progress(a.progress);

  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  hydra::executor::ExecutorOptions exec_options;
  exec_options.threads = threads;
  exec_options.devices.devices = *device_specs;
  exec_options.optimizer_placement = *hydra::ParseOptimizerFlag(a.optimizer);  // checked by CLI11
  if (gpus) {
    if (auto capped = hydra::executor::CapGpuMemory(*device_specs); !capped.ok()) {
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
  options.device_memory_bytes = hydra::DiscreteDeviceMemory(*device_specs);
  options.host_memory_bytes = host_memory;
  options.spill_dir = exec_options.spill_dir;
  options.threads = threads;
  hydra::cli::LocalRunner runner(factory.get(), progress.get(), options);

  PrintRunHeader(job, trials.size(), gpus ? *device_specs : std::vector<hydra::DeviceSpec>(),
                 devices, threads, output);
  std::vector<hydra::cli::TrialResult> results;
  hydra::Status status = runner.Run(job, trials, &results);
  std::error_code ignored;
  std::filesystem::remove(exec_options.spill_dir, ignored);  // only if empty: spills are gone
  return ReportRun(job, trials, status, results, runner, devices, output, a.chart);
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

CLI::App* AddRun(CLI::App& app, RunArgs* ra) {
  auto* run = app.add_subcommand("run", "Train every trial of a manifest and rank them");
  run->add_option("manifest", ra->manifest, "MultiModelJob YAML file")
      ->required()
      ->check(CLI::ExistingFile);
  run->add_option("-o,--output", ra->output,
                  "Output directory: checkpoints, results.json, results.csv, loss.png "
                  "(default: hydra-runs/<job name>)");
  run->add_option("--threads", ra->threads, "CPU threads for training, shared by the devices")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  run->add_flag("--restart", ra->restart,
                "Discard checkpoints and results of an earlier run in the output directory");
  run->add_option("--progress", ra->progress,
                  "auto (a live table on a terminal, log lines otherwise), tty, log or quiet")
      ->check(CLI::IsMember({"auto", "tty", "log", "quiet"}))
      ->capture_default_str();
  run->add_option("--spill-dir", ra->spill_dir,
                  "Directory for shards spilled to disk (spec.resources.offload: disk); "
                  "default: <output>/spill");
  run->add_option(
         "--devices", ra->devices,
         "Devices that train trials at once: cpu:N splits the threads into N CPU "
         "devices; auto: one per thread, at most one per trial; cuda, cuda:0,2: GPUs "
         "(the CUDA build, scripts/build-cuda.sh); cuda,budget=20Gi caps each GPU (default: 90% "
         "of its free memory)")
      ->capture_default_str();
  run->add_option("--host-memory", ra->host_memory,
                  "Host memory the admitted trials may use (e.g. 16Gi); others wait in order "
                  "(default: 75% of the machine's memory, or of its cgroup's limit if less)");
  run->add_option("--chart", ra->chart, "Write a Gantt chart of the run's schedule to this PNG");
  run->add_option("--optimizer", ra->optimizer, hydra::kOptimizerFlagHelp)
      ->check(CLI::IsMember(hydra::kOptimizerFlagChoices))
      ->capture_default_str();
  return run;
}

struct PlanArgs {
  std::string manifest, pilot_device, optimizer = "auto";
  bool pilot = false;
};

CLI::App* AddPlan(CLI::App& app, PlanArgs* pa) {
  auto* plan = app.add_subcommand(
      "plan", "Print each trial's shard plan: layer ranges, bytes per shard, policies, times");
  plan->add_option("manifest", pa->manifest, "MultiModelJob YAML file")
      ->required()
      ->check(CLI::ExistingFile);
  plan->add_flag("--pilot", pa->pilot,
                 "Time the model's heaviest layer on this machine first and use the measured "
                 "rate for the estimates");
  plan->add_option("--pilot-device", pa->pilot_device,
                   "Where --pilot times (implies it): cpu (default), or a GPU of the CUDA build: "
                   "cuda (the first) or cuda:I, whose host link, host AdamW and block rates "
                   "are measured too and planned with as `hydra run` does there (stashed "
                   "graphs kept in the GPU's memory; a trial without a device budget gets the "
                   "GPU's)");
  plan->add_option("--optimizer", pa->optimizer, hydra::kOptimizerFlagHelp)
      ->check(CLI::IsMember(hydra::kOptimizerFlagChoices))
      ->capture_default_str();
  return plan;
}

CLI::App* AddSimulate(CLI::App& app, SimulateArgs* sim) {
  auto* simulate = app.add_subcommand(
      "simulate",
      "Simulate the Sharded-LRTF schedule of a job (or a profile file) over N devices, with the "
      "lower bound and the baselines");
  simulate->add_option("manifest", sim->manifest, "MultiModelJob YAML file")
      ->check(CLI::ExistingFile);
  simulate
      ->add_option("--profile", sim->profile,
                   "JSON profile of per-shard compute times and bytes instead of a manifest")
      ->check(CLI::ExistingFile);
  simulate->add_option("--devices", sim->devices, "Number of devices")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  simulate->add_option("--device-memory", sim->device_memory,
                       "Device memory for planning shards (e.g. 16Gi); default: the manifest's "
                       "deviceMemoryBudget");
  simulate->add_option("--flops", sim->flops, "Device compute rate, FLOP/s")->capture_default_str();
  simulate
      ->add_option("--link-bandwidth", sim->link,
                   "Host<->device bytes/s (0: free, as for CPU devices)")
      ->capture_default_str();
  simulate->add_option("--micro-batches", sim->micro_batches,
                       "Micro-batches of the GPipe baseline (default: 4 x devices; at most each "
                       "trial's batchSize)");
  simulate
      ->add_option("--stop-fraction", sim->stop_fraction,
                   "Early stopping: the fraction of trials that stop at each rung (default: the "
                   "manifest's algorithm's own, ASHA 1 - 1/reductionFactor, median 0.5)")
      ->check(CLI::Range(0.0, 1.0));
  simulate
      ->add_option("--stopped-at", sim->stopped_at,
                   "Early stopping as measured: a hydra run results.json whose trials' steps "
                   "the simulated trials train")
      ->check(CLI::ExistingFile);
  simulate->add_flag("--json", sim->json, "Print the result as JSON");
  simulate->add_option("--chart", sim->chart, "Write a Gantt chart of the schedule to this PNG");
  return simulate;
}

struct ExportArgs {
  std::string run_dir, trial, out;
};

CLI::App* AddExport(CLI::App& app, ExportArgs* ea) {
  auto* exp = app.add_subcommand(
      "export",
      "Write a trained gpt2 trial of a hydra run as a Hugging Face model directory "
      "(model.safetensors, config.json) that GPT2LMHeadModel.from_pretrained loads");
  exp->add_option("run_dir", ea->run_dir, "The run's output directory (hydra run -o)")
      ->required()
      ->check(CLI::ExistingDirectory);
  exp->add_option("--trial", ea->trial, "The trial's name (as in results.json)")->required();
  exp->add_option("-o,--output", ea->out, "Directory to write (created if missing)")->required();
  return exp;
}

CLI::App* AddEval(CLI::App& app, hydra::cli::EvalArgs* ea) {
  auto* eval = app.add_subcommand(
      "eval",
      "Print the mean next-token cross-entropy of a pretrained gpt2 checkpoint over a token file, "
      "cut into non-overlapping windows of contextLength + 1 tokens (the last partial window "
      "is dropped)");
  eval->add_option("manifest", ea->manifest,
                   "MultiModelJob YAML file: its spec.model fields and spec.dataset.format")
      ->required()
      ->check(CLI::ExistingFile);
  eval->add_option("--init", ea->init, "A Hugging Face GPT2LMHeadModel model.safetensors")
      ->required();
  eval->add_option("--data", ea->data, "The token file to score, in spec.dataset.format")
      ->required();
  eval->add_flag("--json", ea->json, "Print {\"loss\": ..., \"tokens\": ...}");
  eval->add_option("--threads", ea->threads, "CPU threads")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  return eval;
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
  PlanArgs pa;
  SimulateArgs sim;
  std::string validate_manifest;
  ExportArgs xa;
  hydra::cli::EvalArgs ea;
  ea.threads = ra.threads;
  auto* run = AddRun(app, &ra);
  auto* plan = AddPlan(app, &pa);
  auto* simulate = AddSimulate(app, &sim);
  auto* validate = app.add_subcommand("validate", "Check a manifest and list its trials");
  validate->add_option("manifest", validate_manifest, "MultiModelJob YAML file")
      ->required()
      ->check(CLI::ExistingFile);
  auto* exp = AddExport(app, &xa);
  auto* eval = AddEval(app, &ea);
  CLI11_PARSE(app, argc, argv);
  if (run->parsed()) return Run(ra);
  if (plan->parsed()) return Plan(pa.manifest, pa.pilot, pa.pilot_device, ra.threads, pa.optimizer);
  if (simulate->parsed()) {
    if (sim.manifest.empty() == sim.profile.empty()) {
      std::cerr << "error: hydra simulate takes a manifest or --profile FILE (one of them)\n";
      return 2;
    }
    return Simulate(sim);
  }
  if (validate->parsed()) return Validate(validate_manifest);
  if (exp->parsed()) return Export(xa.run_dir, xa.trial, xa.out);
  if (eval->parsed()) return hydra::cli::Eval(ea);
  return 2;
}
