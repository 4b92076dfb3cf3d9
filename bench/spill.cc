// bench/spill: tokens/s of one GPT-2 trial under a device budget, with the state in host memory
// or on disk. One configuration per process (so resident memory is its own); bench/spill.sh
// runs the configurations side by side and prints ratios.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>

#include "agent/executor/compute_device.h"
#include "agent/executor/gpus.h"
#include "agent/executor/pilot.h"
#include "agent/executor/spilling_executor.h"
#include "bench/kernel_trace.h"
#include "common/cost_model.h"
#include "common/partitioner.h"
#include "common/process_memory.h"

#ifdef HYDRA_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace {

/// The caching allocator on a GPU since the last reset: its peaks (allocated, reserved: their
/// ratio is the fragmentation the spilling's constant frees and allocations leave) and how
/// often an allocation had to free the cache and retry (under a cap, what fragmentation
/// costs); zeros on a CPU device or in a build without CUDA.
struct AllocatorStats {
  int64_t allocated_peak = 0, reserved_peak = 0, retries = 0;
};
AllocatorStats ReadAllocator(const hydra::DeviceSpec& device, bool reset) {
#ifdef HYDRA_WITH_CUDA
  if (device.kind == hydra::DeviceKind::kCuda) {
    const auto index = static_cast<c10::DeviceIndex>(device.index);
    if (reset) {
      c10::cuda::CUDACachingAllocator::resetPeakStats(index);
      c10::cuda::CUDACachingAllocator::resetAccumulatedStats(index);
    }
    const auto st = c10::cuda::CUDACachingAllocator::getDeviceStats(index);
    return {st.allocated_bytes[0].peak, st.reserved_bytes[0].peak, st.num_alloc_retries};
  }
#endif
  (void)device, (void)reset;
  return {};
}

/// What admission decided, as bench/spill.sh reads it: the plan's shape and the host and disk
/// bytes the trial holds.
nlohmann::json AdmissionJson(const hydra::Admission& a, int64_t budget,
                             const hydra::DeviceSpec& device) {
  std::string policies, placements;
  nlohmann::json layers = nlohmann::json::array();  // each shard's, "embed..block5"
  for (const auto& s : a.plan.shards) {
    layers.push_back(hydra::ShardLayers(s));
    // "i": recomputes, its input waiting in host memory (ShardPlan::input_offloaded).
    policies += s.input_offloaded ? 'i' : hydra::ActivationPolicyName(s.policy)[0];
    // Resident shards' state stays on the device, stepped there: "R".
    placements += s.resident ? 'R' : hydra::OptimizerPlacementName(s.optimizer)[0];
  }
  return {{"budgetBytes", budget},
          {"deviceMemoryBytes", device.memory_bytes},
          {"stateBytes", a.plan.total_state_bytes},
          {"hostBytes", a.host_bytes},
          {"diskBytes", a.disk_bytes},
          {"estimatedStepSeconds", a.est_step_seconds},
          {"plannedPeakDeviceBytes", a.plan.peak_device_bytes},
          {"shards", a.plan.shards.size()},
          {"shardLayers", layers},
          {"policies", policies},
          {"offloadedBytes", a.plan.offloaded_bytes},
          {"selectiveRecompute", a.plan.selective_recompute},
          {"residentBytes", a.plan.resident_bytes},
          {"linkSeconds", a.plan.link_seconds},
          {"attention", hydra::AttentionMemoryName(a.plan.attention)},
          {"optimizerPlacements", placements}};
}

