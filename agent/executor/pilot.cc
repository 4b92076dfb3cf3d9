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
  if (probe.model.family == "gpt2" || probe.model.family == "mlp") probe.model.n_layer = 1;
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
    // In the trial's precision: the partitioner weighs recompute against stash by this rate.
    UseCpuThreadsFor(trial.training.precision);
    auto run = [&]() {
      torch::Tensor y;
      {
        PrecisionScope precision(trial.training.precision, on.type());
        y = layer->forward(x);
      }
      y.sum().backward();
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

}  // namespace

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
  return r;
}

std::string UseMeasuredLinkRates(ExecutorOptions* options) {
  const auto& devices = options->devices.devices;
  if (devices.empty() || devices.front().kind != DeviceKind::kCuda) return "";
  auto rates = MeasureLinkRates(devices.front());
  if (!rates.ok()) {
    return "warning: " + rates.status().message() +
           "; spilled shards' optimizers step on the device";
  }
  options->host_link_bytes_per_second = rates->host_link_bytes_per_second;
  options->host_optimizer_bytes_per_second = rates->host_optimizer_bytes_per_second;
  if (rates->device_flops_per_second > 0)
    options->flops_per_second = rates->device_flops_per_second;
  options->bf16_flops_per_second = rates->device_bf16_flops_per_second;
  char line[200];
  std::snprintf(line, sizeof line,
                "host link %.1f GB/s to %s; host AdamW %.1f GB/s; matrix products %.1f TFLOP/s "
                "fp32, %.1f bf16",
                rates->host_link_bytes_per_second / 1e9, devices.front().name.c_str(),
                rates->host_optimizer_bytes_per_second / 1e9, rates->device_flops_per_second / 1e12,
                rates->device_bf16_flops_per_second / 1e12);
  return line;
}

}  // namespace hydra::executor
