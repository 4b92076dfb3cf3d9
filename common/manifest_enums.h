#pragma once

#include <optional>
#include <string>
#include <vector>

namespace hydra {

// The manifest's closed sets: each value as an enum, named in manifests, in the wire's strings
// and in the job JSON by the text NameOf gives.

/// spec.training.precision: the number format forward and backward compute in. In kBf16,
/// matrix products and most element-wise work run in bfloat16 while master weights, optimizer
/// state, softmax, LayerNorm statistics, the loss and the gradient norm stay fp32.
enum class Precision { kFp32, kBf16 };

/// spec.model.init.format: how pretrained weights are stored. A closed set: Hugging Face's
/// safetensors (a GPT2LMHeadModel's model.safetensors) is the one format read.
enum class InitFormat { kSafetensors };

/// spec.model.family: "gpt2" | "torchscript" | "mlp" | "resnet".
enum class ModelFamily { kGpt2, kTorchScript, kMlp, kResNet };

/// spec.dataset.format: "text" (bytes are tokens) | "tokens-u16" | "tokens-u32" (little-endian
/// uint16 / uint32) | "images-u8" (records of one label byte and imageShape pixel bytes,
/// channel-planar: CIFAR-10's binary layout).
enum class DatasetFormat { kText, kTokensU16, kTokensU32, kImagesU8 };

/// spec.training.optimizer: "adamw" | "sgd".
enum class OptimizerKind { kAdamW, kSgd };

/// spec.training.lrSchedule: "constant" | "cosine" (to 10% of learningRate).
enum class LrSchedule { kConstant, kCosine };

/// spec.resources.offload: where shards' state lives off the device, "host" | "disk".
enum class OffloadTier { kHost, kDisk };

/// The manifest's name of a value ("fp32", "gpt2", "tokens-u16", ...).
const char* NameOf(Precision v);
const char* NameOf(InitFormat v);
const char* NameOf(ModelFamily v);
const char* NameOf(DatasetFormat v);
const char* NameOf(OptimizerKind v);
const char* NameOf(LrSchedule v);
const char* NameOf(OffloadTier v);

/// Every name of E, in the enum's order (defined for the enums above).
template <typename E>
const std::vector<std::string>& NamesOf();

/// The value of E named `text`; nullopt for any other text.
template <typename E>
std::optional<E> ParseName(const std::string& text);

/// What is wrong with `text` as a name of E: "must be one of: a, b (got 'c')"; empty if
/// nothing.
template <typename E>
std::string NameProblem(const std::string& text);

/// "fp32" | "bf16" (NameOf).
const char* PrecisionName(Precision p);
/// The Precision named `text`; nullopt for any other text.
std::optional<Precision> ParsePrecision(const std::string& text);
/// "safetensors" (NameOf).
const char* InitFormatName(InitFormat f);

}  // namespace hydra