/// --profile-trace: `steps` more steps (after the timed ones, so their timing is the same
/// with and without it) with the GPU's kernels recorded to `path`.
template <typename Executor>
hydra::Status TraceSteps(Executor& exec, int steps, const std::string& path) {
  RETURN_IF_ERROR(hydra::bench::StartKernelTrace());
  for (int i = 0; i < steps; ++i) {
    if (auto m = exec.TrainStep(); !m.ok()) {
      (void)hydra::bench::SaveKernelTrace(path);  // stops the profiler
      return m.status();
    }
  }
  return hydra::bench::SaveKernelTrace(path);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Tokens/s of one GPT-2 trial trained by the shard-spilling executor"};
  hydra::Trial t;
  t.name = "bench-spill";
  t.dataset.format = hydra::DatasetFormat::kText;
  t.model.n_layer = 12;
  t.model.n_embd = 768;
  t.model.n_head = 12;
  t.model.context_length = 256;
  t.model.vocab_size = 256;
  t.training.batch_size = 8;
  t.training.learning_rate = 1e-4;
  int warmup = 1, threads = 0;
  double fraction = 1.0;
  int64_t budget_bytes = 0, host_budget = -1;
  std::string offload = "host", spill_dir = "/tmp/hydra-bench-spill", init;
  app.add_option("--corpus", t.dataset.resolved_path, "text file")->required();
  app.add_option("--layers", t.model.n_layer)->capture_default_str();
  app.add_option("--embd", t.model.n_embd)->capture_default_str();
  app.add_option("--heads", t.model.n_head)->capture_default_str();
  app.add_option("--ctx", t.model.context_length)->capture_default_str();
  app.add_option("--vocab", t.model.vocab_size)->capture_default_str();
  app.add_option("--batch", t.training.batch_size)->capture_default_str();
  app.add_option("--accumulation", t.training.gradient_accumulation_steps)->capture_default_str();
  app.add_option("--steps", t.training.steps, "timed steps")->capture_default_str();
  app.add_option("--warmup", warmup, "untimed steps first")->capture_default_str();
  app.add_option("--threads", threads,
                 "CPU threads (default: 2 on a CPU device; every core beside a GPU, as hydra run "
                 "gives a GPU: the host optimizer's and the disk tier's)");
  app.add_option("--budget-fraction", fraction, "device budget as a fraction of the footprint")
      ->capture_default_str();
  app.add_option("--budget-bytes", budget_bytes, "device budget in bytes (overrides the fraction)");
  bool whole_device = false, plan_only = false, cap_device = false;
  app.add_flag("--budget-device", whole_device,
               "device budget: the device's memory, as a trial without deviceMemoryBudget gets "
               "(a GPU's free memory; overrides the fraction and the bytes)");
  app.add_flag("--cap-device", cap_device,
               "cap LibTorch's caching allocator on the GPU at the trial's device budget, as a GPU "
               "shared by trials is: its cached and fragmented memory then counts against it");
  auto* plan_only_flag = app.add_flag(
      "--plan-only", plan_only,
      "print the admission (shards, host and disk bytes, estimated step; at the default rates or "
      "the --*-rate ones, without the GPU pilot) as a JSON line and exit without building the "
      "model");
  // Rates to plan with instead of the pilot's: a GPU's plans reproduced where there is none
  // (--simulate-gpu; bench/plans.sh), or a run on a GPU planned at rates of one's choosing.
  double link_rate = 0, fp32_rate = 0, bf16_rate = 0, adamw_rate = 0;
  app.add_option("--link-rate", link_rate, "host <-> GPU bytes/s to plan with (not the pilot's)")
      ->check(CLI::PositiveNumber);
  app.add_option("--fp32-rate", fp32_rate, "the device's fp32 FLOP/s to plan with")
      ->check(CLI::PositiveNumber);
  app.add_option("--bf16-rate", bf16_rate, "the device's bf16 FLOP/s to plan with")
      ->check(CLI::PositiveNumber);
  app.add_option("--host-adamw-rate", adamw_rate,
                 "bytes/s the host's fused AdamW streams (weights, gradients, state) to plan with")
      ->check(CLI::PositiveNumber);
  bool simulate_gpu = false;
  app.add_flag("--simulate-gpu", simulate_gpu,
               "plan on the CPU device as on a GPU (its memory apart from the host's, as "
               "ExecutorDevices::simulate_discrete) at the --*-rate rates: a GPU's plans on a "
               "machine without one")
      ->needs(plan_only_flag)
      ->excludes("--budget-device");
  app.add_option("--host-budget", host_budget,
                 "bytes of RAM for stashed activations; -1: unlimited, 0: recompute every shard")
      ->capture_default_str();
  app.add_option("--offload", offload, "host or disk")
      ->check(CLI::IsMember(hydra::NamesOf<hydra::OffloadTier>()))
      ->capture_default_str();
  app.add_option("--spill-dir", spill_dir)->capture_default_str();
  std::string precision = "fp32";
  app.add_option("--precision", precision, "fp32 | bf16")
      ->check(CLI::IsMember({"fp32", "bf16"}))
      ->capture_default_str();
  app.add_option("--init", init,
                 "start from this Hugging Face GPT-2 model.safetensors (spec.model.init)");
  std::string devices = "cpu:1", optimizer = "auto";
  bool bf16_transit = false;
  bool no_attention_recompute = false;
  app.add_flag("--no-attention-recompute", no_attention_recompute,
               "plans keep every attention score for backward (the plan may otherwise recompute "
               "them where that pays)");
  bool no_fused_attention = false;
  app.add_flag("--no-fused-attention", no_fused_attention,
               "attention keeps its scores for backward (or recomputes them) instead of running "
               "as one fused kernel where LibTorch has one (the CUDA build); the footprint the "
               "budget fraction is taken of counts the scores then");
  bool no_device_stash = false;
  app.add_flag("--no-device-stash", no_device_stash,
               "on a GPU every shard but the last recomputes its forward (plans may otherwise keep "
               "shards' forward graphs in the GPU's memory)");
  bool no_selective_recompute = false;
  app.add_flag("--no-selective-recompute", no_selective_recompute,
               "on a GPU no plan recomputes the blocks' LayerNorm and GELU outputs in backward "
               "(plans may otherwise, where that makes a step shorter)");
  bool no_resident_state = false;
  app.add_flag("--no-resident-state", no_resident_state,
               "on a GPU every spilled shard's state crosses the link each step (plans may "
               "otherwise keep some shards' state on the GPU where the link bounds the step)");
  bool no_checkpoint_offload = false;
  app.add_flag("--no-checkpoint-offload", no_checkpoint_offload,
               "on a GPU recomputing shards keep their inputs on the GPU (plans may otherwise "
               "keep them in host memory until their backward)");
  bool no_activation_offload = false;
  app.add_flag("--no-activation-offload", no_activation_offload,
               "on a GPU no shard offloads its forward graph to host memory (plans may otherwise "
               "copy graphs out and back where the measured link keeps pace)");
  bool no_lookahead = false;
  app.add_flag("--no-lookahead", no_lookahead,
               "on a GPU spilled shards come up and leave when their plan says, never earlier or "
               "later (the executor may otherwise hold them on the GPU where the last steps left "
               "room: weights kept from forward to backward, uploads begun while the link idles)");
  app.add_flag("--bf16-transit", bf16_transit,
               "bf16 on a GPU with the optimizer on the host: matrix weights travel as bf16");
  app.add_option("--devices", devices, "cpu:1, or a GPU: cuda:0 (the CUDA build)")
      ->capture_default_str();
  app.add_option("--optimizer", optimizer, hydra::kOptimizerFlagHelp)
      ->check(CLI::IsMember(hydra::kOptimizerFlagChoices))
      ->capture_default_str();
  std::string profile_trace;
  int profile_steps = 2;
  app.add_option("--profile-trace", profile_trace,
                 "after the timed steps, record --profile-steps more steps' GPU kernels to this "
                 "Chrome trace (the CUDA build; bench/trace_summary.py sums it)");
  app.add_option("--profile-steps", profile_steps, "steps --profile-trace records")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  hydra::executor::ConfigureCudaAllocator();  // before the pilot touches a GPU
  if (!init.empty()) t.model.init = hydra::ModelInit{hydra::InitFormat::kSafetensors, init, init};
  t.training.precision = *hydra::ParsePrecision(precision);

  // The footprint the executor's plans count: without the attention scores where it fuses.
  const hydra::TrialFootprint estimate =
      hydra::EstimateTrialFootprint(t, hydra::executor::ExecutorAttention(!no_fused_attention));
  const int64_t footprint = estimate.total_bytes();
  if (!whole_device) {  // otherwise admission gives the trial the device's memory
    t.resources.device_memory_budget =
        budget_bytes > 0 ? budget_bytes
                         : static_cast<int64_t>(static_cast<double>(footprint) * fraction);
  }
  t.resources.offload = *hydra::ParseName<hydra::OffloadTier>(offload);
  if (host_budget >= 0) t.resources.host_memory_budget = host_budget;

  const int64_t baseline = hydra::ResidentBytes();
  hydra::ResidentPeakSampler sampler(std::chrono::milliseconds(5));
  auto stop = [&] { sampler.Stop(); };

  auto data = hydra::executor::TokenDataset::Open(t.dataset, t.model.context_length + 1);
  if (!data.ok()) {
    stop();
    std::cerr << data.status() << "\n";
    return 1;
  }
  hydra::executor::ExecutorOptions options;
  options.spill_dir = spill_dir;
  auto found = [&]() -> hydra::StatusOr<std::vector<hydra::DeviceSpec>> {
    ASSIGN_OR_RETURN(auto request, hydra::ParseDevicesRequest(devices));
    return hydra::executor::FindDevices(request, 0);
  }();
  if (!found.ok()) {
    stop();
    std::cerr << found.status() << "\n";
    return 1;
  }
  const hydra::DeviceSpec device = found->front();
  if (threads <= 0) {
    threads = device.kind == hydra::DeviceKind::kCuda
                  ? static_cast<int>(std::max(1u, std::thread::hardware_concurrency()))
                  : 2;
  }
  options.threads = threads;
  options.devices.devices = {device};
  options.bf16_weight_transit = bf16_transit;
  options.attention_recompute = !no_attention_recompute;
  options.device_stash = !no_device_stash;
  options.activation_offload = !no_activation_offload;
  options.selective_recompute = !no_selective_recompute;
  options.resident_state = !no_resident_state;
  options.checkpoint_offload = !no_checkpoint_offload;
  options.lookahead = !no_lookahead;
  options.fused_attention = !no_fused_attention;
  // Sizing a run (--plan-only), the host and disk bytes do not wait for the GPU pilot.
  const std::string rates = plan_only ? "" : hydra::executor::UseMeasuredLinkRates(&options);
  if (!rates.empty()) std::cerr << rates << "\n";  // stdout is the JSON line
  options.devices.simulate_discrete = simulate_gpu;
  if (link_rate > 0) options.host_link_bytes_per_second = link_rate;
  if (fp32_rate > 0) options.flops_per_second = fp32_rate;
  if (bf16_rate > 0) options.bf16_flops_per_second = bf16_rate;
  if (adamw_rate > 0) options.host_optimizer_bytes_per_second = adamw_rate;
  options.optimizer_placement = *hydra::ParseOptimizerFlag(optimizer);  // checked by CLI11
  auto factory = hydra::executor::MakeExecutorFactory(options);
  // The plan the executor runs (on a GPU: graphs kept in its memory where the budget holds
  // them, and the optimizer where the link says).
  auto admission = factory->Admit(t, **data);
  if (!admission.ok()) {
    stop();
    std::cerr << admission.status() << "\n";
    return 1;
  }
  const int64_t budget = t.resources.device_memory_budget.value_or(device.memory_bytes);
  nlohmann::json admitted = AdmissionJson(*admission, budget, device);
  if (plan_only) {
    stop();
    admitted["parameters"] = estimate.parameters;
    admitted["footprintBytes"] = footprint;
    std::cout << admitted.dump() << std::endl;
    return 0;
  }
  if (cap_device) {
    hydra::DeviceSpec capped = device;
    capped.memory_bytes = budget;
    if (auto st = hydra::executor::CapGpuMemory({capped}); !st.ok()) {
      stop();
      std::cerr << st << "\n";
      return 1;
    }
  }
  const auto setup_start = std::chrono::steady_clock::now();
  auto exec = factory->Build(t, *data, *admission, 0);
  if (!exec.ok()) {
    stop();
    std::cerr << exec.status() << "\n";
    return 1;
  }
  const double setup_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - setup_start).count();
  double loss = 0;
  for (int i = 0; i < warmup; ++i) loss = (*exec)->TrainStep()->loss;
  const auto before = (*exec)->stats();
  ReadAllocator(device, /*reset=*/true);
  const auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < t.training.steps; ++i) {
    auto m = (*exec)->TrainStep();
    if (!m.ok()) {
      stop();
      std::cerr << m.status() << "\n";
      return 1;
    }
    loss = m->loss;
  }
  // A step may return while its last copies out still run (the next step's work queues
  // behind them): the timed steps end when the GPU is done.
  hydra::executor::SynchronizeDevice(hydra::executor::TorchDevice(device));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const auto after = (*exec)->stats();
  const AllocatorStats allocator = ReadAllocator(device, /*reset=*/false);
  if (!profile_trace.empty()) {
    if (auto st = TraceSteps(**exec, profile_steps, profile_trace); !st.ok()) {
      stop();
      std::cerr << st << "\n";
      return 1;
    }
  }
  stop();
  const double steps = static_cast<double>(t.training.steps);
  nlohmann::json out{
      // With --budget-bytes, the fraction of the footprint that budget is.
      {"budgetFraction", whole_device ? 0.0
                         : budget_bytes > 0
                             ? static_cast<double>(budget_bytes) / static_cast<double>(footprint)
                             : fraction},
      {"device", device.name},
      {"deviceModel", device.model},
      {"optimizer", optimizer},
      {"bf16Transit", bf16_transit},
      {"hostLinkBytesPerSecond", options.host_link_bytes_per_second},
      {"precision", precision},
      {"offload", offload},
      {"hostBudget", host_budget},
      {"parameters", after.parameters},
      {"footprintBytes", footprint},
      {"tokensPerSecond", steps * t.training.batch_size * t.model.context_length / seconds},
      {"secondsPerStep", seconds / steps},
      {"setupSeconds", setup_seconds},
      {"init", init},
      {"peakDeviceBytes", after.peak_device_bytes},
      {"allocatorPeakBytes", allocator.allocated_peak},
      {"reservedPeakBytes", allocator.reserved_peak},
      {"allocatorRetries", allocator.retries},
      {"deviceCapped", cap_device},
      {"expandableSegments", hydra::executor::CudaExpandableSegments()},
      {"baselineResidentBytes", baseline},
      {"peakResidentBytes", sampler.peak()},
      {"lookahead", !no_lookahead},
      {"lookaheadHoldsPerStep",
       static_cast<double>(after.lookahead_holds - before.lookahead_holds) / steps},
      {"bytesUploadedPerStep", (after.bytes_uploaded - before.bytes_uploaded) / steps},
      {"hostStepsDeferredPerStep",
       static_cast<double>(after.host_steps_deferred - before.host_steps_deferred) / steps},
      {"threads", threads},
      {"activationBytesOffloadedPerStep",
       (after.activation_bytes_offloaded - before.activation_bytes_offloaded) / steps},
      {"diskReadBytesPerStep", (after.disk_bytes_read - before.disk_bytes_read) / steps},
      {"diskWrittenBytesPerStep", (after.disk_bytes_written - before.disk_bytes_written) / steps},
      {"finalLoss", loss}};
  out.update(admitted);
  std::cout << out.dump() << std::endl;
  return 0;
}
