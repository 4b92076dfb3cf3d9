#pragma once
// Torch-facing: include only from executor translation units.

#include <functional>

#include "agent/executor/layer_sequence.h"
#include "common/job.h"

namespace hydra::executor {

/// GPT-2 (Radford et al. 2019) as a layer sequence: "embed" (token + position embeddings),
/// "block0".."block<n-1>" (pre-LN transformer blocks with causal self-attention and a GELU
/// MLP), and "head" (final LayerNorm and the LM head tied to the token embedding).
/// Input: int64 token ids [batch, time]; output: logits [batch, time, vocab].
/// Initialised as GPT-2: N(0, 0.02) weights, residual projections scaled by 1/sqrt(2 nLayer),
/// zero biases; deterministic for a given `seed`.
/// `on_layer_built(i)`, when given, runs right after layer i is created and initialised, so a
/// caller can move it out of memory before the next layer exists.
LayerSequence BuildGpt2(
    const ModelSpec& spec, uint64_t seed,
    const std::function<void(const LayerSequence&, size_t)>& on_layer_built = {});

}  // namespace hydra::executor
