#include "agent/executor/pilot.h"

#include <chrono>
#include <cstdio>

#include "agent/executor/compute_device.h"
#include "agent/executor/cpu_threads.h"
#include "agent/executor/optimizer.h"
#include "agent/executor/precision.h"
#include "agent/executor/torchscript.h"
#include "common/cost_model.h"

namespace hydra::executor {

StatusOr<PilotResult> RunPilot(const Trial& trial, const DeviceSpec& device) {
  Trial probe = trial;
  // Repeated layers need not all exist: one stands for the rest (their widths are equal).
  if (probe.model.family == ModelFamily::kGpt2 || probe.model.family == ModelFamily::kMlp) {
    probe.model.n_layer = 1;
  }
  const int64_t micro = trial.training.batch_size / trial.training.gradient_accumulation_steps;
  const auto costs = ModelLayerCosts(probe, micro);
  if (costs.empty()) {
    return FailedPreconditionError("pilot run of " + trial.name +
                                   ": the model's layers are not known yet");
  }
  size_t heaviest = 0;
  for (size_t i = 1; i < costs.size(); ++i) {
    if (costs[i].forward_flops > costs[heaviest].forward_flops) heaviest = i;
  }
  try {
    auto model = BuildModel(probe);
    if (!model.ok()) return model.status();
    const AttentionMemory attention = ExecutorAttention(/*fused_attention=*/true);
    model->SetAttention(attention);
    if (model->layers.size() != costs.size()) {
      return InternalError("pilot run of " + trial.name + ": the cost model has " +
                           std::to_string(costs.size()) + " layers, the model " +
                           std::to_string(model->layers.size()));
    }
    const torch::Device on = TorchDevice(device);
    torch::Tensor x;
    if (IsImageTask(trial)) {
      const auto& s = trial.dataset.image_shape;
      x = torch::rand({micro, s[0], s[1], s[2]});
    } else {
      x = torch::randint(0, trial.model.vocab_size, {micro, trial.model.context_length},
                         torch::kLong);
    }
    for (size_t i = 0; i <= heaviest; ++i) model->layers[i]->to(on);
    x = x.to(on);
    {
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < heaviest; ++i) x = model->layers[i]->forward(x);
    }
    if (x.is_floating_point()) x = x.detach().requires_grad_(true);
    auto& layer = model->layers[heaviest];
    // The last layer of a token model runs as training runs it: its loss against targets
    // (GPT-2's fused LM head and loss), not its whole output summed.
    torch::Tensor target;
    if (heaviest + 1 == model->layers.size() && !IsImageTask(trial)) {
      target = torch::randint(0, trial.model.vocab_size, {micro, trial.model.context_length},
                              torch::TensorOptions(on).dtype(torch::kLong));
    }
    // In the trial's precision: the partitioner weighs recompute against stash by this rate.
    UseCpuThreadsFor(trial.training.precision);
    auto run = [&]() {
      torch::Tensor y;
      {
        PrecisionScope precision(trial.training.precision, on.type());
        if (target.defined()) y = layer->forward_loss(x, target);
        if (!y.defined()) y = layer->forward(x).sum();
      }
      y.backward();
    };
    run();
    run();
    SynchronizeDevice(on);
    const int rounds = 3;
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < rounds; ++i) run();
    SynchronizeDevice(on);
    PilotResult r;
    r.device = device.kind == DeviceKind::kCuda ? device.name + " (" + device.model + ")" : "cpu";
    r.layer = model->names[heaviest];
    r.attention = attention;
    r.layer_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / rounds;
    r.layer_flops = 3.0 * costs[heaviest].forward_flops;
    r.flops_per_second = r.layer_flops / r.layer_seconds;
    return r;
  } catch (const c10::Error& e) {
    return TorchErrorStatus(e, "pilot run of " + trial.name, TorchDevice(device));
  }
}

namespace {

template <typename F>
double SecondsPerRound(int rounds, F&& f) {
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < rounds; ++i) f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / rounds;
}

/// FLOP/s of 4096^3 matrix products in `dtype` on the GPU (two warm-ups, the mean of three);
/// 0 where they fail (a GPU without bf16 products, or without the memory): the factory then
/// keeps its other rate.
double MatrixProductRate(const DeviceSpec& device, torch::ScalarType dtype) {
  try {
    const torch::Device dev = TorchDevice(device);
    const int64_t m = 4096;
    const auto a = torch::randn({m, m}, torch::TensorOptions(dev).dtype(dtype));
    const auto b = torch::randn({m, m}, torch::TensorOptions(dev).dtype(dtype));
    auto product = [&] {
      torch::mm(a, b);
      SynchronizeDevice(dev);
    };
    product();
    product();
    return 2.0 * static_cast<double>(m * m * m) / SecondsPerRound(3, product);
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "warning: timing %s matrix products on %s: %s\n", c10::toString(dtype),
                 device.name.c_str(), e.what_without_backtrace());
    return 0;
  }
}

