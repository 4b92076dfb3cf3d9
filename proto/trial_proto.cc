#include "proto/trial_proto.h"

#include <cmath>
#include <filesystem>

namespace hydra::wire {
namespace {

/// `text`, one of the manifest's closed sets on the wire, into `out`; what is wrong with it
/// into `errors` under `path`.
template <typename E>
void ParseEnumField(const std::string& text, const char* path, E* out,
                    std::vector<FieldError>* errors) {
  if (auto value = ParseName<E>(text)) {
    *out = *value;
  } else {
    errors->push_back({path, NameProblem<E>(text)});
  }
}

}  // namespace

void TrialToProto(const Trial& t, v1::TrialSpec* out) {
  out->set_job(t.job);
  out->set_namespace_(t.namespace_);
  out->set_job_uid(t.job_uid);
  out->set_name(t.name);
  for (const auto& hp : t.hyperparameters) {
    auto* h = out->add_hyperparameters();
    h->set_field(hp.field);
    if (const auto* i = std::get_if<int64_t>(&hp.value)) {
      h->set_int_value(*i);
    } else if (const auto* d = std::get_if<double>(&hp.value)) {
      h->set_float_value(*d);
    } else {
      h->set_string_value(std::get<std::string>(hp.value));
    }
  }
  auto* m = out->mutable_model();
  m->set_family(NameOf(t.model.family));
  m->set_n_layer(t.model.n_layer);
  m->set_n_embd(t.model.n_embd);
  m->set_n_head(t.model.n_head);
  m->set_context_length(t.model.context_length);
  m->set_vocab_size(t.model.vocab_size);
  m->set_path(t.model.resolved_path);
  m->set_num_classes(t.model.num_classes);
  if (t.model.init) {
    m->mutable_init()->set_format(v1::INIT_FORMAT_SAFETENSORS);
    m->mutable_init()->set_path(t.model.init->resolved_path);
  }
  auto* d = out->mutable_dataset();
  d->set_format(NameOf(t.dataset.format));
  d->set_path(t.dataset.resolved_path);
  d->set_validation_fraction(t.dataset.validation_fraction);
  d->set_eval_sequences(t.dataset.eval_sequences);
  for (int64_t v : t.dataset.image_shape) d->add_image_shape(v);
  const auto& tr = t.training;
  auto* o = out->mutable_training();
  o->set_optimizer(NameOf(tr.optimizer));
  o->set_learning_rate(tr.learning_rate);
  o->set_batch_size(tr.batch_size);
  o->set_steps(tr.steps);
  o->set_seed(tr.seed);
  o->set_eval_every_steps(tr.eval_every_steps);
  o->set_checkpoint_every_steps(tr.checkpoint_every_steps);
  o->set_gradient_accumulation_steps(tr.gradient_accumulation_steps);
  o->set_weight_decay(tr.weight_decay);
  o->set_momentum(tr.momentum);
  o->set_beta1(tr.beta1);
  o->set_beta2(tr.beta2);
  o->set_epsilon(tr.epsilon);
  o->set_grad_clip_norm(tr.grad_clip_norm);
  o->set_lr_schedule(NameOf(tr.lr_schedule));
  o->set_warmup_steps(tr.warmup_steps);
  o->set_precision(tr.precision == Precision::kBf16 ? v1::PRECISION_BF16 : v1::PRECISION_FP32);
  auto* r = out->mutable_resources();
  r->set_device_memory_budget_bytes(t.resources.device_memory_budget.value_or(0));
  r->set_offload(NameOf(t.resources.offload));
  if (t.resources.host_memory_budget) {
    r->set_host_memory_budget_bytes(*t.resources.host_memory_budget);
  }
}

StatusOr<Trial> TrialFromProto(const v1::TrialSpec& s) {
  Trial t;
  t.namespace_ = s.namespace_();
  t.job = s.job();
  t.job_uid = s.job_uid();
  t.name = s.name();
  for (const auto& h : s.hyperparameters()) {
    Hyperparameter hp;
    hp.field = h.field();
    switch (h.value_case()) {
      case v1::Hyperparameter::kIntValue: hp.value = h.int_value(); break;
      case v1::Hyperparameter::kFloatValue: hp.value = h.float_value(); break;
      default: hp.value = h.string_value();
    }
    t.hyperparameters.push_back(std::move(hp));
  }
  const auto& m = s.model();
  std::vector<FieldError> extra;
  ParseEnumField(m.family(), "trial.model.family", &t.model.family, &extra);
  t.model.n_layer = m.n_layer();
  t.model.n_embd = m.n_embd();
  t.model.n_head = m.n_head();
  t.model.context_length = m.context_length();
  t.model.vocab_size = m.vocab_size();
  t.model.path = t.model.resolved_path = m.path();
  if (m.num_classes() > 0) t.model.num_classes = m.num_classes();
  if (m.has_init()) {
    if (m.init().format() != v1::INIT_FORMAT_SAFETENSORS) {
      return InvalidArgumentError("trial.model.init.format: unknown value " +
                                  std::to_string(m.init().format()) +
                                  " (0 is unset; a newer controller?)");
    }
    ModelInit init;
    init.path = init.resolved_path = m.init().path();
    t.model.init = std::move(init);
  }
  const auto& d = s.dataset();
  ParseEnumField(d.format(), "trial.dataset.format", &t.dataset.format, &extra);
  t.dataset.path = d.path();
  t.dataset.validation_fraction = d.validation_fraction();
  t.dataset.eval_sequences = d.eval_sequences();
  if (d.image_shape_size() > 0)
    t.dataset.image_shape.assign(d.image_shape().begin(), d.image_shape().end());
  const auto& o = s.training();
  auto& tr = t.training;
  ParseEnumField(o.optimizer(), "trial.training.optimizer", &tr.optimizer, &extra);
  tr.learning_rate = o.learning_rate();
  tr.batch_size = o.batch_size();
  tr.steps = o.steps();
  tr.seed = o.seed();
  tr.eval_every_steps = o.eval_every_steps();
  tr.checkpoint_every_steps = o.checkpoint_every_steps();
  tr.gradient_accumulation_steps = o.gradient_accumulation_steps();
  tr.weight_decay = o.weight_decay();
  tr.momentum = o.momentum();
  tr.beta1 = o.beta1();
  tr.beta2 = o.beta2();
  tr.epsilon = o.epsilon();
  tr.grad_clip_norm = o.grad_clip_norm();
  ParseEnumField(o.lr_schedule(), "trial.training.lrSchedule", &tr.lr_schedule, &extra);
  tr.warmup_steps = o.warmup_steps();
  switch (o.precision()) {
    case v1::PRECISION_UNSPECIFIED:
    case v1::PRECISION_FP32: tr.precision = Precision::kFp32; break;
    case v1::PRECISION_BF16: tr.precision = Precision::kBf16; break;
    default:
      return InvalidArgumentError("trial.training.precision: unknown value " +
                                  std::to_string(o.precision()) + " (a newer controller?)");
  }
  const auto& r = s.resources();
  if (!r.offload().empty()) {
    ParseEnumField(r.offload(), "trial.resources.offload", &t.resources.offload, &extra);
  }
  // Zero means "not set" on the wire; negative sizes are kept so validation names them.
  if (r.device_memory_budget_bytes() != 0) {
    t.resources.device_memory_budget = r.device_memory_budget_bytes();
  }
  if (r.has_host_memory_budget_bytes()) {
    t.resources.host_memory_budget = r.host_memory_budget_bytes();
  }
  if (d.path().empty() || d.path().front() != '/') {
    extra.push_back({"trial.dataset.path", "must be an absolute path (got '" + d.path() + "')"});
  } else {
    t.dataset.resolved_path = std::filesystem::path(d.path()).lexically_normal().string();
  }
  Status valid = ValidateTrial(t, "trial.");
  if (!extra.empty()) {
    std::string msg = valid.ok() ? "invalid trial " + t.name + ":" : valid.message();
    for (const auto& e : extra) msg += "\n  " + e.ToString();
    return InvalidArgumentError(msg);
  }
  RETURN_IF_ERROR(valid);
  return t;
}

void ShardPlanToProto(const PartitionPlan& plan, v1::ShardPlan* out) {
  out->Clear();
  for (const auto& sh : plan.shards) {
    auto* s = out->add_shards();
    s->set_first_layer(sh.first_layer);
    s->set_last_layer(sh.last_layer);
    s->set_state_bytes(sh.state_bytes);
    s->set_activation_bytes(sh.activation_bytes);
    s->set_activations(ActivationPolicyName(sh.policy));
    s->set_estimated_seconds(sh.estimated_seconds);
    s->set_optimizer(OptimizerPlacementName(sh.optimizer));
    s->set_resident(sh.resident);
    s->set_input_offloaded(sh.input_offloaded);
  }
  out->set_peak_device_bytes(plan.peak_device_bytes);
  out->set_total_state_bytes(plan.total_state_bytes);
  out->set_state_tier(plan.state_tier == StateTier::kDisk ? "disk" : "host");
  out->set_attention(AttentionMemoryName(plan.attention));
  out->set_selective_recompute(plan.selective_recompute);
  out->set_offloaded_bytes(plan.offloaded_bytes);
  out->set_resident_bytes(plan.resident_bytes);
  out->set_link_seconds(plan.link_seconds);
}

std::vector<int64_t> ShardBoundaries(const v1::ShardPlan& plan) {
  std::vector<int64_t> out;
  for (int i = 1; i < plan.shards_size(); ++i) out.push_back(plan.shards(i).first_layer());
  return out;
}

v1::TrialState TrialStateToProto(const std::string& state) {
  if (state == kTrialPending) return v1::PENDING;
  if (state == kTrialRunning) return v1::RUNNING;
  if (state == kTrialSucceeded) return v1::SUCCEEDED;
  if (state == kTrialFailed) return v1::FAILED;
  if (state == kTrialInterrupted) return v1::INTERRUPTED;
  if (state == kTrialCancelled) return v1::CANCELLED;
  if (state == kTrialEarlyStopped) return v1::EARLY_STOPPED;
  return v1::TRIAL_STATE_UNSPECIFIED;
}

std::string TrialStateFromProto(v1::TrialState state) {
  switch (state) {
    case v1::PENDING: return kTrialPending;
    case v1::RUNNING: return kTrialRunning;
    case v1::SUCCEEDED: return kTrialSucceeded;
    case v1::FAILED: return kTrialFailed;
    case v1::INTERRUPTED: return kTrialInterrupted;
    case v1::CANCELLED: return kTrialCancelled;
    case v1::EARLY_STOPPED: return kTrialEarlyStopped;
    default: return "Unknown";
  }
}

v1::TrialRef TrialRefOf(const Trial& t) {
  v1::TrialRef ref;
  ref.set_namespace_(t.namespace_);
  ref.set_job(t.job);
  ref.set_job_uid(t.job_uid);
  ref.set_name(t.name);
  return ref;
}

namespace {

/// The key of a message that names a trial (TrialRef, TrialStatus: the same four fields).
template <typename Message>
std::string KeyOfMessage(const Message& m) {
  Trial t;
  t.namespace_ = m.namespace_();
  t.job = m.job();
  t.job_uid = m.job_uid();
  t.name = m.name();
  return TrialKey(t);
}

}  // namespace

std::string TrialKeyOf(const v1::TrialRef& ref) { return KeyOfMessage(ref); }

std::string TrialKeyOf(const v1::TrialStatus& status) { return KeyOfMessage(status); }

void TrialResultToProto(const TrialResult& r, v1::TrialStatus* out) {
  out->set_namespace_(r.trial.namespace_);
  out->set_job(r.trial.job);
  out->set_job_uid(r.trial.job_uid);
  out->set_name(r.trial.name);
  out->set_state(TrialStateToProto(r.state));
  out->set_message(r.message);
  out->set_step(r.step);
  out->set_steps(r.trial.training.steps);
  out->set_train_loss(LatestLoss(r.train_curve));
  out->set_validation_loss(LatestLoss(r.val_curve));
  out->set_tokens_per_second(r.tokens_per_second);
  out->set_last_checkpoint_step(r.last_checkpoint_step);
  out->set_resumed_from_step(r.resumed_from_step);
  out->set_final_validation_loss(r.final_val_loss);
  out->set_step_limit(r.step_limit);
  std::vector<CurvePoint> evaluations;
  for (const auto& p : r.val_curve) AppendBounded(&evaluations, p, kMaxReportedEvaluations);
  for (const auto& p : evaluations) {
    auto* point = out->add_evaluations();
    point->set_step(p.step);
    point->set_loss(p.loss);
  }
}

}  // namespace hydra::wire
