#include "common/job.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>

#include "common/cost_model.h"
#include "common/random_search.h"
#include "common/units.h"
#include "common/yaml_document.h"

namespace hydra {
namespace {

namespace fs = std::filesystem;

/// The model and training settings one trial runs with: what grid values override.
struct TrialConfig {
  ModelSpec model;
  TrainingSpec training;
};

enum class Kind { kInt, kFloat, kEnum };

std::vector<Trial> ExpandInto(const MultiModelJob& job, std::vector<FieldError>* errors);

/// One searchable field of spec.model or spec.training: its rule and where it lives.
struct FieldDef {
  const char* section;  // "model" | "training"
  const char* name;
  const char* abbrev;  // used in trial names
  Kind kind;
  double min = -INFINITY;
  bool min_exclusive = false;
  double max = INFINITY;
  std::vector<std::string> enums;
  std::function<void(TrialConfig&, const ParamValue&)> set;
  std::function<ParamValue(const TrialConfig&)> get;
};

#define HYDRA_INT_FIELD(sec, name, abbrev, member, lo, hi)                              \
  FieldDef {                                                                            \
#sec, name, abbrev, Kind::kInt, lo, false, hi, {},                                    \
        [](TrialConfig& c, const ParamValue& v) { c.sec.member = std::get<int64_t>(v); }, \
        [](const TrialConfig& c) { return ParamValue(c.sec.member); } \
  }
#define HYDRA_FLOAT_FIELD(sec, name, abbrev, member, lo, excl, hi)                     \
  FieldDef {                                                                           \
#sec, name, abbrev, Kind::kFloat, lo, excl, hi, {},                                  \
        [](TrialConfig& c, const ParamValue& v) { c.sec.member = std::get<double>(v); }, \
        [](const TrialConfig& c) { return ParamValue(c.sec.member); } \
  }
/// A field of one of the manifest's closed sets (manifest_enums.h): its names in the manifest,
/// its enum in the spec.
#define HYDRA_ENUM_FIELD(sec, name, abbrev, member, Enum)                                        \
  FieldDef {                                                                                     \
#sec, name, abbrev, Kind::kEnum, -INFINITY, false, INFINITY, NamesOf<Enum>(),                  \
        [](TrialConfig& c, const ParamValue& v) {                                                \
          c.sec.member = *ParseName<Enum>(std::get<std::string>(v));                             \
        },                                                                                       \
        [](const TrialConfig& c) { return ParamValue(std::string(NameOf(c.sec.member))); } \
  }

const std::vector<FieldDef>& Fields() {
  static const std::vector<FieldDef> kFields = {
      HYDRA_ENUM_FIELD(model, "family", "f", family, ModelFamily),
      HYDRA_INT_FIELD(model, "nLayer", "l", n_layer, 1, 1024),
      HYDRA_INT_FIELD(model, "nEmbd", "d", n_embd, 1, 65536),
      HYDRA_INT_FIELD(model, "nHead", "h", n_head, 1, 1024),
      HYDRA_INT_FIELD(model, "contextLength", "ctx", context_length, 2, 1 << 20),
      HYDRA_INT_FIELD(model, "vocabSize", "v", vocab_size, 2, 1 << 24),
      HYDRA_INT_FIELD(model, "numClasses", "k", num_classes, 2, 256),
      HYDRA_ENUM_FIELD(training, "optimizer", "opt", optimizer, OptimizerKind),
      HYDRA_FLOAT_FIELD(training, "learningRate", "lr", learning_rate, 0, true, 10),
      HYDRA_INT_FIELD(training, "batchSize", "bs", batch_size, 1, 1 << 20),
      HYDRA_INT_FIELD(training, "steps", "steps", steps, 1, 1e12),
      HYDRA_INT_FIELD(training, "seed", "seed", seed, 0, 9.2e18),
      HYDRA_INT_FIELD(training, "evalEverySteps", "eval", eval_every_steps, 0, 1e12),
      HYDRA_INT_FIELD(training, "checkpointEverySteps", "ckpt", checkpoint_every_steps, 0, 1e12),
      HYDRA_INT_FIELD(training, "gradientAccumulationSteps", "ga", gradient_accumulation_steps, 1,
                      1 << 20),
      HYDRA_FLOAT_FIELD(training, "weightDecay", "wd", weight_decay, 0, false, 10),
      HYDRA_FLOAT_FIELD(training, "momentum", "mom", momentum, 0, false, 1),
      HYDRA_FLOAT_FIELD(training, "beta1", "b1", beta1, 0, false, 1),
      HYDRA_FLOAT_FIELD(training, "beta2", "b2", beta2, 0, false, 1),
      HYDRA_FLOAT_FIELD(training, "epsilon", "eps", epsilon, 0, true, 1),
      HYDRA_FLOAT_FIELD(training, "gradClipNorm", "clip", grad_clip_norm, 0, false, 1e9),
      HYDRA_ENUM_FIELD(training, "lrSchedule", "sched", lr_schedule, LrSchedule),
      HYDRA_INT_FIELD(training, "warmupSteps", "warm", warmup_steps, 0, 1e12),
      HYDRA_ENUM_FIELD(training, "precision", "prec", precision, Precision),
  };
  return kFields;
}

/// A field's place in the table: the canonical order of searched axes.
size_t FieldRank(const std::string& name) {
  const auto& fields = Fields();
  for (size_t i = 0; i < fields.size(); ++i) {
    if (name == fields[i].name) return i;
  }
  return fields.size();
}

const FieldDef* FindField(const std::string& section, const std::string& name) {
  for (const auto& f : Fields()) {
    if ((section.empty() || section == f.section) && name == f.name) return &f;
  }
  return nullptr;
}

std::string Join(const std::vector<std::string>& parts, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? sep : "") + parts[i];
  return out;
}

std::string FormatNumber(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  // Shortest text that reads back as the same double.
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof(buf), "%.*g", precision, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

/// What is wrong with `v` as a value of `f` by its range; empty if nothing.
std::string RangeProblem(const FieldDef& f, double v) {
  if (f.min_exclusive ? !(v > f.min) : !(v >= f.min)) {
    return std::string("must be ") + (f.min_exclusive ? "> " : ">= ") + FormatNumber(f.min);
  }
  if (!(v <= f.max)) return "must be <= " + FormatNumber(f.max);
  return "";
}

/// What is wrong with `v` as a value of `f` (kind, enum, range); empty if nothing.
std::string ValueProblem(const FieldDef& f, const ParamValue& v) {
  switch (f.kind) {
    case Kind::kEnum: {
      const auto* text = std::get_if<std::string>(&v);
      if (text == nullptr) return "must be a string";
      for (const auto& e : f.enums) {
        if (*text == e) return "";
      }
      return "must be one of: " + Join(f.enums, ", ") + " (got '" + *text + "')";
    }
    case Kind::kInt: {
      const auto* i = std::get_if<int64_t>(&v);
      if (i == nullptr) return "must be an integer";
      return RangeProblem(f, static_cast<double>(*i));
    }
    case Kind::kFloat: {
      const auto* d = std::get_if<double>(&v);
      if (d == nullptr) return "must be a number";
      if (!std::isfinite(*d)) return "must be a finite number";
      return RangeProblem(f, *d);
    }
  }
  return "";
}

/// The rules of the fields outside the searchable table (spec.dataset, spec.resources, the
/// identity), shared by the manifest parser and ValidateTrial: one rule set. Each returns what
/// is wrong with a value, empty if nothing.
namespace rules {

std::string ImageShapeProblem(const std::vector<int64_t>& shape) {
  bool ok = shape.size() == 3;
  for (int64_t d : shape) ok = ok && d >= 1 && d <= 4096;
  return ok ? "" : "must be [channels, height, width], each 1..4096";
}

std::string ValidationFractionProblem(double v) {
  return v > 0 && v < 1 ? "" : "must be a number > 0 and < 1";
}

std::string EvalSequencesProblem(int64_t v) {
  return v >= 1 && v <= kMaxEvalSequences
             ? ""
             : "must be an integer from 1 to " + std::to_string(kMaxEvalSequences);
}

std::string DeviceMemoryBudgetProblem(int64_t v) { return v > 0 ? "" : "must be > 0"; }

std::string HostMemoryBudgetProblem(int64_t v) { return v >= 0 ? "" : "must be >= 0"; }

std::string ShardBoundaryProblem(int64_t v, int64_t prev) {
  if (v > prev) return "";
  return "must be > " + std::to_string(prev) +
         " (boundaries are increasing layer indices, layer 0 starts the first shard)";
}

/// metadata.uid: what Kubernetes gives (a UUID); letters, digits and '-', at most 128.
std::string UidProblem(const std::string& v) {
  bool ok = !v.empty() && v.size() <= 128;
  for (char ch : v) ok = ok && (std::isalnum(static_cast<unsigned char>(ch)) || ch == '-');
  return ok ? "" : "must be 1..128 letters, digits or '-' (a Kubernetes UID)";
}

std::string TrialNameProblem(const std::string& name) {
  if (IsDnsLabel(name)) return "";
  if (name.size() > kMaxTrialNameLength && IsDnsSubdomain(name) &&
      name.find('.') == std::string::npos) {
    return "trial name " + name + " is " + std::to_string(name.size()) +
           " characters, more than a DNS-1123 label's " + std::to_string(kMaxTrialNameLength) +
           ": shorten metadata.name";
  }
  return "trial name '" + name +
         "' is not a DNS-1123 label (lowercase letters, digits and '-', at most " +
         std::to_string(kMaxTrialNameLength) + " characters)";
}

}  // namespace rules

/// A YAML scalar as an integer (decimal digits only, in int64's range); nullopt otherwise.
std::optional<int64_t> ScalarInt(const YAML::Node& node) {
  if (!node.IsScalar()) return std::nullopt;
  const std::string& text = node.Scalar();
  try {
    size_t pos = 0;
    const long long v = std::stoll(text, &pos, 10);
    if (pos != text.size()) return std::nullopt;
    return v;
  } catch (...) {
    return std::nullopt;
  }
}

/// Collects errors while walking the YAML tree.
class Checker {
 public:
  explicit Checker(std::vector<FieldError>* errors) : errors_(errors) {}

  void Error(const std::string& path, const YAML::Node& node, const std::string& message) {
    int line = node.IsDefined() ? node.Mark().line + 1 : -1;
    if (line <= 0) line = -1;
    errors_->push_back(FieldError{path, message, line});
  }

  /// Requires a mapping; reports keys outside `known` as unknown fields.
  bool Map(const YAML::Node& node, const std::string& path, const std::vector<std::string>& known) {
    if (!node.IsMap()) {
      Error(path, node, "must be a mapping");
      return false;
    }
    for (const auto& kv : node) {
      std::string key = kv.first.Scalar();
      bool found = false;
      for (const auto& k : known) found = found || k == key;
      if (!found) {
        Error(Child(path, key), kv.first,
              "unknown field (known fields: " + Join(known, ", ") + ")");
      }
    }
    return true;
  }

  static std::string Child(const std::string& path, const std::string& key) {
    return path.empty() ? key : path + "." + key;
  }

  /// Converts a scalar to the field's kind and checks its rule.
  std::optional<ParamValue> Value(const FieldDef& f, const YAML::Node& node,
                                  const std::string& path) {
    if (!node.IsScalar()) {
      Error(path, node, "must be a scalar");
      return std::nullopt;
    }
    const std::string& text = node.Scalar();
    switch (f.kind) {
      case Kind::kEnum: {
        for (const auto& e : f.enums) {
          if (text == e) return ParamValue(text);
        }
        Error(path, node, "must be one of: " + Join(f.enums, ", ") + " (got '" + text + "')");
        return std::nullopt;
      }
      case Kind::kInt: {
        int64_t v = 0;
        try {
          size_t pos = 0;
          v = std::stoll(text, &pos, 10);
          if (pos != text.size()) throw std::invalid_argument(text);
        } catch (...) {
          Error(path, node, "must be an integer (got '" + text + "')");
          return std::nullopt;
        }
        if (!CheckRange(f, static_cast<double>(v), node, path)) return std::nullopt;
        return ParamValue(v);
      }
      case Kind::kFloat: {
        double v = 0;
        try {
          v = node.as<double>();
        } catch (...) {
          Error(path, node, "must be a number (got '" + text + "')");
          return std::nullopt;
        }
        if (!std::isfinite(v)) {
          Error(path, node, "must be a finite number");
          return std::nullopt;
        }
        if (!CheckRange(f, v, node, path)) return std::nullopt;
        return ParamValue(v);
      }
    }
    return std::nullopt;
  }

  /// An integer scalar in [lo, hi]; else the error "must be an integer from <range>".
  std::optional<int64_t> IntInRange(const YAML::Node& node, const std::string& path, int64_t lo,
                                    int64_t hi, const std::string& range) {
    const auto v = ScalarInt(node);
    if (v && *v >= lo && *v <= hi) return v;
    Error(path, node, "must be an integer from " + range);
    return std::nullopt;
  }

  std::vector<FieldError>* errors() { return errors_; }

 private:
  bool CheckRange(const FieldDef& f, double v, const YAML::Node& node, const std::string& path) {
    std::string problem = RangeProblem(f, v);
    if (!problem.empty()) Error(path, node, problem);
    return problem.empty();
  }

  std::vector<FieldError>* errors_;
};

void ParseSection(Checker& c, const YAML::Node& node, const std::string& section,
                  const std::string& path, TrialConfig* config,
                  const std::vector<std::string>& required,
                  const std::vector<std::string>& other_keys = {}) {
  std::vector<std::string> known = other_keys;  // parsed by the caller
  for (const auto& f : Fields()) {
    if (section == f.section) known.push_back(f.name);
  }
  if (!c.Map(node, path, known)) return;
  for (const auto& r : required) {
    if (!node[r]) c.Error(Checker::Child(path, r), node, "required field is missing");
  }
  for (const auto& kv : node) {
    const FieldDef* f = FindField(section, kv.first.Scalar());
    if (f == nullptr) continue;  // reported as unknown by Map
    auto v = c.Value(*f, kv.second, Checker::Child(path, f->name));
    if (v) f->set(*config, *v);
  }
}

void ParseStringMap(Checker& c, const YAML::Node& node, const std::string& path,
                    std::map<std::string, std::string>* out) {
  if (!node.IsMap()) {
    c.Error(path, node, "must be a mapping of strings");
    return;
  }
  for (const auto& kv : node) {
    if (!kv.second.IsScalar()) {
      c.Error(Checker::Child(path, kv.first.Scalar()), kv.second, "must be a string");
      continue;
    }
    (*out)[kv.first.Scalar()] = kv.second.Scalar();
  }
}

void ParseMetadata(Checker& c, const YAML::Node& node, JobMetadata* md) {
  if (!c.Map(node, "metadata", {"name", "namespace", "uid", "labels", "annotations"})) return;
  if (!node["name"]) {
    c.Error("metadata.name", node, "required field is missing");
  } else if (!node["name"].IsScalar() || !IsDnsSubdomain(node["name"].Scalar())) {
    c.Error("metadata.name", node["name"],
            "must be a DNS-1123 subdomain: lowercase letters, digits, '-' and '.', starting and "
            "ending with a letter or digit");
  } else if (node["name"].Scalar().size() > kMaxJobNameLength) {
    c.Error("metadata.name", node["name"],
            "must be at most " + std::to_string(kMaxJobNameLength) +
                " characters: trial names (<name>-<searched values>) must be DNS-1123 labels of "
                "at most " +
                std::to_string(kMaxTrialNameLength));
  } else {
    md->name = node["name"].Scalar();
  }
  if (node["namespace"]) {
    if (!node["namespace"].IsScalar() || !IsDnsLabel(node["namespace"].Scalar())) {
      c.Error("metadata.namespace", node["namespace"],
              "must be a DNS-1123 label: lowercase letters, digits and '-', at most 63 characters");
    } else {
      md->namespace_ = node["namespace"].Scalar();
    }
  }
  if (node["uid"]) {
    if (!node["uid"].IsScalar() || !rules::UidProblem(node["uid"].Scalar()).empty()) {
      c.Error("metadata.uid", node["uid"], rules::UidProblem(node["uid"].Scalar()));
    } else {
      md->uid = node["uid"].Scalar();
    }
  }
  if (node["labels"]) ParseStringMap(c, node["labels"], "metadata.labels", &md->labels);
  if (node["annotations"]) {
    ParseStringMap(c, node["annotations"], "metadata.annotations", &md->annotations);
  }
}

/// A path field `n` (at `path`): a non-empty scalar, kept as written and resolved against the
/// manifest's directory, normalised. False, with the error, otherwise; the caller reports a
/// missing field itself.
bool ParsePath(Checker& c, const YAML::Node& n, const std::string& path,
               const std::string& base_dir, std::string* as_written, std::string* resolved) {
  if (!n.IsScalar() || n.Scalar().empty()) {
    c.Error(path, n, "must be a non-empty path");
    return false;
  }
  *as_written = n.Scalar();
  fs::path r(*as_written);
  if (r.is_relative()) r = fs::path(base_dir) / r;
  *resolved = r.lexically_normal().string();
  return true;
}

/// spec.model.path: required by (and only allowed with) family torchscript.
void ParseModelPath(Checker& c, const YAML::Node& node, const std::string& base_dir, ModelSpec* m) {
  if (!node.IsMap()) return;  // reported by ParseSection
  const std::string p = "spec.model.path";
  if (!node["path"]) {
    if (m->family == ModelFamily::kTorchScript) {
      c.Error(p, node, "required field is missing (family torchscript loads its module from it)");
    }
    return;
  }
  if (m->family != ModelFamily::kTorchScript) {
    c.Error(p, node["path"], "only family torchscript reads a model file");
    return;
  }
  ParsePath(c, node["path"], p, base_dir, &m->path, &m->resolved_path);
}

/// A field of one of the manifest's closed sets (manifest_enums.h): the value scalar `n` names;
/// nullopt after an error naming the choices.
template <typename E>
std::optional<E> EnumField(Checker& c, const YAML::Node& n, const std::string& path) {
  const std::string text = n.IsScalar() ? n.Scalar() : "";
  std::optional<E> value = ParseName<E>(text);
  if (!value) c.Error(path, n, NameProblem<E>(text));
  return value;
}

/// spec.model.init: {format: safetensors, path}, only for family gpt2.
void ParseModelInit(Checker& c, const YAML::Node& node, const std::string& base_dir, ModelSpec* m) {
  if (!node.IsMap() || !node["init"]) return;
  const std::string p = "spec.model.init";
  const YAML::Node& n = node["init"];
  if (!c.Map(n, p, {"format", "path"})) return;
  if (m->family != ModelFamily::kGpt2) {
    c.Error(p, n,
            std::string("only family gpt2 starts from a checkpoint (got family ") +
                NameOf(m->family) + ")");
    return;
  }
  if (n["format"] && !EnumField<InitFormat>(c, n["format"], p + ".format")) return;
  if (!n["path"]) {
    c.Error(p + ".path", n, "required field is missing");
    return;
  }
  ModelInit init;
  if (ParsePath(c, n["path"], p + ".path", base_dir, &init.path, &init.resolved_path)) {
    m->init = std::move(init);
  }
}

void ParseDataset(Checker& c, const YAML::Node& node, const std::string& base_dir,
                  DatasetSpec* ds) {
  const std::string p = "spec.dataset";
  if (!c.Map(node, p, {"format", "path", "validationFraction", "evalSequences", "imageShape"})) {
    return;
  }
  if (node["format"]) {
    if (auto format = EnumField<DatasetFormat>(c, node["format"], p + ".format")) {
      ds->format = *format;
    }
  }
  if (node["imageShape"]) {
    const auto& n = node["imageShape"];
    std::vector<int64_t> shape;
    for (size_t i = 0; n.IsSequence() && i < n.size(); ++i) {
      shape.push_back(ScalarInt(n[i]).value_or(0));
    }
    const std::string problem = rules::ImageShapeProblem(shape);
    if (!problem.empty()) {
      c.Error(p + ".imageShape", n, problem);
    } else if (ds->format != DatasetFormat::kImagesU8) {
      c.Error(p + ".imageShape", n, "only format images-u8 has images");
    } else {
      ds->image_shape = shape;
    }
  }
  if (!node["path"]) {
    c.Error(p + ".path", node, "required field is missing");
  } else {
    ParsePath(c, node["path"], p + ".path", base_dir, &ds->path, &ds->resolved_path);
  }
  if (node["validationFraction"]) {
    const auto& n = node["validationFraction"];
    double v = -1;
    try {
      v = n.as<double>();
    } catch (...) {
    }
    if (std::string problem = rules::ValidationFractionProblem(v); !problem.empty()) {
      c.Error(p + ".validationFraction", n, problem);
    } else {
      ds->validation_fraction = v;
    }
  }
  if (node["evalSequences"]) {
    const auto& n = node["evalSequences"];
    const int64_t v = ScalarInt(n).value_or(0);
    if (std::string problem = rules::EvalSequencesProblem(v); !problem.empty()) {
      c.Error(p + ".evalSequences", n, problem);
    } else {
      ds->eval_sequences = v;
    }
  }
}

/// A byte quantity field (512Mi, 4Gi, 1e9): below 2^63 and by `rule`; nullopt after an error.
std::optional<int64_t> ByteField(Checker& c, const YAML::Node& n, const std::string& path,
                                 const std::function<std::string(int64_t)>& rule) {
  auto bytes = n.IsScalar() ? ParseByteQuantity(n.Scalar())
                            : StatusOr<int64_t>(InvalidArgumentError("not a scalar"));
  if (!bytes.ok()) {
    c.Error(path, n, "must be a byte quantity such as 512Mi or 4Gi: " + bytes.status().message());
    return std::nullopt;
  }
  if (std::string problem = rule(*bytes); !problem.empty()) {
    c.Error(path, n, problem);
    return std::nullopt;
  }
  return *bytes;
}

/// The child `key` of a mapping, or an undefined node (never throws on a missing parent).
YAML::Node ChildOf(const YAML::Node& node, const std::string& key) {
  return node.IsMap() && node[key] ? node[key] : YAML::Node(YAML::NodeType::Undefined);
}

/// The agent container of spec.agents.template.spec: its image, no command (the controller runs
/// hydra-agent), and its GPUs (resources.limits["nvidia.com/gpu"]).
void ParseAgentContainer(Checker& c, const YAML::Node& container, const std::string& p,
                         AgentsSpec* a) {
  const YAML::Node image = ChildOf(container, "image");
  if (!image.IsScalar() || image.Scalar().empty()) {
    c.Error(p + ".image", image.IsDefined() ? image : container,
            "required: the hydra image the agent runs from");
  }
  if (container["command"]) {
    c.Error(p + ".command", container["command"],
            "is set by the controller (hydra-agent); extra agent flags go in args");
  }
  if (const YAML::Node args = ChildOf(container, "args"); args.IsSequence()) {
    for (size_t i = 0; i < args.size(); ++i) {
      const std::string flag = args[i].IsScalar() ? args[i].Scalar() : "";
      for (const char* owned : kControllerAgentFlags) {
        const std::string o = owned;
        if (flag == o || flag.rfind(o + "=", 0) == 0) {
          c.Error(p + ".args[" + std::to_string(i) + "]", args[i],
                  o + " is set by the controller (where the agent listens, its roots, the job it "
                      "serves and its TLS)");
        }
      }
    }
  }
  const YAML::Node gpus =
      ChildOf(ChildOf(ChildOf(container, "resources"), "limits"), "nvidia.com/gpu");
  if (!gpus.IsDefined()) return;
  const auto v = ScalarInt(gpus);
  if (!v || *v < 0 || *v > 64) {
    c.Error(p + ".resources.limits.nvidia.com/gpu", gpus, "must be a whole number of GPUs, 0..64");
  } else {
    a->gpus_per_agent = *v;
  }
}

/// spec.agents.template: a pod template (metadata labels and annotations, a PodSpec) whose agent
/// container the controller completes; what would bypass the scheduler is refused.
void ParseAgentTemplate(Checker& c, const YAML::Node& t, AgentsSpec* a) {
  const std::string p = "spec.agents.template";
  if (!c.Map(t, p, {"metadata", "spec"})) return;
  if (const YAML::Node md = t["metadata"];
      md && c.Map(md, p + ".metadata", {"labels", "annotations"})) {
    std::map<std::string, std::string> checked;
    for (const char* key : {"labels", "annotations"}) {
      if (md[key]) ParseStringMap(c, md[key], p + ".metadata." + key, &checked);
    }
  }
  const YAML::Node spec = t["spec"];
  if (!spec || !spec.IsMap()) {
    c.Error(p + ".spec", spec ? spec : t, "required: a PodSpec (containers, nodeSelector, ...)");
    return;
  }
  if (spec["nodeName"]) {
    c.Error(p + ".spec.nodeName", spec["nodeName"],
            "must not be set: the scheduler (and Kueue) place agent pods; use nodeSelector, "
            "affinity or tolerations");
  }
  const YAML::Node cs = spec["containers"];
  if (!cs || !cs.IsSequence() || cs.size() == 0) {
    c.Error(p + ".spec.containers", cs ? cs : spec, "must be a non-empty list of containers");
    return;
  }
  int agent = -1;
  for (size_t i = 0; i < cs.size(); ++i) {
    const YAML::Node name = ChildOf(cs[i], "name");
    if (!name.IsScalar() || name.Scalar().empty()) {
      c.Error(p + ".spec.containers[" + std::to_string(i) + "].name", cs[i],
              "required field is missing");
    } else if (name.Scalar() == "agent") {
      agent = static_cast<int>(i);
    }
  }
  if (agent < 0 && cs.size() == 1) agent = 0;
  if (agent < 0) {
    c.Error(p + ".spec.containers", cs,
            "has no container named agent (the one that runs hydra-agent; with one container, "
            "that one)");
    return;
  }
  const YAML::Node name = ChildOf(cs[agent], "name");
  if (name.IsScalar()) a->container = name.Scalar();
  ParseAgentContainer(c, cs[agent], p + ".spec.containers[" + std::to_string(agent) + "]", a);
}

/// spec.agents: the job's own agent pods (Kubernetes; `hydra run` ignores it).
void ParseAgents(Checker& c, const YAML::Node& node, AgentsSpec* a) {
  const std::string p = "spec.agents";
  if (!c.Map(node, p, {"minAgents", "maxAgents", "template"})) return;
  if (!node["maxAgents"]) {
    c.Error(p + ".maxAgents", node, "required field is missing");
  } else if (const auto v = ScalarInt(node["maxAgents"]); !v || *v < 1 || *v > kMaxAgentsPerJob) {
    c.Error(p + ".maxAgents", node["maxAgents"],
            "must be an integer from 1 to " + std::to_string(kMaxAgentsPerJob));
  } else {
    a->max_agents = *v;
  }
  if (node["minAgents"]) {
    const auto v = ScalarInt(node["minAgents"]);
    if (!v || *v < 0 || *v > kMaxAgentsPerJob) {
      c.Error(p + ".minAgents", node["minAgents"],
              "must be an integer from 0 to " + std::to_string(kMaxAgentsPerJob));
    } else if (*v > a->max_agents) {
      c.Error(p + ".minAgents", node["minAgents"], "must be <= maxAgents");
    } else {
      a->min_agents = *v;
    }
  }
  if (!node["template"]) {
    c.Error(p + ".template", node, "required field is missing");
  } else {
    ParseAgentTemplate(c, node["template"], a);
  }
}

void ParseResources(Checker& c, const YAML::Node& node, ResourcesSpec* res) {
  const std::string p = "spec.resources";
  if (!c.Map(node, p, {"deviceMemoryBudget", "hostMemoryBudget", "offload", "shardBoundaries"})) {
    return;
  }
  if (node["hostMemoryBudget"]) {
    res->host_memory_budget = ByteField(c, node["hostMemoryBudget"], p + ".hostMemoryBudget",
                                        rules::HostMemoryBudgetProblem);
  }
  if (node["deviceMemoryBudget"]) {
    res->device_memory_budget = ByteField(c, node["deviceMemoryBudget"], p + ".deviceMemoryBudget",
                                          rules::DeviceMemoryBudgetProblem);
  }
  if (node["offload"]) {
    if (auto offload = EnumField<OffloadTier>(c, node["offload"], p + ".offload")) {
      res->offload = *offload;
    }
  }
  if (node["shardBoundaries"]) {
    const auto& n = node["shardBoundaries"];
    if (!n.IsSequence()) {
      c.Error(p + ".shardBoundaries", n, "must be a list of layer indices");
      return;
    }
    int64_t prev = 0;
    for (size_t i = 0; i < n.size(); ++i) {
      const std::string path = p + ".shardBoundaries[" + std::to_string(i) + "]";
      const auto v = ScalarInt(n[i]);
      if (!v) {
        c.Error(path, n[i], "must be an integer");
        continue;
      }
      if (std::string problem = rules::ShardBoundaryProblem(*v, prev); !problem.empty()) {
        c.Error(path, n[i], problem);
        continue;
      }
      prev = *v;
      res->shard_boundaries.push_back(*v);
    }
  }
}

void ParseGrid(Checker& c, const YAML::Node& node, std::vector<GridAxis>* grid) {
  const std::string p = "spec.search.grid";
  if (!node.IsMap()) {
    c.Error(p, node, "must be a mapping from field name to a list of values");
    return;
  }
  for (const auto& kv : node) {
    const std::string key = kv.first.Scalar();
    const std::string path = p + "." + key;
    const FieldDef* f = FindField("", key);
    if (f == nullptr) {
      c.Error(path, kv.first,
              "unknown field: the grid may search any spec.model or spec.training field (" +
                  Join(SearchableFields(), ", ") + ")");
      continue;
    }
    if (!kv.second.IsSequence() || kv.second.size() == 0) {
      c.Error(path, kv.second, "must be a non-empty list of values");
      continue;
    }
    GridAxis axis{key, {}};
    for (size_t i = 0; i < kv.second.size(); ++i) {
      std::string item_path = path + "[" + std::to_string(i) + "]";
      auto v = c.Value(*f, kv.second[i], item_path);
      if (!v) continue;
      bool dup = false;
      for (const auto& prev : axis.values) dup = dup || prev == *v;
      if (dup) {
        c.Error(item_path, kv.second[i], "duplicate value " + FormatParamValue(*v));
        continue;
      }
      axis.values.push_back(*v);
    }
    grid->push_back(std::move(axis));
  }
  // A canonical axis order (the field table's), not the manifest's: Kubernetes stores objects
  // with their keys sorted, so only a fixed order gives `hydra run` and the controller the
  // same trial names and the same expansion order.
  std::stable_sort(grid->begin(), grid->end(), [](const GridAxis& a, const GridAxis& b) {
    return FieldRank(a.field) < FieldRank(b.field);
  });
}

/// One dimension of spec.search.random.space: `{<distribution>: <values>}`.
std::optional<RandomAxis> ParseRandomAxis(Checker& c, const FieldDef& f, const YAML::Node& node,
                                          const std::string& path) {
  static const std::vector<std::pair<std::string, Distribution>> kNames = {
      {"uniform", Distribution::kUniform},
      {"logUniform", Distribution::kLogUniform},
      {"intUniform", Distribution::kIntUniform},
      {"choice", Distribution::kChoice}};
  if (!node.IsMap() || node.size() != 1) {
    c.Error(path, node,
            "must be a mapping of one distribution: {uniform: [low, high]}, {logUniform: [low, "
            "high]}, {intUniform: [low, high]} or {choice: [values]}");
    return std::nullopt;
  }
  const std::string name = node.begin()->first.Scalar();
  const YAML::Node values = node.begin()->second;
  const std::string vpath = path + "." + name;
  RandomAxis axis;
  axis.field = f.name;
  auto known = std::find_if(kNames.begin(), kNames.end(), [&](auto& n) { return n.first == name; });
  if (known == kNames.end()) {
    c.Error(vpath, node.begin()->first,
            "unknown distribution (known: uniform, logUniform, intUniform, choice)");
    return std::nullopt;
  }
  axis.distribution = known->second;
  if (!values.IsSequence() || values.size() == 0) {
    c.Error(vpath, values, "must be a non-empty list");
    return std::nullopt;
  }
  if (axis.distribution == Distribution::kChoice) {
    for (size_t i = 0; i < values.size(); ++i) {
      auto v = c.Value(f, values[i], vpath + "[" + std::to_string(i) + "]");
      if (v) axis.choices.push_back(*v);
    }
    return axis.choices.size() == values.size() ? std::optional<RandomAxis>(axis) : std::nullopt;
  }
  const Kind wanted = axis.distribution == Distribution::kIntUniform ? Kind::kInt : Kind::kFloat;
  if (f.kind != wanted) {
    c.Error(vpath, node.begin()->first,
            std::string(f.name) + " is " +
                (f.kind == Kind::kInt     ? "an integer field: use intUniform or choice"
                 : f.kind == Kind::kFloat ? "a float field: use uniform, logUniform or choice"
                                          : "an enum field: use choice"));
    return std::nullopt;
  }
  if (values.size() != 2) {
    c.Error(vpath, values, "must be [low, high]");
    return std::nullopt;
  }
  auto low = c.Value(f, values[0], vpath + "[0]");
  auto high = c.Value(f, values[1], vpath + "[1]");
  if (!low || !high) return std::nullopt;
  axis.low = *low;
  axis.high = *high;
  const bool ordered = wanted == Kind::kInt ? std::get<int64_t>(*low) <= std::get<int64_t>(*high)
                                            : std::get<double>(*low) <= std::get<double>(*high);
  if (!ordered) {
    c.Error(vpath, values, "low must be <= high");
    return std::nullopt;
  }
  if (axis.distribution == Distribution::kLogUniform && !(std::get<double>(*low) > 0)) {
    c.Error(vpath + "[0]", values[0], "logUniform needs low > 0");
    return std::nullopt;
  }
  return axis;
}

void ParseRandom(Checker& c, const YAML::Node& node, std::optional<RandomSearchSpec>* out) {
  const std::string p = "spec.search.random";
  if (!c.Map(node, p, {"trials", "seed", "space"})) return;
  RandomSearchSpec random;
  const YAML::Node trials = node["trials"], seed = node["seed"], space = node["space"];
  if (!trials) {
    c.Error(p + ".trials", node, "required field is missing");
  } else if (auto n = c.IntInRange(trials, p + ".trials", 1, kMaxTrialsPerJob,
                                   "1 to " + std::to_string(kMaxTrialsPerJob))) {
    random.trials = *n;
  }
  if (seed) {
    if (auto v = c.IntInRange(seed, p + ".seed", 0, 9200000000000000000, "0 to 9.2e18")) {
      random.seed = *v;
    }
  }
  if (!space || !space.IsMap() || space.size() == 0) {
    c.Error(p + ".space", space ? space : node,
            "must be a non-empty mapping from field name to a distribution");
  } else {
    for (const auto& kv : space) {
      const std::string key = kv.first.Scalar();
      const FieldDef* f = FindField("", key);
      if (f == nullptr) {
        c.Error(p + ".space." + key, kv.first,
                "unknown field: the search may draw any spec.model or spec.training field (" +
                    Join(SearchableFields(), ", ") + ")");
        continue;
      }
      if (auto axis = ParseRandomAxis(c, *f, kv.second, p + ".space." + key)) {
        random.space.push_back(std::move(*axis));
      }
    }
  }
  std::stable_sort(random.space.begin(), random.space.end(),
                   [](const RandomAxis& a, const RandomAxis& b) {
                     return FieldRank(a.field) < FieldRank(b.field);
                   });
  *out = std::move(random);
}

void ParseEarlyStopping(Checker& c, const YAML::Node& node, EarlyStoppingSpec* out) {
  const std::string p = "spec.search.earlyStopping";
  if (!c.Map(node, p, {"algorithm", "metric", "minSteps", "reductionFactor"})) return;
  if (const auto& a = node["algorithm"]; a) {
    const auto algorithm = a.IsScalar() ? ParseEarlyStoppingAlgorithm(a.Scalar()) : std::nullopt;
    if (!algorithm) {
      c.Error(p + ".algorithm", a, "must be one of: asha, median, none");
    } else {
      out->algorithm = *algorithm;
    }
  }
  if (const auto& m = node["metric"]; m && (!m.IsScalar() || m.Scalar() != "validationLoss")) {
    c.Error(p + ".metric", m, "must be validationLoss (lower is better)");
  }
  if (const auto& m = node["minSteps"]; m) {
    if (auto v = c.IntInRange(m, p + ".minSteps", 1, 1000000000000, "1 to 1e12")) {
      out->min_steps = *v;
    }
  } else if (out->algorithm != EarlyStoppingAlgorithm::kNone) {
    c.Error(p + ".minSteps", node,
            std::string("required with algorithm ") + EarlyStoppingAlgorithmName(out->algorithm) +
                ": the step of the first comparison");
  }
  if (const auto& r = node["reductionFactor"]; r) {
    if (auto v = c.IntInRange(r, p + ".reductionFactor", 2, 256, "2 to 256")) {
      out->reduction_factor = *v;
    }
  }
}

void ParseSearch(Checker& c, const YAML::Node& node, MultiModelJobSpec* spec) {
  if (!c.Map(node, "spec.search", {"grid", "random", "earlyStopping"})) return;
  if (node["grid"] && node["random"]) {
    c.Error("spec.search.random", node["random"],
            "grid and random are exclusive: search one way or the other");
    return;
  }
  if (node["grid"]) ParseGrid(c, node["grid"], &spec->grid);
  if (node["random"]) ParseRandom(c, node["random"], &spec->random);
  if (node["earlyStopping"]) ParseEarlyStopping(c, node["earlyStopping"], &spec->early_stopping);
}

/// Cross-field rules of one trial's configuration; `where` prefixes the messages.
void CheckTrialRules(const TrialConfig& t, const DatasetSpec& ds, const ResourcesSpec& res,
                     const std::string& where, std::vector<FieldError>* errors) {
  auto err = [&](const std::string& path, const std::string& msg) {
    errors->push_back(FieldError{path, where + msg, -1});
  };
  if (t.model.family == ModelFamily::kGpt2 && t.model.n_embd % t.model.n_head != 0) {
    err("spec.model.nHead", "nHead (" + std::to_string(t.model.n_head) + ") must divide nEmbd (" +
                                std::to_string(t.model.n_embd) + ")");
  }
  if (t.training.batch_size % t.training.gradient_accumulation_steps != 0) {
    err("spec.training.gradientAccumulationSteps",
        "gradientAccumulationSteps (" + std::to_string(t.training.gradient_accumulation_steps) +
            ") must divide batchSize (" + std::to_string(t.training.batch_size) + ")");
  }
  const bool image_family =
      t.model.family == ModelFamily::kMlp || t.model.family == ModelFamily::kResNet;
  if (image_family != (ds.format == DatasetFormat::kImagesU8)) {
    err("spec.model.family",
        image_family ? std::string("family ") + NameOf(t.model.family) +
                           " classifies images: spec.dataset.format must be images-u8"
                     : std::string("format images-u8 needs an image family (mlp, resnet), not ") +
                           NameOf(t.model.family));
  }
  if (ds.format == DatasetFormat::kText && t.model.vocab_size < 256) {
    err("spec.model.vocabSize", "must be >= 256 for the text format (one token per byte), got " +
                                    std::to_string(t.model.vocab_size));
  }
  if (ds.format == DatasetFormat::kTokensU16 && t.model.vocab_size > 65536) {
    err("spec.model.vocabSize", "must be <= 65536 for the tokens-u16 format");
  }
  if (t.model.family == ModelFamily::kGpt2 && !res.shard_boundaries.empty() &&
      res.shard_boundaries.back() > t.model.n_layer + 1) {
    err("spec.resources.shardBoundaries",
        "layer index " + std::to_string(res.shard_boundaries.back()) + " is past the last layer (" +
            std::to_string(t.model.n_layer + 1) + ": the head) of a model with nLayer " +
            std::to_string(t.model.n_layer));
  }
  if (t.training.warmup_steps > t.training.steps) {
    err("spec.training.warmupSteps", "must be <= steps (" + std::to_string(t.training.steps) + ")");
  }
}

std::string TrialSuffix(const std::vector<Hyperparameter>& hps) {
  std::vector<std::string> parts;
  for (const auto& hp : hps) {
    const FieldDef* f = FindField("", hp.field);
    std::string value;
    if (std::holds_alternative<double>(hp.value)) {
      double v = std::get<double>(hp.value);
      char buf[64];
      double a = std::fabs(v);
      if (a != 0 && (a < 0.01 || a >= 1e5)) {
        // Compact scientific notation: 3e-4, 2.5e-5, 1e6.
        for (int prec = 0; prec < 17; ++prec) {
          std::snprintf(buf, sizeof(buf), "%.*e", prec, v);
          if (std::strtod(buf, nullptr) == v) break;
        }
        std::string s = buf;
        auto e = s.find('e');
        std::string mant = s.substr(0, e), exp = s.substr(e + 1);
        bool neg = exp[0] == '-';
        exp = exp.substr(1);
        while (exp.size() > 1 && exp[0] == '0') exp = exp.substr(1);
        value = mant + "e" + (neg ? "-" : "") + exp;
      } else {
        value = FormatNumber(v);
      }
    } else {
      value = FormatParamValue(hp.value);
    }
    for (char& ch : value) {
      if (ch == '.') ch = 'p';
      if (ch == '+') ch = 'p';
      ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    }
    parts.push_back(std::string(f ? f->abbrev : hp.field) + value);
  }
  return Join(parts, "-");
}

}  // namespace

bool IsDnsSubdomain(const std::string& s) {
  if (s.empty() || s.size() > 253) return false;
  for (char ch : s) {
    if (!(std::islower(static_cast<unsigned char>(ch)) ||
          std::isdigit(static_cast<unsigned char>(ch)) || ch == '-' || ch == '.')) {
      return false;
    }
  }
  auto alnum = [](char ch) {
    return std::islower(static_cast<unsigned char>(ch)) ||
           std::isdigit(static_cast<unsigned char>(ch));
  };
  return alnum(s.front()) && alnum(s.back());
}

bool IsDnsLabel(const std::string& s) {
  return s.size() <= kMaxTrialNameLength && s.find('.') == std::string::npos && IsDnsSubdomain(s);
}

std::string TrialKey(const Trial& t) {
  if (t.namespace_.empty() && t.job.empty() && t.job_uid.empty()) return t.name;
  return t.namespace_ + "/" + t.job + "/" + t.job_uid + "/" + t.name;
}

std::string TrialDisplayName(const Trial& t) {
  std::string out;
  for (const std::string* part : {&t.namespace_, &t.job, &t.name}) {
    if (!part->empty()) out += (out.empty() ? "" : "/") + *part;
  }
  return out;
}

std::string FieldError::ToString() const {
  std::string out = path + ": " + message;
  if (line > 0) out += " (line " + std::to_string(line) + ")";
  return out;
}

std::string FormatParamValue(const ParamValue& value) {
  if (std::holds_alternative<int64_t>(value)) return std::to_string(std::get<int64_t>(value));
  if (std::holds_alternative<double>(value)) return FormatNumber(std::get<double>(value));
  return std::get<std::string>(value);
}

bool IsImageTask(const Trial& trial) { return trial.dataset.format == DatasetFormat::kImagesU8; }

int64_t SampleWindow(const Trial& trial) {
  if (!IsImageTask(trial)) return trial.model.context_length + 1;
  int64_t pixels = 1;
  for (int64_t d : trial.dataset.image_shape) pixels *= d;
  return 1 + pixels;
}

int64_t TokensPerSample(const Trial& trial) {
  return IsImageTask(trial) ? 1 : trial.model.context_length;
}

const char* ThroughputUnit(const Trial& trial) {
  return IsImageTask(trial) ? "images/s" : "tokens/s";
}

double LearningRateAt(const TrainingSpec& t, int64_t step) {
  if (step < t.warmup_steps) {
    return t.learning_rate * static_cast<double>(step + 1) / static_cast<double>(t.warmup_steps);
  }
  if (t.lr_schedule != LrSchedule::kCosine) return t.learning_rate;
  const double span = static_cast<double>(std::max<int64_t>(1, t.steps - 1 - t.warmup_steps));
  const double progress = std::min(1.0, static_cast<double>(step - t.warmup_steps) / span);
  const double min_lr = 0.1 * t.learning_rate;
  return min_lr + 0.5 * (1.0 + std::cos(M_PI * progress)) * (t.learning_rate - min_lr);
}

std::vector<FieldRule> SearchableFieldRules() {
  std::vector<FieldRule> out;
  for (const auto& f : Fields()) {
    FieldRule r;
    r.section = f.section;
    r.name = f.name;
    r.kind = f.kind == Kind::kInt     ? FieldRule::Kind::kInt
             : f.kind == Kind::kFloat ? FieldRule::Kind::kFloat
                                      : FieldRule::Kind::kEnum;
    r.min = f.min;
    r.min_exclusive = f.min_exclusive;
    r.max = f.max;
    r.enums = f.enums;
    out.push_back(std::move(r));
  }
  return out;
}

std::vector<std::string> SearchableFields() {
  std::vector<std::string> names;
  for (const auto& f : Fields()) names.push_back(f.name);
  return names;
}

namespace {

/// spec.maxRestarts, spec.suspend and spec.checkpointRetention, where given.
void ParseJobScalars(Checker& c, const YAML::Node& spec, MultiModelJobSpec* out) {
  if (const auto& r = spec["maxRestarts"]; r) {
    int64_t v = -1;
    try {
      v = r.as<int64_t>();
    } catch (...) {
    }
    if (v < 0 || v > 1000) {
      c.Error("spec.maxRestarts", r, "must be an integer from 0 to 1000");
    } else {
      out->max_restarts = v;
    }
  }
  if (const auto& r = spec["suspend"]; r) {
    if (!r.IsScalar() || (r.Scalar() != "true" && r.Scalar() != "false")) {
      c.Error("spec.suspend", r, "must be true or false");
    } else {
      out->suspend = r.Scalar() == "true";
    }
  }
  if (const auto& r = spec["checkpointRetention"]; r) {
    if (!r.IsScalar() || (r.Scalar() != "Retain" && r.Scalar() != "Delete")) {
      c.Error("spec.checkpointRetention", r, "must be one of: Retain, Delete");
    } else {
      out->checkpoint_retention = r.Scalar() == "Delete"
                                      ? MultiModelJobSpec::CheckpointRetention::kDelete
                                      : MultiModelJobSpec::CheckpointRetention::kRetain;
    }
  }
}

/// spec: the model and training (the trials' base), the dataset, and the optional sections.
void ParseSpec(Checker& c, const YAML::Node& spec, const std::string& base_dir,
               MultiModelJobSpec* out) {
  TrialConfig base;
  if (!spec["model"]) {
    c.Error("spec.model", spec, "required field is missing");
  } else {
    ParseSection(c, spec["model"], "model", "spec.model", &base, {"family"}, {"path", "init"});
    ParseModelPath(c, spec["model"], base_dir, &base.model);
    ParseModelInit(c, spec["model"], base_dir, &base.model);
  }
  if (!spec["training"]) {
    c.Error("spec.training", spec, "required field is missing");
  } else {
    ParseSection(c, spec["training"], "training", "spec.training", &base, {"steps"});
  }
  out->model = base.model;
  out->training = base.training;
  if (!spec["dataset"]) {
    c.Error("spec.dataset", spec, "required field is missing");
  } else {
    ParseDataset(c, spec["dataset"], base_dir, &out->dataset);
  }
  if (spec["search"]) ParseSearch(c, spec["search"], out);
  if (spec["resources"]) ParseResources(c, spec["resources"], &out->resources);
  if (spec["agents"]) {
    AgentsSpec agents;
    ParseAgents(c, spec["agents"], &agents);
    out->agents = agents;
  }
  ParseJobScalars(c, spec, out);
}

/// The document: apiVersion, kind, metadata and spec.
void ParseRoot(Checker& c, const YAML::Node& root, const std::string& base_dir,
               MultiModelJob* job) {
  if (!c.Map(root, "", {"apiVersion", "kind", "metadata", "spec"})) return;
  if (!root["apiVersion"] || !root["apiVersion"].IsScalar() ||
      root["apiVersion"].Scalar() != kApiVersion) {
    c.Error("apiVersion", root["apiVersion"] ? root["apiVersion"] : root,
            std::string("must be ") + kApiVersion);
  }
  if (!root["kind"] || !root["kind"].IsScalar() || root["kind"].Scalar() != kKind) {
    c.Error("kind", root["kind"] ? root["kind"] : root, std::string("must be ") + kKind);
  }
  if (!root["metadata"]) {
    c.Error("metadata", root, "required field is missing");
  } else {
    ParseMetadata(c, root["metadata"], &job->metadata);
  }
  const YAML::Node spec = root["spec"];
  if (!spec) {
    c.Error("spec", root, "required field is missing");
  } else if (c.Map(spec, "spec",
                   {"model", "dataset", "search", "training", "resources", "checkpointRetention",
                    "maxRestarts", "suspend", "agents"})) {
    ParseSpec(c, spec, base_dir, &job->spec);
  }
}

}  // namespace

StatusOr<MultiModelJob> ParseJobYaml(const std::string& yaml_text, const std::string& base_dir,
                                     std::vector<FieldError>* errors_out) {
  std::vector<FieldError> errors;
  Checker c(&errors);
  MultiModelJob job;
  const YamlDocument doc = LoadOneYamlDocument(yaml_text);
  if (!doc.error.empty()) {
    errors.push_back(FieldError{"", doc.error, doc.line});
  } else {
    ParseRoot(c, doc.root, base_dir, &job);
  }
  if (errors.empty()) ExpandInto(job, &errors);
  if (!errors.empty()) {
    std::string msg = "invalid MultiModelJob manifest:";
    for (const auto& e : errors) msg += "\n  " + e.ToString();
    if (errors_out) errors_out->insert(errors_out->end(), errors.begin(), errors.end());
    return InvalidArgumentError(msg);
  }
  return job;
}

StatusOr<MultiModelJob> LoadJobFile(const std::string& path, std::vector<FieldError>* errors) {
  std::ifstream in(path);
  if (!in) return ErrnoError("cannot read manifest " + path, errno);
  std::stringstream buf;
  buf << in.rdbuf();
  fs::path dir = fs::absolute(fs::path(path)).parent_path();
  auto job = ParseJobYaml(buf.str(), dir.string(), errors);
  if (!job.ok()) return job.status().WithContext(path);
  return job;
}

namespace {

/// Trials the grid expands to, multiplied with overflow checks; -1 past kMaxTrialsPerJob.
int64_t GridSize(const std::vector<GridAxis>& grid) {
  int64_t total = 1;
  for (const auto& axis : grid) {
    if (__builtin_mul_overflow(total, static_cast<int64_t>(axis.values.size()), &total) ||
        total > kMaxTrialsPerJob) {
      return -1;
    }
  }
  return total;
}

/// The early-stopping rules one trial must meet; `where` prefixes the messages.
void CheckEarlyStopping(const EarlyStoppingSpec& es, const TrainingSpec& training,
                        const std::string& where, std::vector<FieldError>* errors) {
  if (es.algorithm == EarlyStoppingAlgorithm::kNone) return;
  if (es.min_steps >= training.steps) {
    errors->push_back(FieldError{"spec.search.earlyStopping.minSteps",
                                 where + "minSteps (" + std::to_string(es.min_steps) +
                                     ") must be below steps (" + std::to_string(training.steps) +
                                     "): nothing would be compared before the trial ends",
                                 -1});
  }
  if (es.algorithm == EarlyStoppingAlgorithm::kMedian && training.eval_every_steps == 0) {
    errors->push_back(FieldError{"spec.training.evalEverySteps",
                                 where + "median stopping compares evaluations: evalEverySteps "
                                         "must be > 0",
                                 -1});
  }
}

/// A random search's trial `n`: its drawn values and its name `<job>-<n>`.
void DrawTrial(const RandomSearchSpec& random, int64_t n, Trial* t) {
  for (const auto& axis : random.space) {
    t->hyperparameters.push_back({axis.field, DrawValue(axis, random.seed, n)});
  }
}

/// Expands the grid (or draws the random search), appending rule violations to `errors`.
std::vector<Trial> ExpandInto(const MultiModelJob& job, std::vector<FieldError>* errors) {
  std::vector<Trial> trials;
  const auto& random = job.spec.random;
  const int64_t total = random ? random->trials : GridSize(job.spec.grid);
  if (total < 0) {
    std::string sizes;
    for (const auto& axis : job.spec.grid) {
      sizes += (sizes.empty() ? "" : " x ") + std::to_string(axis.values.size());
    }
    errors->push_back(FieldError{"spec.search.grid",
                                 "expands to " + sizes + " trials, more than the limit of " +
                                     std::to_string(kMaxTrialsPerJob) + " per job",
                                 -1});
    return trials;
  }
  std::set<std::string> names;
  std::vector<size_t> idx(job.spec.grid.size(), 0);
  for (int64_t n = 0; n < total; ++n) {
    // Mixed-radix counter: the last axis varies fastest.
    size_t rem = static_cast<size_t>(n);
    for (size_t a = job.spec.grid.size(); a-- > 0;) {
      idx[a] = rem % job.spec.grid[a].values.size();
      rem /= job.spec.grid[a].values.size();
    }
    TrialConfig config{job.spec.model, job.spec.training};
    Trial t;
    t.index = static_cast<int>(n);
    if (random) {
      DrawTrial(*random, n, &t);
    } else {
      for (size_t a = 0; a < job.spec.grid.size(); ++a) {
        t.hyperparameters.push_back({job.spec.grid[a].field, job.spec.grid[a].values[idx[a]]});
      }
    }
    for (const auto& h : t.hyperparameters) FindField("", h.field)->set(config, h.value);
    std::string suffix = random ? std::to_string(n) : TrialSuffix(t.hyperparameters);
    t.name = job.metadata.name + "-" + (suffix.empty() ? std::string("base") : suffix);
    if (!names.insert(t.name).second) {
      t.name += "-" + std::to_string(n);
      names.insert(t.name);
    }
    t.namespace_ = job.metadata.namespace_;
    t.job = job.metadata.name;
    t.job_uid = job.metadata.uid;
    t.model = config.model;
    t.training = config.training;
    t.dataset = job.spec.dataset;
    t.resources = job.spec.resources;
    const std::string where = job.spec.grid.empty() && !random ? "" : "in trial " + t.name + ": ";
    CheckEarlyStopping(job.spec.early_stopping, config.training, where, errors);
    if (std::string problem = rules::TrialNameProblem(t.name); !problem.empty()) {
      errors->push_back(FieldError{"metadata.name", problem, -1});
    }
    CheckTrialRules(config, job.spec.dataset, job.spec.resources, where, errors);
    if (auto e = CostModelLimitError(t)) {
      e->message = where + e->message;
      errors->push_back(*e);
    }
    trials.push_back(std::move(t));
  }
  return trials;
}

}  // namespace

StatusOr<std::vector<Trial>> ExpandTrials(const MultiModelJob& job) {
  std::vector<FieldError> errors;
  std::vector<Trial> trials = ExpandInto(job, &errors);
  if (!errors.empty()) {
    std::string msg;
    std::set<std::string> seen;
    for (const auto& e : errors) {
      std::string line = e.ToString();
      if (seen.insert(line).second) msg += (msg.empty() ? "" : "\n  ") + line;
    }
    return InvalidArgumentError(msg);
  }
  return trials;
}

}  // namespace hydra

