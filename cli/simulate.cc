#include "cli/simulate.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cli/gnuplot.h"
#include "common/file_util.h"
#include "common/units.h"

namespace hydra::cli {

SimulationReport RunSimulation(const std::vector<TrialProfile>& trials,
                               const SimulationOptions& options, int micro_batches) {
  SimulationReport r;
  r.micro_batches = micro_batches;
  auto lrtf = MakeShardedLrtfPolicy();
  r.schedule = Simulate(trials, lrtf.get(), options);
  r.lower_bound = MakespanLowerBound(trials, options.devices);
  r.baselines["sequential-model-parallel"] = SequentialModelParallelMakespan(trials, options);
  r.baselines["gpipe"] = GpipeMakespan(trials, options, micro_batches);
  auto fifo = MakeFifoPolicy();
  r.baselines["fifo"] = Simulate(trials, fifo.get(), options).makespan;
  auto rr = MakeRoundRobinPolicy();
  r.baselines["round-robin"] = Simulate(trials, rr.get(), options).makespan;
  return r;
}

nlohmann::json SimulationJson(const SimulationReport& r) {
  nlohmann::json util = nlohmann::json::array();
  for (double b : r.schedule.busy_seconds) {
    util.push_back(r.schedule.makespan > 0 ? b / r.schedule.makespan : 0.0);
  }
  return {{"makespanSeconds", r.schedule.makespan},
          {"lowerBoundSeconds", r.lower_bound},
          {"utilization", util},
          {"meanUtilization", r.schedule.Utilization()},
          {"gpipeMicroBatches", r.micro_batches},
          {"baselines", r.baselines}};
}

std::string FormatSimulation(const SimulationReport& r, const SimulationOptions& o) {
  std::ostringstream out;
  char line[256];
  std::snprintf(line, sizeof(line),
                "Sharded-LRTF on %d device%s: makespan %s (%.1f s), lower bound %.1f s, "
                "makespan / lower bound %.3f, mean utilization %.1f%%\n",
                o.devices, o.devices == 1 ? "" : "s", FormatDuration(r.schedule.makespan).c_str(),
                r.schedule.makespan, r.lower_bound, r.schedule.makespan / r.lower_bound,
                100 * r.schedule.Utilization());
  out << line;
  out << "  per-device utilization:";
  for (double b : r.schedule.busy_seconds) {
    std::snprintf(line, sizeof(line), " %.1f%%", 100 * b / r.schedule.makespan);
    out << line;
  }
  out << "\n  baselines (makespan, Sharded-LRTF speedup):\n";
  for (const auto& [name, seconds] : r.baselines) {
    std::snprintf(line, sizeof(line), "    %-26s %10.1f s  %5.2fx%s\n", name.c_str(), seconds,
                  seconds / r.schedule.makespan,
                  name == "gpipe" ? (" (" + std::to_string(r.micro_batches) +
                                     " micro-batches, at most a trial's batch size)")
                                        .c_str()
                                  : "");
    out << line;
  }
  return out.str();
}

StatusOr<std::vector<TrialProfile>> LoadProfileFile(const std::string& path, double* link) {
  ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  std::vector<TrialProfile> trials;
  std::string where = path;
  try {
    auto j = nlohmann::json::parse(text);
    if (link) *link = j.value("linkBytesPerSecond", 0.0);
    where = path + ": trials";
    for (const auto& t : j.at("trials")) {
      TrialProfile p;
      p.name = t.at("name").get<std::string>();
      where = path + ": trial " + p.name;
      p.minibatches = t.at("minibatches").get<int64_t>();
      if (p.minibatches < 1) return InvalidArgumentError(where + ": minibatches must be >= 1");
      for (const auto& task : t.at("tasks")) {
        TaskProfile tp;
        tp.name = task.value("name", "");
        tp.compute_seconds = task.at("computeSeconds").get<double>();
        tp.transfer_bytes = task.value("transferBytes", int64_t{0});
        if (tp.compute_seconds < 0 || tp.transfer_bytes < 0) {
          return InvalidArgumentError(where + ": task times and bytes must be >= 0");
        }
        p.tasks.push_back(tp);
      }
      if (p.tasks.empty()) return InvalidArgumentError(where + ": has no tasks");
      trials.push_back(std::move(p));
    }
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgumentError(where + ": " + e.what());
  }
  if (trials.empty()) return InvalidArgumentError(path + ": no trials");
  return trials;
}

Status DrawGantt(const Schedule& schedule, const std::vector<TrialProfile>& trials, int devices,
                 const std::string& png_path, const std::string& title) {
  const std::string data_path = png_path + ".dat";
  std::ostringstream data;
  for (const auto& t : schedule.tasks) {
    data << (t.start + t.end) / 2 << " " << t.device << " " << (t.end - t.start) / 2 << " "
         << t.trial + 1 << "\n";
  }
  RETURN_IF_ERROR(WriteFileAtomically(data_path, data.str()));
  std::ostringstream script;
  script << "set terminal pngcairo size 1400," << 140 + 40 * devices << " font 'sans,10'\n"
         << "set output '" << png_path << "'\n"
         << "set title '" << title << "'\n"
         << "set xlabel 'seconds'\nset ylabel 'device'\n"
         << "set yrange [-0.6:" << devices - 0.4 << "]\nset ytics 1\n"
         << "set xrange [0:" << schedule.makespan << "]\n"
         << "set style fill solid 0.85 border lc rgb 'white'\nunset key\n"
         << "set palette model HSV defined (0 0 0.6 0.9, 1 0.95 0.6 0.9)\n"
         << "set cbrange [1:" << std::max<size_t>(2, trials.size()) << "]\nunset colorbox\n"
         << "plot '" << data_path
         << "' using 1:2:3:(0.4):4 with boxxyerrorbars lc palette notitle\n";
  const std::string script_path = png_path + ".gp";
  RETURN_IF_ERROR(WriteFileAtomically(script_path, script.str()));
  RETURN_IF_ERROR(RunGnuplot(script_path));
  std::error_code ec;
  std::filesystem::remove(script_path, ec);
  std::filesystem::remove(data_path, ec);
  return OkStatus();
}

namespace {

/// Each trial's "steps" in a hydra run results.json, by trial name.
StatusOr<std::map<std::string, int64_t>> StepsReached(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFoundError("cannot read " + path);
  const auto j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.contains("trials") || !j["trials"].is_array()) {
    return InvalidArgumentError(path + ": not a hydra run results.json (no trials array)");
  }
  std::map<std::string, int64_t> steps;
  for (const auto& t : j["trials"]) {
    if (!t.contains("name") || !t["name"].is_string() || !t.contains("steps") ||
        !t["steps"].is_number_integer() || t["steps"].get<int64_t>() < 0) {
      return InvalidArgumentError(path + ": a trial without a name and non-negative steps");
    }
    steps[t["name"].get<std::string>()] = t["steps"].get<int64_t>();
  }
  return steps;
}

}  // namespace

