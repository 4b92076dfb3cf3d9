#include "cli/eval.h"

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "agent/executor/cpu_threads.h"
#include "agent/executor/dataset.h"
#include "agent/executor/window_eval.h"
#include "common/job.h"

namespace hydra::cli {
namespace {

namespace fs = std::filesystem;

std::string Absolute(const std::string& path) {
  std::error_code ec;
  const fs::path abs = fs::absolute(path, ec);
  return (ec ? fs::path(path) : abs).lexically_normal().string();
}

/// The manifest's model with `init` as its checkpoint, and its dataset read from `data`.
StatusOr<Trial> EvalTrial(const EvalArgs& a) {
  ASSIGN_OR_RETURN(MultiModelJob job, LoadJobFile(a.manifest));
  if (job.spec.model.family != ModelFamily::kGpt2) {
    return InvalidArgumentError(a.manifest + ": spec.model.family is " +
                                NameOf(job.spec.model.family) + "; hydra eval scores gpt2 models");
  }
  Trial t;
  t.name = job.metadata.name;
  t.model = job.spec.model;
  ModelInit init;
  init.path = a.init;
  init.resolved_path = Absolute(a.init);
  t.model.init = init;
  t.dataset = job.spec.dataset;
  t.dataset.path = a.data;
  t.dataset.resolved_path = Absolute(a.data);
  return t;
}

}  // namespace

int Eval(const EvalArgs& a) {
  executor::ConfigureCpuThreads(a.threads);
  auto trial = EvalTrial(a);
  if (!trial.ok()) {
    std::cerr << "error: " << trial.status().message() << "\n";
    return 2;
  }
  // Any split will do (every token is scored): window 1 so a file of one window opens.
  auto data = executor::TokenDataset::Open(trial->dataset, 1);
  if (!data.ok()) {
    std::cerr << "error: --data: " << data.status().message() << "\n";
    return 2;
  }
  auto result = executor::EvaluateWindows(*trial, **data);
  if (!result.ok()) {
    std::cerr << "error: " << result.status().message() << "\n";
    return 2;
  }
  if (a.json) {
    std::cout << nlohmann::json{{"loss", result->loss}, {"tokens", result->tokens}}.dump() << "\n";
    return 0;
  }
  std::printf(
      "loss %.6f nats/token over %lld tokens (%lld windows of contextLength + 1 = %lld; "
      "%lld trailing tokens not scored)\n",
      result->loss, static_cast<long long>(result->tokens), static_cast<long long>(result->windows),
      static_cast<long long>(trial->model.context_length + 1),
      static_cast<long long>(result->dropped));
  return 0;
}

}  // namespace hydra::cli
