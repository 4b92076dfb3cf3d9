// bench/host_adamw: the host optimizer's rate (AdamW over fp32 tensors in host memory, what a
// shard stepped on the host runs: ZeRO-Offload's CPU Adam), in GB/s at 28 bytes a parameter
// (weights, gradients and both moments read; weights and moments written), side by side in
// one run: the kernel per instruction set on one thread, the optimizer on 1..N threads, and
// LibTorch's own updates (torch.optim.AdamW's per-tensor operations; `_fused_adamw_`, 2.4 and
// later) on N threads. Prints a Markdown table.
#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "agent/executor/adamw_kernel.h"
#include "agent/executor/optimizer.h"

namespace {

using hydra::executor::AdamWIsa;
using hydra::executor::AdamWKernel;

constexpr double kBytesPerParameter = 28;

/// The best of `rounds` timings of `f`, after one untimed call.
double BestSeconds(int rounds, const std::function<void()>& f) {
  f();
  double best = 1e30;
  for (int r = 0; r < rounds; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

struct Row {
  std::string what;
  int threads;
  double gbps;
};

/// `params` parameters in `tensors` tensors (as a shard's), with gradients and AdamW's state.
struct Shard {
  std::vector<std::pair<std::string, torch::Tensor>> named;
  hydra::executor::Optimizer optimizer;
  Shard(int64_t params, int tensors, const hydra::TrainingSpec& adamw)
      : named(Make(params, tensors)), optimizer(named, adamw) {}
  static std::vector<std::pair<std::string, torch::Tensor>> Make(int64_t params, int tensors) {
    std::vector<std::pair<std::string, torch::Tensor>> out;
    for (int i = 0; i < tensors; ++i) {
      auto p = torch::randn({params / tensors, 1});
      p.mutable_grad() = torch::randn_like(p) * 1e-3;
      out.emplace_back("p" + std::to_string(i), p);
    }
    return out;
  }
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"The host optimizer's rate: AdamW over fp32 host tensors, GB/s side by side"};
  int64_t params = int64_t{64} << 20;
  int tensors = 8, rounds = 5;
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  bool smoke = false;
  app.add_option("--params", params, "parameters (fp32)")->capture_default_str();
  app.add_option("--tensors", tensors, "tensors they are split into")->capture_default_str();
  app.add_option("--rounds", rounds, "timed rounds (the best counts)")->capture_default_str();
  app.add_option("--threads", threads, "the most threads (LibTorch's pool)")->capture_default_str();
  app.add_flag("--smoke", smoke, "1M parameters, 2 rounds (CI)");
  CLI11_PARSE(app, argc, argv);
  if (smoke) params = int64_t{1} << 20, rounds = 2;
  if (params < tensors || tensors < 1 || threads < 1 || rounds < 1) {
    std::fprintf(stderr, "--params >= --tensors >= 1, --threads >= 1, --rounds >= 1\n");
    return 2;
  }
  torch::manual_seed(0);
  hydra::TrainingSpec adamw;
  adamw.weight_decay = 0.1;
  Shard shard(params, tensors, adamw);
  const double bytes = kBytesPerParameter * static_cast<double>(params / tensors * tensors);
  std::vector<Row> rows;
  int64_t step = 0;
  auto optimizer_with = [&](AdamWKernel kernel, int n) {
    shard.optimizer.set_adamw_kernel(kernel);
    at::set_num_threads(n);
    return bytes / BestSeconds(rounds, [&] { shard.optimizer.Step(1e-4, ++step); }) / 1e9;
  };
  // The kernel alone, one thread, per instruction set, over the same tensors and state.
  std::vector<std::array<float*, 4>> arrays;  // weights, gradients, exp_avg, exp_avg_sq
  const auto state = shard.optimizer.NamedState();
  for (size_t i = 0; i < shard.named.size(); ++i) {
    auto& p = shard.named[i].second;
    arrays.push_back({p.data_ptr<float>(), p.grad().data_ptr<float>(),
                      state[2 * i].second.data_ptr<float>(),
                      state[2 * i + 1].second.data_ptr<float>()});
  }
  const int64_t each = params / tensors;
  hydra::executor::AdamWScalars scalars;
  scalars.step_size = 1e-4f;
  for (const AdamWIsa isa : hydra::executor::SupportedAdamWIsas()) {
    const double sec = BestSeconds(rounds, [&] {
      for (const auto& a : arrays) {
        hydra::executor::AdamWUpdate(isa, a[0], a[1], a[2], a[3], each, scalars);
      }
    });
    rows.push_back(
        {std::string("kernel, ") + hydra::executor::AdamWIsaName(isa), 1, bytes / sec / 1e9});
  }
  std::vector<int> widths = {1};
  for (int n = 2; n < threads; n *= 2) widths.push_back(n);
  if (threads > 1) widths.push_back(threads);
  for (int n : widths)
    rows.push_back(
        {"Optimizer::Step (the kernel on the pool)", n, optimizer_with(AdamWKernel::kAuto, n)});
  const double per_tensor = optimizer_with(AdamWKernel::kPerTensor, threads);
  rows.push_back({"torch.optim.AdamW's per-tensor operations", threads, per_tensor});
  if (hydra::executor::TorchFusedAdamW()) {
    rows.push_back({"LibTorch's _fused_adamw_ (CPU)", threads,
                    optimizer_with(AdamWKernel::kTorchFused, threads)});
  }
  const double reference = rows.front().gbps;
  std::printf("%lld parameters in %d tensors, best of %d rounds, %d threads at most\n\n",
              static_cast<long long>(params), tensors, rounds, threads);
  std::printf(
      "| update | threads | GB/s | ratio to the scalar kernel | ratio to torch's per-tensor |\n");
  std::printf("|---|---|---|---|---|\n");
  for (const Row& r : rows) {
    std::printf("| %s | %d | %.2f | %.2f | %.2f |\n", r.what.c_str(), r.threads, r.gbps,
                r.gbps / reference, r.gbps / per_tensor);
  }
  return 0;
}
