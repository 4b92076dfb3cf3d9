// bench/train_throughput: tokens/s of one GPT-2 trial trained by Hydra's executor.
// Prints one JSON line; bench/train_throughput.sh runs it side by side with PyTorch eager.
#include <torch/csrc/autograd/profiler_legacy.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "agent/executor/inmemory_executor.h"

int main(int argc, char** argv) {
  CLI::App app{"Tokens/s of one GPT-2 trial with Hydra's in-memory executor"};
  hydra::Trial t;
  t.name = "bench";
  t.dataset.format = hydra::DatasetFormat::kText;
  t.dataset.validation_fraction = 0.05;
  int warmup = 3, threads = 2;
  app.add_option("--corpus", t.dataset.resolved_path, "text file")->required();
  app.add_option("--layers", t.model.n_layer)->capture_default_str();
  app.add_option("--embd", t.model.n_embd)->capture_default_str();
  app.add_option("--heads", t.model.n_head)->capture_default_str();
  app.add_option("--ctx", t.model.context_length)->capture_default_str();
  app.add_option("--vocab", t.model.vocab_size, "embedding rows (>= 256: bytes)")
      ->capture_default_str();
  app.add_option("--batch", t.training.batch_size)->capture_default_str();
  app.add_option("--steps", t.training.steps, "timed steps")->capture_default_str();
  app.add_option("--warmup", warmup, "untimed steps first")->capture_default_str();
  app.add_option("--threads", threads)->capture_default_str();
  app.add_option("--seed", t.training.seed)->capture_default_str();
  std::string precision = "fp32";
  app.add_option("--precision", precision, "fp32 | bf16")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (auto p = hydra::ParsePrecision(precision)) {
    t.training.precision = *p;
  } else {
    std::cerr << "--precision must be fp32 or bf16, got " << precision << "\n";
    return 2;
  }
  t.training.learning_rate = 3e-4;

  auto data = hydra::executor::TokenDataset::Open(t.dataset, t.model.context_length + 1);
  if (!data.ok()) {
    std::cerr << data.status() << "\n";
    return 1;
  }
  hydra::executor::InMemoryExecutorOptions options;
  options.threads = threads;
  auto factory = hydra::executor::MakeInMemoryExecutorFactory(options);
  auto exec = factory->Create(t, *data);
  if (!exec.ok()) {
    std::cerr << exec.status() << "\n";
    return 1;
  }
  double last_loss = 0;
  for (int i = 0; i < warmup; ++i) last_loss = (*exec)->TrainStep()->loss;
  std::unique_ptr<torch::autograd::profiler::RecordProfile> profile;
  if (const char* path = std::getenv("HYDRA_BENCH_PROFILE")) {
    profile = std::make_unique<torch::autograd::profiler::RecordProfile>(path);
  }
  const auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < t.training.steps; ++i) {
    auto m = (*exec)->TrainStep();
    if (!m.ok()) {
      std::cerr << m.status() << "\n";
      return 1;
    }
    last_loss = m->loss;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  profile.reset();  // writes the Chrome trace
  const double tokens =
      static_cast<double>(t.training.steps * t.training.batch_size * t.model.context_length);
  std::cout << nlohmann::json{{"impl", "hydra-cpp"},
                              {"precision", precision},
                              {"tokens_per_second", tokens / seconds},
                              {"seconds", seconds},
                              {"final_loss", last_loss}}
                   .dump()
            << std::endl;
  return 0;
}