/// BlockPilotTrial's block rate in `precision` on the GPU; 0 where it fails (logged).
double BlockRate(const DeviceSpec& device, Precision precision) {
  auto pilot = RunPilot(BlockPilotTrial(precision), device);
  if (pilot.ok()) return pilot->flops_per_second;
  std::fprintf(stderr, "warning: timing a GPT-2 block in %s on %s: %s\n", PrecisionName(precision),
               device.name.c_str(), pilot.status().message().c_str());
  return 0;
}

}  // namespace

Trial BlockPilotTrial(Precision precision) {
  Trial t;
  t.name = "block-pilot";
  t.model.family = ModelFamily::kGpt2;
  t.model.n_layer = 1;
  t.model.n_embd = 1024;
  t.model.n_head = 16;
  t.model.context_length = 1024;
  t.model.vocab_size = 256;
  t.training.batch_size = 8;
  t.training.precision = precision;
  return t;
}

StatusOr<LinkRates> MeasureLinkRates(const DeviceSpec& device) {
  LinkRates r;
  if (device.kind != DeviceKind::kCuda) return r;
  try {
    const torch::Device dev = TorchDevice(device);
    const int64_t n = int64_t{64} << 20;  // floats: 256 MiB
    auto host = HostTensorFor(dev, {n}, torch::kFloat);
    auto on_device = torch::empty({n}, torch::TensorOptions(dev));
    DeviceStreams streams(dev);
    auto copy = [&] {
      streams.CopyIn({on_device}, {host}, {}, streams.MarkCompute()).Synchronize();
    };
    copy();
    r.host_link_bytes_per_second = static_cast<double>(n * 4) / SecondsPerRound(3, copy);

    const int64_t params = int64_t{16} << 20;
    TrainingSpec adamw;
    torch::Tensor p = torch::zeros({params});
    p.mutable_grad() = torch::full({params}, 1e-3f);
    Optimizer optimizer({{"p", p}}, adamw);
    int64_t step = 0;
    auto update = [&] { optimizer.Step(1e-4, ++step); };
    update();
    r.host_optimizer_bytes_per_second =
        static_cast<double>(params * 28) / SecondsPerRound(3, update);
  } catch (const c10::Error& e) {
    return InternalError("measuring the host link of " + device.name + ": " +
                         e.what_without_backtrace());
  }
  r.device_flops_per_second = MatrixProductRate(device, torch::kFloat);
  r.device_bf16_flops_per_second = MatrixProductRate(device, torch::kBFloat16);
  r.block_flops_per_second = BlockRate(device, Precision::kFp32);
  r.block_bf16_flops_per_second = BlockRate(device, Precision::kBf16);
  ReleaseCachedDeviceMemory(TorchDevice(device));  // the blocks' activations, now cached
  return r;
}

std::string UseMeasuredLinkRates(ExecutorOptions* options) {
  const auto& devices = options->devices.devices;
  if (devices.empty() || devices.front().kind != DeviceKind::kCuda) return "";
  // The host optimizer is timed on the threads the executors will give it.
  if (options->threads > 0) ConfigureCpuThreads(options->threads);
  auto rates = MeasureLinkRates(devices.front());
  if (!rates.ok()) {
    return "warning: " + rates.status().message() +
           "; spilled shards' optimizers step on the device";
  }
  options->host_link_bytes_per_second = rates->host_link_bytes_per_second;
  options->host_optimizer_bytes_per_second = rates->host_optimizer_bytes_per_second;
  const double fp32 = rates->block_flops_per_second > 0 ? rates->block_flops_per_second
                                                        : rates->device_flops_per_second;
  if (fp32 > 0) options->flops_per_second = fp32;
  options->bf16_flops_per_second = rates->block_bf16_flops_per_second > 0
                                       ? rates->block_bf16_flops_per_second
                                       : rates->device_bf16_flops_per_second;
  char line[300];
  std::snprintf(line, sizeof line,
                "host link %.1f GB/s to %s; host AdamW %.1f GB/s; a GPT-2 medium block forward + "
                "backward %.1f TFLOP/s fp32, %.1f bf16 (matrix products %.1f, %.1f): plans "
                "compute at %.1f and %.1f",
                rates->host_link_bytes_per_second / 1e9, devices.front().name.c_str(),
                rates->host_optimizer_bytes_per_second / 1e9, rates->block_flops_per_second / 1e12,
                rates->block_bf16_flops_per_second / 1e12, rates->device_flops_per_second / 1e12,
                rates->device_bf16_flops_per_second / 1e12, options->flops_per_second / 1e12,
                options->bf16_flops_per_second / 1e12);
  return line;
}

}  // namespace hydra::executor
