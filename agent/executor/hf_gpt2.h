#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "agent/executor/executor.h"
#include "agent/executor/safetensors.h"
#include "common/job.h"
#include "common/status.h"

namespace hydra::executor {

/// One tensor of the built-in gpt2 family and its Hugging Face `GPT2LMHeadModel` counterpart.
struct HfGpt2Tensor {
  std::string ours;            ///< as the executors name it ("block0.qkv.weight")
  std::string hf;              ///< without the "transformer." prefix ("h.0.attn.c_attn.weight")
  size_t layer = 0;            ///< index of its layer in the layer sequence (embed, block0.., head)
  std::vector<int64_t> shape;  ///< ours
  std::vector<int64_t> hf_shape;  ///< in the file: Conv1D weights are [in, out]
  bool transposed = false;        ///< a Conv1D weight: ours is the file's transpose
};

/// Every tensor of a gpt2 model of `spec`, in the layer sequence's order. The file's `wpe` may
/// hold more positions than contextLength (GPT-2's 1024): the first contextLength are used.
std::vector<HfGpt2Tensor> HfGpt2Tensors(const ModelSpec& spec);

/// Checks a Hugging Face GPT-2 checkpoint against the manifest's model before any training:
/// every tensor there (names with or without "transformer."), with its shape (wpe: at least
/// contextLength positions) and a dtype of F32, BF16 or F16; nothing else but the attention
/// mask buffers (attn.bias, attn.masked_bias) and the tied lm_head.weight. INVALID_ARGUMENT
/// naming the tensor and both shapes.
Status CheckHfGpt2(const SafetensorsHeader& header, const ModelSpec& spec, const std::string& what);

/// Maps spec.init's checkpoint and checks it against the model (CheckHfGpt2): what Admit runs
/// before anything trains and what the executors load from. Errors name
/// "spec.model.init.path: <file>"; NOT_FOUND for a missing file. FAILED_PRECONDITION when the
/// model has no init.
StatusOr<SafetensorsFile> OpenHfGpt2(const ModelSpec& spec);

/// The file's entry for `t` (with or without the "transformer." prefix), or nullptr.
const SafetensorsEntry* FindHfGpt2(const SafetensorsFile& file, const HfGpt2Tensor& t);

/// A trained gpt2 model as Hugging Face's `save_pretrained` writes it: model.safetensors (F32,
/// "transformer."-prefixed names, Conv1D weights as [in, out], lm_head tied so left out) from
/// the executor's exported state (optimizer state is skipped), and config.json.
StatusOr<std::string> HfGpt2Safetensors(const ModelSpec& spec,
                                        const std::vector<NamedBuffer>& state);
std::string HfGpt2Config(const ModelSpec& spec);

/// Writes HfGpt2Safetensors and HfGpt2Config into `dir` (created if missing) as
/// model.safetensors and config.json, each atomically, the model first: a directory that
/// `transformers.GPT2LMHeadModel.from_pretrained(dir)` loads.
Status WriteHfGpt2(const ModelSpec& spec, const std::vector<NamedBuffer>& state,
                   const std::string& dir);

}  // namespace hydra::executor
