#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace hydra::cli {

/// What `hydra export` wrote.
struct ExportReport {
  std::string checkpoint;  ///< the checkpoint file the weights came from
  int64_t step = 0;        ///< its step
  std::string directory;   ///< where model.safetensors and config.json are
};

/// `hydra export RUN_DIR --trial NAME -o DIR`: the newest intact checkpoint of trial NAME of a
/// `hydra run` output directory (RUN_DIR/trials/NAME/checkpoints) written as a Hugging Face
/// GPT2LMHeadModel (model.safetensors, config.json) into `out_dir`. The model's sizes come from
/// the checkpoint itself. NOT_FOUND naming the trials there when NAME is not one of them or has
/// no checkpoint; INVALID_ARGUMENT for a family other than gpt2; corrupt newer checkpoints are
/// skipped and named in `warnings`.
StatusOr<ExportReport> ExportTrial(const std::string& run_dir, const std::string& trial,
                                   const std::string& out_dir, std::vector<std::string>* warnings);

}  // namespace hydra::cli
