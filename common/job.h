#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "common/early_stopping.h"
#include "common/manifest_enums.h"
#include "common/status.h"

namespace hydra {

/// API group/version and kind of the MultiModelJob resource.
inline constexpr const char* kApiVersion = "hydra.dev/v1alpha1";
inline constexpr const char* kKind = "MultiModelJob";

/// One top-level child of a TorchScript model, measured when the module is loaded (not part of
/// the manifest): what the partitioner and the cost model know of it.
struct ModuleLayer {
  std::string name;             ///< the child's attribute name ("0", "blocks_3", ...)
  int64_t parameters = 0;       ///< parameters it owns (tied ones counted at first use)
  int64_t tied_parameters = 0;  ///< of those, the ones a later child uses too
  int64_t output_elements = 0;  ///< elements of its output for one sequence
  int64_t buffer_bytes = 0;     ///< its buffers' (a causal mask), but those an earlier child has
  /// Bytes of a micro-batch: per_sequence for each of its sequences, and fixed whatever its
  /// size (cost_model's ModuleLayerCosts adds them up).
  struct Bytes {
    int64_t per_sequence = 0;
    int64_t fixed = 0;
  };
  /// What its training allocates, measured on the CPU when the module is loaded, in the trial's
  /// precision (in bf16 the larger of that and fp32's, less the weights' bf16 casts that the
  /// cost model counts for every layer): what autograd keeps from its forward for the backward,
  /// less its output (the last child's: with the loss, whose output is the loss itself), and
  /// the most its forward or backward allocates beyond that at once.
  struct Memory {
    Precision precision = Precision::kFp32;  ///< the trial's, when measured
    Bytes kept;
    Bytes transient;
  };
  /// Unset (not measured): kept estimated from the output (cost_model's kSavedPerOutput).
  std::optional<Memory> memory = {};
};

/// spec.model.init: pretrained weights a gpt2 trial starts from instead of random ones.
struct ModelInit {
  InitFormat format = InitFormat::kSafetensors;
  std::string path;           ///< as written in the manifest
  std::string resolved_path;  ///< absolute, resolved against the manifest's directory
};

/// spec.model: the architecture. Field names are the manifest's (camelCase there).
struct ModelSpec {
  ModelFamily family = ModelFamily::kGpt2;
  int64_t n_layer = 4;   ///< nLayer: transformer blocks (mlp: hidden layers; resnet: blocks)
  int64_t n_embd = 128;  ///< nEmbd: hidden width (resnet: channels)
  int64_t n_head = 4;    ///< nHead: attention heads; must divide nEmbd
  int64_t context_length = 128;  ///< contextLength: tokens per sequence
  int64_t vocab_size = 256;      ///< vocabSize
  int64_t num_classes = 10;      ///< numClasses: mlp and resnet (image classification)
  /// family torchscript: the module file (torch.jit.save) as written, and resolved against the
  /// manifest's directory. Its top-level children run in order; nLayer/nEmbd/nHead are unused.
  std::string path = {};
  std::string resolved_path = {};
  /// family torchscript: the module's children, filled when the module is loaded
  /// (executor::ResolveModel); empty until then.
  std::vector<ModuleLayer> layers = {};
  /// spec.model.init (family gpt2): the checkpoint the weights start from; unset: random
  /// weights from training.seed.
  std::optional<ModelInit> init = {};
};

/// spec.dataset: where the tokens come from.
struct DatasetSpec {
  DatasetFormat format = DatasetFormat::kText;
  std::string path;                   ///< as written in the manifest
  std::string resolved_path;          ///< absolute, resolved against the manifest's directory
  double validation_fraction = 0.05;  ///< tail of the token stream held out for validation
  int64_t eval_sequences = 64;        ///< evalSequences: validation windows scored per evaluation
  /// images-u8: [channels, height, width] of every image.
  std::vector<int64_t> image_shape = {3, 32, 32};
};

/// spec.training: the optimisation settings of one trial.
struct TrainingSpec {
  OptimizerKind optimizer = OptimizerKind::kAdamW;
  double learning_rate = 1e-3;
  int64_t batch_size = 8;                ///< sequences per optimizer step (over all micro-batches)
  int64_t steps = 200;                   ///< optimizer steps
  int64_t seed = 1;                      ///< initialisation and data order
  int64_t eval_every_steps = 50;         ///< 0: only at the end
  int64_t checkpoint_every_steps = 100;  ///< 0: only at the end
  int64_t gradient_accumulation_steps = 1;  ///< micro-batches per step; divides batchSize
  double weight_decay = 0.01;               ///< decoupled (AdamW) or L2 (SGD), on matrices only
  double momentum = 0.9;                    ///< SGD only
  double beta1 = 0.9;                       ///< AdamW only
  double beta2 = 0.999;                     ///< AdamW only
  double epsilon = 1e-8;                    ///< AdamW only
  double grad_clip_norm = 0;                ///< global L2 norm clip; 0 disables
  LrSchedule lr_schedule = LrSchedule::kConstant;  ///< to 10% of learningRate for cosine
  int64_t warmup_steps = 0;                        ///< linear warm-up steps
  Precision precision = Precision::kFp32;          ///< fp32 | bf16
};

/// spec.resources.
struct ResourcesSpec {
  std::optional<int64_t> device_memory_budget;  ///< bytes; unset: all the device has
  OffloadTier offload = OffloadTier::kHost;     ///< where shards' state lives off the device
  /// Host RAM for stashed activations (and, with offload: disk, the weights their graphs
  /// hold); past it shards recompute their forward in backward instead. Unset: unlimited.
  std::optional<int64_t> host_memory_budget;
  /// Explicit shard boundaries: the first layer index of shards 1..n-1 (layer 0 is the
  /// embedding, 1..nLayer the blocks, nLayer+1 the head). Empty: the partitioner decides.
  std::vector<int64_t> shard_boundaries;
};

struct JobMetadata {
  std::string name;
  std::string namespace_;
  std::string uid;  ///< Kubernetes' metadata.uid (the controller passes it; "" in hydra run)
  std::map<std::string, std::string> labels;
  std::map<std::string, std::string> annotations;
};

/// A searched value: integers, floating point numbers or enum strings.
using ParamValue = std::variant<int64_t, double, std::string>;

/// One axis of spec.search.grid: a spec.model or spec.training field and its values.
struct GridAxis {
  std::string field;  ///< manifest name, e.g. "learningRate"
  std::vector<ParamValue> values;
};

/// How spec.search.random draws one field's values.
enum class Distribution {
  kUniform,     ///< uniform: [low, high], a float field
  kLogUniform,  ///< logUniform: [low, high], 0 < low, uniform in log space; a float field
  kIntUniform,  ///< intUniform: [low, high] both included, an integer field
  kChoice,      ///< choice: one of the listed values, each as likely; any field
};

/// One dimension of spec.search.random.space.
struct RandomAxis {
  std::string field;  ///< manifest name, e.g. "learningRate"
  Distribution distribution = Distribution::kChoice;
  ParamValue low = int64_t{0}, high = int64_t{0};  ///< uniform, logUniform, intUniform
  std::vector<ParamValue> choices;                 ///< choice
};

/// spec.search.random: `trials` points drawn from `space`, reproducibly from `seed`.
struct RandomSearchSpec {
  int64_t trials = 0;
  int64_t seed = 0;
  std::vector<RandomAxis> space;  ///< in the field table's order
};

/// spec.agents (Kubernetes only): the job's own agent pods, which the controller creates in
/// the job's namespace, owned by the job, between minAgents and maxAgents of them as its
/// runnable trials need; without it the job uses the shared agent pool. The pod template itself
/// stays in the object (the controller reads it there); the parser checks it and keeps what
/// scaling needs.
struct AgentsSpec {
  int64_t min_agents = 0;  ///< minAgents: pods kept even when idle (0: scale to zero)
  int64_t max_agents = 1;  ///< maxAgents: the most pods at once
  /// The template's container that runs hydra-agent: "agent", or its only container.
  std::string container = "agent";
  /// That container's resources.limits["nvidia.com/gpu"]: the GPUs of one agent (0: CPU).
  int64_t gpus_per_agent = 0;
};

/// hydra-agent flags the controller sets on a job's agent pods; the template's args may not.
inline constexpr const char* kControllerAgentFlags[] = {"--node-name",
                                                        "--grpc-bind-address",
                                                        "--grpc-advertise-address",
                                                        "--metrics-bind-address",
                                                        "--health-probe-bind-address",
                                                        "--data-root",
                                                        "--checkpoint-root",
                                                        "--dedicated-job",
                                                        "--tls-cert-file",
                                                        "--tls-key-file",
                                                        "--tls-client-ca-file",
                                                        "--tls-client-identity",
                                                        "--insecure"};

/// Most agent pods one job may have (spec.agents.maxAgents).
inline constexpr int64_t kMaxAgentsPerJob = 1024;

struct MultiModelJobSpec {
  ModelSpec model;
  DatasetSpec dataset;
  std::vector<GridAxis> grid;  ///< in the field table's order; the first axis varies slowest
  std::optional<RandomSearchSpec> random;  ///< exclusive with a non-empty grid
  EarlyStoppingSpec early_stopping;        ///< spec.search.earlyStopping
  TrainingSpec training;
  ResourcesSpec resources;
  /// On deletion of the job in Kubernetes: spec.checkpointRetention Retain (keep checkpoints)
  /// or Delete.
  enum class CheckpointRetention { kRetain, kDelete };
  CheckpointRetention checkpoint_retention = CheckpointRetention::kRetain;
  /// In Kubernetes: how often a trial may be moved to another agent (its agent was lost or
  /// preempted) before it is Failed.
  int64_t max_restarts = 10;
  /// In Kubernetes: every trial is checkpointed and stopped while true, and placed again (to
  /// resume where it stopped) once false.
  bool suspend = false;
  /// In Kubernetes: the job's own agent pods; unset: the shared pool. `hydra run` ignores it.
  std::optional<AgentsSpec> agents;
};

struct MultiModelJob {
  JobMetadata metadata;
  MultiModelJobSpec spec;
};

struct Hyperparameter {
  std::string field;
  ParamValue value;
};

/// Most trials one job may have: the job's status (an entry per trial) must stay well under
/// etcd's object size limit (1.5 MiB by default); docs/manifest.md has the measurement.
inline constexpr int64_t kMaxTrialsPerJob = 256;
/// Most evalSequences: validation windows scored per evaluation.
inline constexpr int64_t kMaxEvalSequences = 65536;
/// Longest trial name: a DNS-1123 label (it names directories, metrics and status entries).
inline constexpr size_t kMaxTrialNameLength = 63;
/// Longest job name: "<name>-base", the shortest trial name, must be a DNS-1123 label.
inline constexpr size_t kMaxJobNameLength = kMaxTrialNameLength - 5;

/// One point of the grid: a model to train. Its identity is (namespace_, job, job_uid, name)
/// everywhere: on the wire, in an agent's registry, in metrics and in status.
struct Trial {
  std::string namespace_;  ///< the MultiModelJob's namespace ("" outside Kubernetes)
  std::string job;         ///< the MultiModelJob's name
  std::string job_uid;     ///< its metadata.uid ("" outside Kubernetes)
  std::string name;        ///< "<job>-<abbreviated hyperparameters>", a DNS-1123 label
  int index = 0;           ///< position in the grid's expansion order
  std::vector<Hyperparameter> hyperparameters;  ///< the grid's values for this trial
  ModelSpec model;
  TrainingSpec training;
  DatasetSpec dataset;
  ResourcesSpec resources;
};

/// A manifest problem: the field path ("spec.search.grid.batchSize[1]") and the rule broken.
struct FieldError {
  std::string path = {};
  std::string message;
  int line = -1;  ///< 1-based line in the manifest, -1 if unknown
  std::string ToString() const;
};

/// Parses and validates a manifest. On failure returns INVALID_ARGUMENT listing every problem,
/// and appends them to `errors` when given. `base_dir` resolves spec.dataset.path.
StatusOr<MultiModelJob> ParseJobYaml(const std::string& yaml_text, const std::string& base_dir,
                                     std::vector<FieldError>* errors = nullptr);

/// Reads and parses a manifest file; relative dataset paths resolve against its directory.
StatusOr<MultiModelJob> LoadJobFile(const std::string& path,
                                    std::vector<FieldError>* errors = nullptr);

/// Expands the grid into trials (cartesian product, first axis outermost). Every trial is
/// checked against the cross-field rules (e.g. nHead divides nEmbd).
StatusOr<std::vector<Trial>> ExpandTrials(const MultiModelJob& job);

/// Checks one trial's effective configuration (as it arrives over the wire, not from a
/// manifest) by the manifest's rules: field ranges and enums, dataset and resources, and the
/// cross-field rules. INVALID_ARGUMENT listing every problem, paths prefixed with `prefix`
/// ("trial." gives "trial.training.learningRate").
Status ValidateTrial(const Trial& trial, const std::string& prefix);

/// The trial's identity as one string, for registries keyed by it:
/// "<namespace>/<job>/<job uid>/<name>", or the bare name when namespace, job and uid are all
/// empty (a trial with no owner, as in unit tests). Unambiguous: no part may contain '/'.
std::string TrialKey(const Trial& trial);

/// "namespace/job/name" (or fewer parts when empty): the identity for people, in messages.
std::string TrialDisplayName(const Trial& trial);

/// Whether `s` is a DNS-1123 label (lowercase letters, digits and '-', starting and ending
/// with a letter or digit, at most 63 characters) or subdomain (also '.', at most 253).
bool IsDnsLabel(const std::string& s);
bool IsDnsSubdomain(const std::string& s);

/// Learning rate of optimizer step `step` (0-based): linear warm-up over warmupSteps, then
/// constant or cosine decay to 10% of learningRate at the last step.
double LearningRateAt(const TrainingSpec& training, int64_t step);

/// Whether the trial classifies images (dataset format images-u8) rather than modelling text.
bool IsImageTask(const Trial& trial);

/// Bytes or tokens one training sample spans in the dataset: contextLength + 1 tokens, or one
/// images-u8 record (1 + channels x height x width bytes).
int64_t SampleWindow(const Trial& trial);

/// Tokens one sample trains on (for tokens per second): contextLength, or 1 (an image).
int64_t TokensPerSample(const Trial& trial);

/// The unit of the trial's throughput for people: "tokens/s", or "images/s" for image tasks
/// (results.json's tokensPerSecond counts an image as one token).
const char* ThroughputUnit(const Trial& trial);

/// "0.001", "8", "adamw".
std::string FormatParamValue(const ParamValue& value);

/// Manifest names of the fields that spec.search.grid may name.
std::vector<std::string> SearchableFields();

/// The rule of one searchable field of spec.model or spec.training: what `hydra validate` and
/// an agent's ValidateTrial enforce, and (kept equal by a test) the CRD's schema.
struct FieldRule {
  enum class Kind { kInt, kFloat, kEnum };
  std::string section;  ///< "model" | "training"
  std::string name;     ///< manifest name
  Kind kind = Kind::kInt;
  double min = 0;  ///< -inf: none
  bool min_exclusive = false;
  double max = 0;  ///< +inf: none
  std::vector<std::string> enums;
};

/// Every searchable field's rule, in the canonical grid order.
std::vector<FieldRule> SearchableFieldRules();

}  // namespace hydra
