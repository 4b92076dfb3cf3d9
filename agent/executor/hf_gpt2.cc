#include "agent/executor/hf_gpt2.h"

#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "common/file_util.h"

namespace hydra::executor {
namespace {

constexpr const char* kPrefix = "transformer.";

/// A file's name for a tensor without the "transformer." prefix.
std::string Bare(const std::string& name) {
  return name.rfind(kPrefix, 0) == 0 ? name.substr(std::strlen(kPrefix)) : name;
}

/// Whether `text` ends with `suffix` and holds more than it.
bool EndsWith(const std::string& text, const std::string& suffix) {
  return text.size() > suffix.size() &&
         text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

/// Names a file may hold that the model does not train: the attention mask buffers of older
/// transformers versions and the LM head, tied to wte.
bool IsIgnoredHfName(const std::string& name, const ModelSpec& spec) {
  if (name == "lm_head.weight") return true;
  if (!EndsWith(name, ".attn.bias") && !EndsWith(name, ".attn.masked_bias")) return false;
  for (int64_t i = 0; i < spec.n_layer; ++i) {
    const std::string block = "h." + std::to_string(i) + ".attn.";
    for (const std::string& b : {block + "bias", block + "masked_bias"}) {
      if (name == b || name == kPrefix + b) return true;
    }
  }
  return false;
}

/// [rows, cols] floats transposed into [cols, rows].
std::vector<char> Transposed(const std::vector<char>& data, int64_t rows, int64_t cols) {
  std::vector<char> out(data.size());
  const auto* in = reinterpret_cast<const float*>(data.data());
  auto* t = reinterpret_cast<float*>(out.data());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) t[c * rows + r] = in[r * cols + c];
  }
  return out;
}

}  // namespace

std::vector<HfGpt2Tensor> HfGpt2Tensors(const ModelSpec& spec) {
  const int64_t C = spec.n_embd;
  std::vector<HfGpt2Tensor> out;
  auto add = [&](std::string ours, std::string hf, size_t layer, std::vector<int64_t> shape,
                 bool transposed = false) {
    std::vector<int64_t> hf_shape = shape;
    if (transposed) hf_shape = {shape[1], shape[0]};
    out.push_back({std::move(ours), std::move(hf), layer, shape, hf_shape, transposed});
  };
  add("embed.wte", "wte.weight", 0, {spec.vocab_size, C});
  add("embed.wpe", "wpe.weight", 0, {spec.context_length, C});
  for (int64_t i = 0; i < spec.n_layer; ++i) {
    const std::string b = "block" + std::to_string(i) + ".", h = "h." + std::to_string(i) + ".";
    const auto layer = static_cast<size_t>(i + 1);
    add(b + "ln1.weight", h + "ln_1.weight", layer, {C});
    add(b + "ln1.bias", h + "ln_1.bias", layer, {C});
    add(b + "qkv.weight", h + "attn.c_attn.weight", layer, {3 * C, C}, true);
    add(b + "qkv.bias", h + "attn.c_attn.bias", layer, {3 * C});
    add(b + "proj.weight", h + "attn.c_proj.weight", layer, {C, C}, true);
    add(b + "proj.bias", h + "attn.c_proj.bias", layer, {C});
    add(b + "ln2.weight", h + "ln_2.weight", layer, {C});
    add(b + "ln2.bias", h + "ln_2.bias", layer, {C});
    add(b + "fc.weight", h + "mlp.c_fc.weight", layer, {4 * C, C}, true);
    add(b + "fc.bias", h + "mlp.c_fc.bias", layer, {4 * C});
    add(b + "fc_proj.weight", h + "mlp.c_proj.weight", layer, {C, 4 * C}, true);
    add(b + "fc_proj.bias", h + "mlp.c_proj.bias", layer, {C});
  }
  const auto head = static_cast<size_t>(spec.n_layer + 1);
  add("head.ln_f.weight", "ln_f.weight", head, {C});
  add("head.ln_f.bias", "ln_f.bias", head, {C});
  return out;
}

