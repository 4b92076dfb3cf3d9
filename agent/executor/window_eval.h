#pragma once

#include <cstdint>

#include "agent/executor/dataset.h"
#include "common/job.h"
#include "common/status.h"

namespace hydra::executor {

/// A language model's loss over a whole token file (hydra eval).
struct WindowLoss {
  double loss = 0;      ///< mean next-token cross-entropy over the scored tokens, in nats
  int64_t tokens = 0;   ///< scored (predicted) tokens: windows x contextLength
  int64_t windows = 0;  ///< windows of contextLength + 1 tokens
  int64_t dropped = 0;  ///< tokens after the last whole window, not scored
};

/// The mean next-token cross-entropy of the trial's model (BuildModel: a gpt2 with
/// spec.model.init starts from its checkpoint) over `data` cut into non-overlapping windows of
/// contextLength + 1 tokens from its first token: each window's first contextLength tokens are
/// the input and its last contextLength the targets; the last, partial window is dropped.
/// `batch` windows run at once, in fp32, without gradients. INVALID_ARGUMENT when the data
/// holds fewer tokens than one window or a token outside the vocabulary.
StatusOr<WindowLoss> EvaluateWindows(const Trial& trial, const TokenDataset& data,
                                     int64_t batch = 8);

}  // namespace hydra::executor