namespace hydra {

Status ValidateTrial(const Trial& trial, const std::string& prefix) {
  std::vector<FieldError> errors;
  auto err = [&](const std::string& path, const std::string& message) {
    if (!message.empty()) errors.push_back(FieldError{prefix + path, message, -1});
  };
  err("name", rules::TrialNameProblem(trial.name));
  if (!trial.namespace_.empty() && !IsDnsLabel(trial.namespace_)) {
    err("namespace", "must be a DNS-1123 label, got '" + trial.namespace_ + "'");
  }
  if (!trial.job.empty() && !IsDnsSubdomain(trial.job)) {
    err("job", "must be a DNS-1123 subdomain, got '" + trial.job + "'");
  }
  if (!trial.job_uid.empty()) err("jobUid", rules::UidProblem(trial.job_uid));
  for (size_t i = 0; i < trial.hyperparameters.size(); ++i) {
    // The grid's values are recorded with the trial (status, metrics labels, JSON): a NaN
    // would compare unequal to itself and an infinity would not survive JSON.
    const double* d = std::get_if<double>(&trial.hyperparameters[i].value);
    if (d && !std::isfinite(*d)) {
      err("hyperparameters[" + std::to_string(i) + "]", "must be a finite number");
    }
  }
  const TrialConfig config{trial.model, trial.training};
  for (const auto& f : Fields()) {
    err(std::string(f.section) + "." + f.name, ValueProblem(f, f.get(config)));
  }
  const auto& ds = trial.dataset;
  err("dataset.imageShape", rules::ImageShapeProblem(ds.image_shape));
  if (ds.resolved_path.empty()) err("dataset.path", "must be a non-empty path");
  if (trial.model.family == ModelFamily::kTorchScript && trial.model.resolved_path.empty()) {
    err("model.path", "family torchscript needs the module's path");
  }
  if (trial.model.init) {
    if (trial.model.family != ModelFamily::kGpt2)
      err("model.init", "only family gpt2 starts from a checkpoint");
    const std::string& ip = trial.model.init->resolved_path;
    if (ip.empty() || ip.front() != '/') {
      err("model.init.path", "must be an absolute path (got '" + ip + "')");
    }
  }
  err("dataset.validationFraction", rules::ValidationFractionProblem(ds.validation_fraction));
  err("dataset.evalSequences", rules::EvalSequencesProblem(ds.eval_sequences));
  const auto& res = trial.resources;
  if (res.device_memory_budget) {
    err("resources.deviceMemoryBudget",
        rules::DeviceMemoryBudgetProblem(*res.device_memory_budget));
  }
  if (res.host_memory_budget) {
    err("resources.hostMemoryBudget", rules::HostMemoryBudgetProblem(*res.host_memory_budget));
  }
  int64_t prev = 0;
  for (size_t i = 0; i < res.shard_boundaries.size(); ++i) {
    err("resources.shardBoundaries[" + std::to_string(i) + "]",
        rules::ShardBoundaryProblem(res.shard_boundaries[i], prev));
    prev = res.shard_boundaries[i];
  }
  if (errors.empty()) {
    std::vector<FieldError> cross;
    CheckTrialRules(config, ds, res, "", &cross);
    if (auto e = CostModelLimitError(trial)) cross.push_back(*e);
    for (auto& e : cross) {
      // The rules name manifest paths ("spec.model.nHead"); re-root them under `prefix`.
      if (e.path.rfind("spec.", 0) == 0) e.path = prefix + e.path.substr(5);
      errors.push_back(e);
    }
  }
  if (errors.empty()) return OkStatus();
  std::string msg = "invalid trial " + trial.name + ":";
  for (const auto& e : errors) msg += "\n  " + e.ToString();
  return InvalidArgumentError(msg);
}

}  // namespace hydra
