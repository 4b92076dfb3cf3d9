// bench/schedule: the Hydra paper's model-selection workload in the simulator. 12 GPT-2 XL
// trials (1.5B parameters, context 512) over learning rates {3e-4, 1e-4, 5e-5, 6e-5, 1e-5,
// 2e-5} x batch sizes {16, 8}, one epoch each of the same data, on commodity GPUs of 16 GiB
// with 16 GB/s host links. Shard plans come from the partitioner and shard times from the
// per-layer cost model (FLOPs / an effective device rate). Prints makespan / lower bound, the
// speedups over the baselines and strong scaling from 1 to 8 devices.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>

#include "cli/simulate.h"
#include "common/partitioner.h"
#include "common/schedule_profile.h"
#include "common/units.h"

int main(int argc, char** argv) {
  CLI::App app{"Sharded-LRTF on the Hydra paper's GPT-2 XL workload, simulated"};
  int devices = 8;
  double flops = 25e12, link = 16e9;
  int64_t sequences = 16 * 100;  // per epoch
  bool smoke = false;
  app.add_option("--devices", devices)->capture_default_str();
  app.add_option("--flops", flops, "effective FLOP/s of one GPU")->capture_default_str();
  app.add_option("--link", link, "host<->GPU bytes/s")->capture_default_str();
  app.add_option("--sequences", sequences, "sequences per epoch")->capture_default_str();
  app.add_flag("--smoke", smoke, "a tiny epoch, to check that it runs");
  CLI11_PARSE(app, argc, argv);
  if (smoke) sequences = 16 * 4;

  std::vector<hydra::TrialProfile> trials;
  std::string plan_text;
  for (double lr : {3e-4, 1e-4, 5e-5, 6e-5, 1e-5, 2e-5}) {
    for (int64_t bs : {16, 8}) {
      hydra::Trial t;
      char name[64];
      std::snprintf(name, sizeof(name), "xl-lr%g-bs%lld", lr, static_cast<long long>(bs));
      t.name = name;
      t.model.n_layer = 48;
      t.model.n_embd = 1600;
      t.model.n_head = 25;
      t.model.context_length = 512;
      t.model.vocab_size = 50257;
      t.training.learning_rate = lr;
      t.training.batch_size = bs;
      t.training.steps = sequences / bs;
      t.resources.device_memory_budget = 16LL << 30;
      auto po = hydra::PartitionOptionsFor(t);
      po.flops_per_second = flops;
      po.host_link_bytes_per_second = link;
      auto plan = hydra::PlanShards(t, po);
      if (!plan.ok()) {
        std::cerr << plan.status() << "\n";
        return 1;
      }
      if (trials.size() < 2) plan_text += hydra::FormatPlan(t, *plan);
      trials.push_back(hydra::ProfileFromPlan(t, *plan, flops));
    }
  }
  std::cout << "workload: 12 GPT-2 XL trials, " << sequences << " sequences of 512 tokens each, "
            << devices << " GPUs of 16 GiB at " << flops / 1e12 << " TFLOP/s with " << link / 1e9
            << " GB/s links\n"
            << plan_text;
  hydra::SimulationOptions o;
  o.devices = devices;
  o.link_bytes_per_second = link;
  // GPipe gets as many micro-batches as every trial's batch allows (8): its best case.
  auto report = hydra::cli::RunSimulation(trials, o, /*micro_batches=*/8);
  std::cout << hydra::cli::FormatSimulation(report, o);
  std::printf("makespan / lower bound: %.3f (goal <= 1.05)\n",
              report.schedule.makespan / report.lower_bound);

  std::cout << "strong scaling (Sharded-LRTF makespan, efficiency = T1 / (d Td)):\n";
  double t1 = 0;
  for (int d : {1, 2, 4, 8}) {
    hydra::SimulationOptions od = o;
    od.devices = d;
    auto lrtf = hydra::MakeShardedLrtfPolicy();
    const double t = hydra::Simulate(trials, lrtf.get(), od).makespan;
    if (d == 1) t1 = t;
    std::printf("  %d device%s: %10.1f s  efficiency %.3f\n", d, d == 1 ? " " : "s", t,
                t1 / (d * t));
  }
  return 0;
}