Status CheckHfGpt2(const SafetensorsHeader& header, const ModelSpec& spec,
                   const std::string& what) {
  std::map<std::string, const SafetensorsEntry*> by_name;
  for (const auto& e : header.tensors) {
    const std::string bare = Bare(e.name);
    if (!by_name.emplace(bare, &e).second) {
      return InvalidArgumentError(what + ": tensor '" + bare + "' is there with and without " +
                                  "the 'transformer.' prefix");
    }
  }
  std::set<std::string> used;
  for (const auto& t : HfGpt2Tensors(spec)) {
    auto it = by_name.find(t.hf);
    if (it == by_name.end()) {
      return InvalidArgumentError(what + ": no tensor '" + t.hf + "' (or '" + kPrefix + t.hf +
                                  "'), which the manifest's gpt2 model needs with shape " +
                                  ShapeText(t.hf_shape));
    }
    const SafetensorsEntry& e = *it->second;
    used.insert(it->first);
    if (e.dtype != SafetensorsDtype::kF32 && e.dtype != SafetensorsDtype::kBF16 &&
        e.dtype != SafetensorsDtype::kF16) {
      return InvalidArgumentError(what + ": tensor '" + e.name + "' is " +
                                  SafetensorsDtypeName(e.dtype) + ", not F32, BF16 or F16");
    }
    const bool positions = t.ours == "embed.wpe";
    const bool fits = positions ? e.shape.size() == 2 && e.shape[0] >= t.hf_shape[0] &&
                                      e.shape[1] == t.hf_shape[1]
                                : e.shape == t.hf_shape;
    if (!fits) {
      return InvalidArgumentError(what + ": tensor '" + e.name + "' has shape " +
                                  ShapeText(e.shape) + ", but the manifest's model needs " +
                                  ShapeText(t.hf_shape) +
                                  (positions ? " (at least contextLength positions)" : "") +
                                  " (spec.model: nLayer, nEmbd, contextLength, vocabSize)");
    }
  }
  for (const auto& e : header.tensors) {
    if (used.count(Bare(e.name)) || IsIgnoredHfName(e.name, spec)) continue;
    return InvalidArgumentError(what + ": tensor '" + e.name +
                                "' is not part of a gpt2 model with nLayer " +
                                std::to_string(spec.n_layer));
  }
  return OkStatus();
}

StatusOr<SafetensorsFile> OpenHfGpt2(const ModelSpec& spec) {
  if (!spec.init) return FailedPreconditionError("spec.model.init: not set");
  const std::string& path = spec.init->resolved_path;
  const std::string what = "spec.model.init.path: " + path;
  if (EndsWith(path, ".index.json")) {
    return InvalidArgumentError(what +
                                ": a sharded checkpoint's index; one model.safetensors is read "
                                "(write one with save_pretrained(dir, max_shard_size=\"100GB\"))");
  }
  auto file = SafetensorsFile::Open(path);
  if (!file.ok()) {
    return Status(file.status().code(), "spec.model.init.path: " + file.status().message());
  }
  RETURN_IF_ERROR(CheckHfGpt2(file->header(), spec, what));
  return file;
}

const SafetensorsEntry* FindHfGpt2(const SafetensorsFile& file, const HfGpt2Tensor& t) {
  if (const auto* e = file.Find(t.hf)) return e;
  return file.Find(kPrefix + t.hf);
}

StatusOr<std::string> HfGpt2Safetensors(const ModelSpec& spec,
                                        const std::vector<NamedBuffer>& state) {
  std::map<std::string, const NamedBuffer*> by_name;
  for (const auto& b : state) by_name[b.name] = &b;
  std::deque<std::vector<char>> transposed;  // kept alive (and in place) until serialized
  std::vector<SafetensorsTensor> tensors;
  for (const auto& t : HfGpt2Tensors(spec)) {
    auto it = by_name.find(t.ours);
    if (it == by_name.end()) return InvalidArgumentError("the state lacks '" + t.ours + "'");
    const NamedBuffer& b = *it->second;
    if (b.dtype != "float32" || b.shape != t.shape) {
      return InvalidArgumentError("state tensor '" + t.ours + "' is " + b.dtype + " " +
                                  ShapeText(b.shape) + ", not float32 " + ShapeText(t.shape));
    }
    const std::vector<char>* data = &b.data;
    if (t.transposed) {
      transposed.push_back(Transposed(b.data, t.shape[0], t.shape[1]));
      data = &transposed.back();
    }
    tensors.push_back(
        {kPrefix + t.hf, SafetensorsDtype::kF32, t.hf_shape, data->data(), data->size()});
  }
  return SerializeSafetensors(tensors, {{"format", "pt"}});
}

std::string HfGpt2Config(const ModelSpec& spec) {
  const nlohmann::json config = {{"architectures", {"GPT2LMHeadModel"}},
                                 {"model_type", "gpt2"},
                                 {"vocab_size", spec.vocab_size},
                                 {"n_positions", spec.context_length},
                                 {"n_ctx", spec.context_length},
                                 {"n_embd", spec.n_embd},
                                 {"n_layer", spec.n_layer},
                                 {"n_head", spec.n_head},
                                 {"activation_function", "gelu_new"},
                                 {"layer_norm_epsilon", 1e-5},
                                 {"resid_pdrop", 0.0},
                                 {"embd_pdrop", 0.0},
                                 {"attn_pdrop", 0.0},
                                 {"tie_word_embeddings", true},
                                 {"torch_dtype", "float32"}};
  return config.dump(2) + "\n";
}

Status WriteHfGpt2(const ModelSpec& spec, const std::vector<NamedBuffer>& state,
                   const std::string& dir) {
  ASSIGN_OR_RETURN(std::string model, HfGpt2Safetensors(spec, state));
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return FailedPreconditionError(dir + ": cannot create the directory: " + ec.message());
  const std::filesystem::path d(dir);
  RETURN_IF_ERROR(WriteFileAtomically((d / "model.safetensors").string(), model));
  return WriteFileAtomically((d / "config.json").string(), HfGpt2Config(spec));
}

}  // namespace hydra::executor
