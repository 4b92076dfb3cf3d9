#include "common/manifest_enums.h"

#include <array>
#include <utility>

namespace hydra {
namespace {

/// Each enum's values and their names, in the enum's order.
template <typename E>
struct Rows;

template <typename E, size_t N>
using Table = std::array<std::pair<E, const char*>, N>;

template <>
struct Rows<Precision> {
  static constexpr Table<Precision, 2> kRows = {
      {{Precision::kFp32, "fp32"}, {Precision::kBf16, "bf16"}}};
};
template <>
struct Rows<InitFormat> {
  static constexpr Table<InitFormat, 1> kRows = {{{InitFormat::kSafetensors, "safetensors"}}};
};
template <>
struct Rows<ModelFamily> {
  static constexpr Table<ModelFamily, 4> kRows = {{{ModelFamily::kGpt2, "gpt2"},
                                                   {ModelFamily::kTorchScript, "torchscript"},
                                                   {ModelFamily::kMlp, "mlp"},
                                                   {ModelFamily::kResNet, "resnet"}}};
};
template <>
struct Rows<DatasetFormat> {
  static constexpr Table<DatasetFormat, 4> kRows = {{{DatasetFormat::kText, "text"},
                                                     {DatasetFormat::kTokensU16, "tokens-u16"},
                                                     {DatasetFormat::kTokensU32, "tokens-u32"},
                                                     {DatasetFormat::kImagesU8, "images-u8"}}};
};
template <>
struct Rows<OptimizerKind> {
  static constexpr Table<OptimizerKind, 2> kRows = {
      {{OptimizerKind::kAdamW, "adamw"}, {OptimizerKind::kSgd, "sgd"}}};
};
template <>
struct Rows<LrSchedule> {
  static constexpr Table<LrSchedule, 2> kRows = {
      {{LrSchedule::kConstant, "constant"}, {LrSchedule::kCosine, "cosine"}}};
};
template <>
struct Rows<OffloadTier> {
  static constexpr Table<OffloadTier, 2> kRows = {
      {{OffloadTier::kHost, "host"}, {OffloadTier::kDisk, "disk"}}};
};

template <typename E>
const char* Name(E v) {
  for (const auto& [e, name] : Rows<E>::kRows) {
    if (e == v) return name;
  }
  return "?";  // a value cast from outside the enum
}

}  // namespace

template <typename E>
const std::vector<std::string>& NamesOf() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> all;
    for (const auto& row : Rows<E>::kRows) all.emplace_back(row.second);
    return all;
  }();
  return names;
}

template <typename E>
std::optional<E> ParseName(const std::string& text) {
  for (const auto& [e, name] : Rows<E>::kRows) {
    if (text == name) return e;
  }
  return std::nullopt;
}

template <typename E>
std::string NameProblem(const std::string& text) {
  if (ParseName<E>(text)) return "";
  std::string all;
  for (const auto& name : NamesOf<E>()) all += (all.empty() ? "" : ", ") + name;
  return "must be one of: " + all + " (got '" + text + "')";
}

#define HYDRA_MANIFEST_ENUM(E)                                     \
  const char* NameOf(E v) { return Name(v); }                      \
  template const std::vector<std::string>& NamesOf<E>();           \
  template std::optional<E> ParseName<E>(const std::string& text); \
  template std::string NameProblem<E>(const std::string& text);

HYDRA_MANIFEST_ENUM(Precision)
HYDRA_MANIFEST_ENUM(InitFormat)
HYDRA_MANIFEST_ENUM(ModelFamily)
HYDRA_MANIFEST_ENUM(DatasetFormat)
HYDRA_MANIFEST_ENUM(OptimizerKind)
HYDRA_MANIFEST_ENUM(LrSchedule)
HYDRA_MANIFEST_ENUM(OffloadTier)

#undef HYDRA_MANIFEST_ENUM

const char* PrecisionName(Precision p) { return NameOf(p); }

std::optional<Precision> ParsePrecision(const std::string& text) {
  return ParseName<Precision>(text);
}

const char* InitFormatName(InitFormat f) { return NameOf(f); }

}  // namespace hydra
