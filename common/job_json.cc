#include "common/job_json.h"

#include <cstdio>

namespace hydra {

nlohmann::json ParamValueJson(const ParamValue& value) {
  if (std::holds_alternative<int64_t>(value)) return std::get<int64_t>(value);
  if (std::holds_alternative<double>(value)) return std::get<double>(value);
  return std::get<std::string>(value);
}

nlohmann::ordered_json HyperparametersJson(const Trial& trial) {
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  for (const auto& hp : trial.hyperparameters) out[hp.field] = ParamValueJson(hp.value);
  return out;
}

nlohmann::json TrialConfigJson(const Trial& t) {
  const auto& m = t.model;
  const auto& tr = t.training;
  nlohmann::json j;
  j["model"] = {{"family", NameOf(m.family)},
                {"nLayer", m.n_layer},
                {"nEmbd", m.n_embd},
                {"nHead", m.n_head},
                {"contextLength", m.context_length},
                {"vocabSize", m.vocab_size}};
  if (m.family == ModelFamily::kMlp || m.family == ModelFamily::kResNet)
    j["model"]["numClasses"] = m.num_classes;
  if (!m.resolved_path.empty()) j["model"]["path"] = m.resolved_path;
  if (m.init) {
    j["model"]["init"] = {{"format", InitFormatName(m.init->format)},
                          {"path", m.init->resolved_path}};
  }
  j["training"] = {{"optimizer", NameOf(tr.optimizer)},
                   {"learningRate", tr.learning_rate},
                   {"batchSize", tr.batch_size},
                   {"steps", tr.steps},
                   {"seed", tr.seed},
                   {"gradientAccumulationSteps", tr.gradient_accumulation_steps},
                   {"weightDecay", tr.weight_decay},
                   {"momentum", tr.momentum},
                   {"beta1", tr.beta1},
                   {"beta2", tr.beta2},
                   {"epsilon", tr.epsilon},
                   {"gradClipNorm", tr.grad_clip_norm},
                   {"lrSchedule", NameOf(tr.lr_schedule)},
                   {"warmupSteps", tr.warmup_steps}};
  // Only when not the default, so fp32 trials keep the fingerprints (and checkpoints) they had
  // before the field existed.
  if (tr.precision != Precision::kFp32) j["training"]["precision"] = PrecisionName(tr.precision);
  j["dataset"] = {{"format", NameOf(t.dataset.format)},
                  {"path", t.dataset.resolved_path},
                  {"validationFraction", t.dataset.validation_fraction},
                  {"evalSequences", t.dataset.eval_sequences}};
  if (t.dataset.format == DatasetFormat::kImagesU8)
    j["dataset"]["imageShape"] = t.dataset.image_shape;
  return j;
}

StatusOr<ModelSpec> ModelSpecFromJson(const nlohmann::json& model) {
  ModelSpec m;
  const auto integer = [&](const char* key, int64_t* out) -> Status {
    if (!model.contains(key) || !model[key].is_number_integer()) {
      return InvalidArgumentError(std::string("model.") + key + ": missing or not an integer");
    }
    *out = model[key].get<int64_t>();
    return OkStatus();
  };
  if (!model.is_object() || !model.contains("family") || !model["family"].is_string()) {
    return InvalidArgumentError("model.family: missing or not a string");
  }
  const std::string family = model["family"].get<std::string>();
  if (auto f = ParseName<ModelFamily>(family)) {
    m.family = *f;
  } else {
    return InvalidArgumentError("model.family: " + NameProblem<ModelFamily>(family));
  }
  RETURN_IF_ERROR(integer("nLayer", &m.n_layer));
  RETURN_IF_ERROR(integer("nEmbd", &m.n_embd));
  RETURN_IF_ERROR(integer("nHead", &m.n_head));
  RETURN_IF_ERROR(integer("contextLength", &m.context_length));
  RETURN_IF_ERROR(integer("vocabSize", &m.vocab_size));
  if (model.contains("numClasses")) RETURN_IF_ERROR(integer("numClasses", &m.num_classes));
  if (model.contains("path") && model["path"].is_string()) {
    m.path = m.resolved_path = model["path"].get<std::string>();
  }
  return m;
}

std::string TrialFingerprint(const Trial& trial) {
  // FNV-1a over the canonical (key-sorted) JSON text. evalEverySteps and
  // checkpointEverySteps are left out on purpose: changing them does not change the result.
  std::string text = TrialConfigJson(trial).dump();
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

}  // namespace hydra
