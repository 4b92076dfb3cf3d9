#pragma once

#include <string>

namespace hydra::cli {

struct EvalArgs {
  std::string manifest;  ///< the model's fields and the dataset's format come from it
  std::string init;      ///< a Hugging Face GPT-2 model.safetensors
  std::string data;      ///< the token file to score
  bool json = false;     ///< print {"loss": ..., "tokens": ...}
  int threads = 1;
};

/// `hydra eval JOB.yaml --init FILE --data FILE [--json]`: prints the mean next-token
/// cross-entropy of the manifest's gpt2 model started from FILE over the data file cut into
/// non-overlapping windows of contextLength + 1 tokens (executor::EvaluateWindows). Returns the
/// exit code: 0, or 2 with the error on stderr.
int Eval(const EvalArgs& args);

}  // namespace hydra::cli