StatusOr<std::string> ModelEarlyStopping(const MultiModelJob& job, const std::vector<Trial>& trials,
                                         double stop_fraction, const std::string& stopped_at,
                                         std::vector<TrialProfile>* profiles) {
  std::vector<int64_t> steps, reached;
  for (const auto& t : trials) steps.push_back(t.training.steps);
  std::string what;
  if (!stopped_at.empty()) {
    ASSIGN_OR_RETURN(auto measured, StepsReached(stopped_at));
    for (const auto& t : trials) {
      auto it = measured.find(t.name);
      if (it == measured.end()) {
        return InvalidArgumentError(stopped_at + " has no trial " + t.name +
                                    ": give the results of a run of this manifest");
      }
      reached.push_back(std::min(it->second, t.training.steps));
    }
    what = "measured in " + stopped_at;
  } else {
    const auto& es = job.spec.early_stopping;
    if (es.algorithm == EarlyStoppingAlgorithm::kNone) return std::string();
    const double f = stop_fraction >= 0 ? stop_fraction
                     : es.algorithm == EarlyStoppingAlgorithm::kAsha
                         ? 1.0 - 1.0 / static_cast<double>(es.reduction_factor)
                         : 0.5;
    reached = ModelledStopSteps(es, steps, f);
    char buf[128];
    std::snprintf(buf, sizeof(buf), "%s, %.2f of the trials at each rung stop",
                  EarlyStoppingAlgorithmName(es.algorithm), f);
    what = buf;
  }
  int64_t all = 0, trained = 0;
  for (size_t i = 0; i < profiles->size() && i < reached.size(); ++i) {
    (*profiles)[i].minibatches = reached[i];
    all += steps[i];
    trained += reached[i];
  }
  return "early stopping (" + what + "): " + std::to_string(trained) + " of " +
         std::to_string(all) + " steps trained\n";
}

}  // namespace hydra::cli
