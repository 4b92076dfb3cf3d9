#include "agent/executor/torchscript.h"

#include <torch/script.h>
#include <torch/serialize.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <set>

#include "agent/executor/batches.h"
#include "agent/executor/gpt2.h"
#include "agent/executor/hf_gpt2_init.h"
#include "agent/executor/layer_memory.h"
#include "agent/executor/tensor_buffers.h"
#include "agent/executor/vision.h"
#include "common/file_util.h"

namespace hydra::executor {
namespace {

namespace fs = std::filesystem;

/// One top-level child of a TorchScript module as a layer. Its parameters are the module's own
/// tensors (shared storage), registered here so that the executors see them as parameters of
/// an ordinary layer; moving or updating them updates the module.
class TorchScriptLayer : public SequentialLayer {
 public:
  TorchScriptLayer(std::string child_name, torch::jit::Module child,
                   const std::set<c10::TensorImpl*>& earlier, std::set<c10::TensorImpl*>* seen)
      : child_name_(std::move(child_name)), child_(std::move(child)) {
    int i = 0;
    for (const auto& p : child_.named_parameters(/*recurse=*/true)) {
      c10::TensorImpl* impl = p.value.unsafeGetTensorImpl();
      if (earlier.count(impl)) {
        borrowed_.push_back(p.value);  // owned by an earlier child (tied weights)
        continue;
      }
      if (!seen->insert(impl).second) continue;  // used twice inside this child
      // nn::Module names may not contain dots; the position keeps them unique.
      std::string name = p.name;
      for (char& ch : name) ch = ch == '.' ? '_' : ch;
      register_parameter("p" + std::to_string(i++) + "_" + name, p.value, /*requires_grad=*/true);
    }
    // Its buffers too (a causal mask, position ids), so that moving the layer to a GPU moves
    // them with it; a buffer shared with an earlier child moves once, through either.
    int b = 0;
    for (const auto& buf : child_.named_buffers(/*recurse=*/true)) {
      std::string name = buf.name;
      for (char& ch : name) ch = ch == '.' ? '_' : ch;
      register_buffer("b" + std::to_string(b++) + "_" + name, buf.value);
    }
  }

  torch::Tensor forward(const torch::Tensor& input) override {
    return child_.forward({input}).toTensor();
  }
  std::vector<torch::Tensor> borrowed_parameters() const override { return borrowed_; }
  std::vector<torch::Tensor> lent_parameters() const override { return lent_; }
  void Lend(const torch::Tensor& t) { lent_.push_back(t); }

  const std::string& child_name() const { return child_name_; }
  const torch::jit::Module& child() const { return child_; }

 private:
  std::string child_name_;
  torch::jit::Module child_;
  std::vector<torch::Tensor> borrowed_, lent_;
};

/// An exception's message without LibTorch's C++ backtrace, at most `max` bytes. The
/// TorchScript interpreter throws std::runtime_error (with the script's traceback), LibTorch
/// itself c10::Error.
std::string Text(const std::exception& e, size_t max = 300) {
  const auto* c10 = dynamic_cast<const c10::Error*>(&e);
  std::string what = c10 ? c10->what_without_backtrace() : e.what();
  // The interpreter's message ends with the Python error line: keep that, it names the problem.
  const auto last = what.find_last_of('\n', what.size() > 1 ? what.size() - 2 : 0);
  if (!c10 && last != std::string::npos && what.size() > max) what = what.substr(last + 1);
  while (!what.empty() && (what.back() == '\n' || what.back() == ' ')) what.pop_back();
  return what.size() > max ? what.substr(0, max) + "..." : what;
}

std::string Where(const ModelSpec& spec) { return "spec.model.path: " + spec.resolved_path; }

StatusOr<torch::jit::Module> LoadModule(const ModelSpec& spec) {
  std::error_code ec;
  if (!fs::is_regular_file(spec.resolved_path, ec)) {
    return NotFoundError(Where(spec) + " does not exist or is not a file");
  }
  try {
    auto m = torch::jit::load(spec.resolved_path, torch::kCPU);
    m.train();
    return m;
  } catch (const std::exception& e) {
    const std::string what = Text(e);
    if (what.find("PytorchStreamReader") != std::string::npos ||
        what.find("zip archive") != std::string::npos) {
      return InvalidArgumentError(Where(spec) +
                                  " is not a TorchScript archive (save the model with "
                                  "torch.jit.save(torch.jit.script(model), path)): " +
                                  what.substr(0, 200));
    }
    if (what.find("version") != std::string::npos ||
        what.find("Unknown builtin op") != std::string::npos ||
        what.find("schema") != std::string::npos) {
      return InvalidArgumentError(
          Where(spec) + " was saved by a PyTorch this LibTorch (" + std::string(TORCH_VERSION) +
          ") cannot read; export it with PyTorch <= " + std::string(TORCH_VERSION) + ": " +
          what.substr(0, 300));
    }
    return InvalidArgumentError(Where(spec) + " cannot be loaded: " + what.substr(0, 300));
  }
}

/// A sample batch: `batch` sequences of token ids, fixed (not the training data).
torch::Tensor SampleTokens(const ModelSpec& spec, int64_t batch) {
  auto gen = torch::make_generator<at::CPUGeneratorImpl>(12345);
  return torch::randint(spec.vocab_size, {batch, spec.context_length}, gen, torch::kLong);
}

}  // namespace

StatusOr<LayerSequence> BuildModel(
    const Trial& trial, const std::function<void(const LayerSequence&, size_t)>& on_layer_built) {
  const auto seed = static_cast<uint64_t>(trial.training.seed);
  switch (trial.model.family) {
    case ModelFamily::kMlp:
      return BuildMlp(trial.model, trial.dataset.image_shape, seed, on_layer_built);
    case ModelFamily::kResNet:
      return BuildResNet(trial.model, trial.dataset.image_shape, seed, on_layer_built);
    case ModelFamily::kGpt2:
      if (trial.model.init) return BuildHfGpt2(trial.model, on_layer_built);
      return BuildGpt2(trial.model, seed, on_layer_built);
    case ModelFamily::kTorchScript: break;
  }
  ASSIGN_OR_RETURN(LayerSequence seq, LoadTorchScript(trial.model));
  if (on_layer_built) {
    for (size_t i = 0; i < seq.layers.size(); ++i) on_layer_built(seq, i);
  }
  return seq;
}

StatusOr<LayerSequence> LoadTorchScript(const ModelSpec& spec) {
  ASSIGN_OR_RETURN(torch::jit::Module module, LoadModule(spec));
  try {
    LayerSequence seq;
    std::set<c10::TensorImpl*> earlier;
    std::vector<std::shared_ptr<TorchScriptLayer>> layers;
    for (const auto& c : module.named_children()) {
      std::set<c10::TensorImpl*> mine;
      auto layer = std::make_shared<TorchScriptLayer>(c.name, c.value, earlier, &mine);
      for (const auto& b : layer->borrowed_parameters()) {
        for (auto& owner : layers) {
          for (const auto& p : owner->parameters()) {
            if (p.unsafeGetTensorImpl() == b.unsafeGetTensorImpl()) owner->Lend(p);
          }
        }
      }
      earlier.insert(mine.begin(), mine.end());
      layers.push_back(layer);
      seq.names.push_back(c.name);
    }
    if (layers.empty()) {
      return InvalidArgumentError(
          Where(spec) +
          " has no child modules: export an nn.Sequential, or a module whose children (in "
          "the order they are assigned) make up its forward");
    }
    for (auto& l : layers) {
      for (const auto& p : l->parameters()) {
        if (p.scalar_type() != torch::kFloat) {
          return InvalidArgumentError(Where(spec) + ": parameter of child '" + l->child_name() +
                                      "' is " + std::string(c10::toString(p.scalar_type())) +
                                      "; Hydra trains fp32 parameters");
        }
      }
      seq.layers.push_back(l);
    }
    // Sequential: its children in order must compute what the module's forward computes.
    {
      torch::NoGradGuard no_grad;
      const auto x = SampleTokens(spec, 2);
      torch::Tensor whole;
      try {
        whole = module.forward({x}).toTensor();
      } catch (const std::exception& e) {
        return InvalidArgumentError(
            Where(spec) + ": forward() does not take a [batch, contextLength] tensor of token " +
            "ids and return one tensor: " + Text(e));
      }
      torch::Tensor chained;
      try {
        chained = seq.Forward(x);
      } catch (const std::exception& e) {
        return InvalidArgumentError(
            Where(spec) + " is not sequential: running its children in order fails (" +
            Text(e, 200) +
            "); export an nn.Sequential, or list the stages as the module's children in order");
      }
      if (!chained.sizes().equals(whole.sizes()) || !torch::allclose(chained, whole, 1e-5, 1e-6)) {
        return InvalidArgumentError(
            Where(spec) +
            " is not sequential: its children run in order do not compute its forward(); "
            "export an nn.Sequential, or list the stages as the module's children in order");
      }
      if (whole.dim() != 3 || whole.size(0) != 2 || whole.size(1) != spec.context_length ||
          whole.size(2) != spec.vocab_size) {
        std::ostringstream got;
        got << whole.sizes();
        return InvalidArgumentError(
            Where(spec) + ": forward() must return logits of shape [batch, " +
            std::to_string(spec.context_length) + ", " + std::to_string(spec.vocab_size) +
            "] (contextLength, vocabSize), got " + got.str());
      }
    }
    // Trainable: one forward and backward through every child.
    try {
      const auto x = SampleTokens(spec, 1);
      auto logits = seq.Forward(x);
      logits.sum().backward();
    } catch (const std::exception& e) {
      return InvalidArgumentError(Where(spec) +
                                  " uses an operation that cannot be trained: " + Text(e));
    }
    for (auto& l : layers) {
      for (auto& p : l->parameters()) p.mutable_grad() = torch::Tensor();
    }
    return seq;
  } catch (const std::exception& e) {
    return InvalidArgumentError(Where(spec) + ": " + Text(e));
  }
}

bool HasModelFiles(const Trial& trial) {
  return trial.model.family == ModelFamily::kTorchScript ||
         trial.model.family == ModelFamily::kGpt2;
}

Status WriteModelFiles(const Trial& trial, const std::vector<NamedBuffer>& state,
                       const std::string& dir) {
  if (trial.model.family == ModelFamily::kTorchScript) {
    return WriteStateDictFromState(trial.model, state,
                                   (std::filesystem::path(dir) / "model.pt").string());
  }
  if (trial.model.family == ModelFamily::kGpt2) return WriteHfGpt2(trial.model, state, dir);
  return OkStatus();
}

namespace {

/// The memory of a micro-batch of any size, from its measures at two and three sequences (at one,
/// some reshapes are views that copy at more). Where three took less than two (not a line: the
/// graph ran another way at three), every byte counts as per sequence: more than either measure.
ModuleLayer::Memory Fit(const LayerMemory& two, const LayerMemory& three) {
  const auto fit = [](int64_t at_two, int64_t at_three) {
    ModuleLayer::Bytes b;
    if (at_three < at_two) {
      b.per_sequence = (at_two + 1) / 2;
      return b;
    }
    b.per_sequence = at_three - at_two;
    b.fixed = std::max<int64_t>(0, at_two - 2 * b.per_sequence);
    return b;
  };
  ModuleLayer::Memory m;
  m.kept = fit(two.kept, three.kept);
  m.transient = fit(two.transient, three.transient);
  return m;
}

/// Child `i` of `seq`'s training memory in `precision`, measured on `x` (its input for three
/// sequences) and its first two, after a run of each that is not measured: TorchScript's executor
/// optimises a graph after profiling its first run, and in bf16 that run kept a third less; the
/// last child's with the trial's loss of `targets`. Kept counts the input too, which a child
/// keeps where it saves it (a LayerNorm does): inside a shard nothing else counts it (at a
/// shard's first child the boundary counts it again, on the safe side).
ModuleLayer::Memory MeasureChild(const Trial& trial, LayerSequence& seq, size_t i,
                                 const torch::Tensor& x, const torch::Tensor& targets,
                                 Precision precision) {
  std::function<torch::Tensor(const torch::Tensor&)> loss;
  if (i + 1 == seq.layers.size()) {
    loss = [&](const torch::Tensor& out) {
      return TaskLoss(trial, out, targets.narrow(0, 0, out.size(0)));
    };
  }
  const bool input_grad = x.is_floating_point();
  const auto measure = [&](int64_t sequences) {
    const torch::Tensor input = x.narrow(0, 0, sequences);
    LayerMemory m = MeasureLayerMemory(*seq.layers[i], input, precision, input_grad, loss);
    m.kept += static_cast<int64_t>(input.nbytes());
    return m;
  };
  measure(2);
  measure(3);
  const LayerMemory two = measure(2);
  return Fit(two, measure(3));
}

/// Child `i`'s memory in `precision` as measured (MeasureChild); in bf16 less the weights' casts,
/// which TrialCosts counts (2 bytes a parameter, the tied ones' charged to the last layer).
ModuleLayer::Memory MeasuredIn(const Trial& trial, LayerSequence& seq, size_t i,
                               const std::vector<ModuleLayer>& layers, const torch::Tensor& x,
                               const torch::Tensor& tokens, Precision precision) {
  ModuleLayer::Memory m = MeasureChild(trial, seq, i, x, tokens, precision);
  m.precision = precision;
  if (precision == Precision::kBf16) {
    int64_t tied = 0;
    for (const auto& l : layers) tied += l.tied_parameters;
    const ModuleLayer& l = layers[i];
    const bool last = i + 1 == layers.size();
    m.kept.fixed = std::max<int64_t>(
        0, m.kept.fixed - 2 * (l.parameters - l.tied_parameters + (last ? tied : 0)));
  }
  return m;
}

/// Every child's memory in each of `precisions` (one copy of `layers` a precision, its
/// ModuleLayer::memory measured in that precision alone) and its output's size.
std::vector<std::vector<ModuleLayer>> MeasureChildren(const Trial& trial, LayerSequence& seq,
                                                      const std::vector<ModuleLayer>& layers,
                                                      const std::vector<Precision>& precisions) {
  std::vector<std::vector<ModuleLayer>> measured(precisions.size(), layers);
  const torch::Tensor tokens = SampleTokens(trial.model, 3);
  torch::Tensor x = tokens;
  for (size_t i = 0; i < seq.layers.size(); ++i) {
    for (size_t p = 0; p < precisions.size(); ++p) {
      measured[p][i].memory = MeasuredIn(trial, seq, i, layers, x, tokens, precisions[p]);
    }
    torch::NoGradGuard no_grad;
    x = seq.layers[i]->forward(x);
    // Per sequence, whatever the output's layout ([sequences * tokens, width] too).
    for (auto& m : measured) m[i].output_elements = x.numel() / tokens.size(0);
  }
  return measured;
}

/// The layers a trial plans with: fp32's measure, or in bf16 per child the larger of fp32's and
/// bf16's (CPU autocast keeps some values in fp32 that CUDA's keeps in bf16, and the other way).
StatusOr<std::vector<ModuleLayer>> InTrialPrecision(const Trial& trial,
                                                    std::vector<ModuleLayer> fp32,
                                                    const std::vector<ModuleLayer>* bf16) {
  if (bf16 == nullptr) return fp32;
  if (bf16->size() != fp32.size()) {  // measured by two threads, the file rewritten between
    return FailedPreconditionError(
        Where(trial.model) + " changed while it was measured (" + std::to_string(fp32.size()) +
        " children in fp32, " + std::to_string(bf16->size()) + " in bf16): start the trial again");
  }
  for (size_t i = 0; i < fp32.size(); ++i) {
    ModuleLayer::Memory& m = *fp32[i].memory;
    const ModuleLayer::Memory& b = *(*bf16)[i].memory;
    for (auto [to, from] : {std::pair{&m.kept, &b.kept}, std::pair{&m.transient, &b.transient}}) {
      to->per_sequence = std::max(to->per_sequence, from->per_sequence);
      to->fixed = std::max(to->fixed, from->fixed);
    }
    m.precision = trial.training.precision;
  }
  return fp32;
}

/// What a module file's children measure in one precision, by everything the measure depends
/// on, shared by the process's threads: the trials of a sweep over one model measure it once,
/// even when they start at once (a thread that finds another measuring waits for its result).
class MeasuredModules {
 public:
  static MeasuredModules& Shared() {
    static MeasuredModules* m = new MeasuredModules();
    return *m;
  }
  /// The file (its path, size and modification time), the sequence's shape and the precision:
  /// read once per claim, so that a file rewritten during a measure cannot part a claim from
  /// its result.
  static std::string Key(const Trial& t, Precision precision) {
    std::error_code ec;
    const auto size = fs::file_size(t.model.resolved_path, ec);
    const auto time = fs::last_write_time(t.model.resolved_path, ec).time_since_epoch().count();
    return t.model.resolved_path + "|" + std::to_string(size) + "|" + std::to_string(time) + "|" +
           std::to_string(t.model.context_length) + "|" + std::to_string(t.model.vocab_size) + "|" +
           PrecisionName(precision);
  }
  /// The layers measured under `key`, or, where no thread has measured them or is doing so,
  /// nothing: the caller has then claimed them and must Add or Abandon. Threads that need both
  /// precisions take fp32's first, so no two wait on each other.
  std::optional<std::vector<ModuleLayer>> FindOrClaim(const std::string& key) {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      auto it = known_.find(key);
      if (it == known_.end()) {
        known_.emplace(key, std::nullopt);
        return std::nullopt;
      }
      if (it->second) return it->second;
      measured_.wait(lock);
    }
  }
  void Add(const std::string& key, std::vector<ModuleLayer> layers) {
    std::lock_guard<std::mutex> lock(mu_);
    known_[key] = std::move(layers);
    measured_.notify_all();
  }
  /// A claim whose measure failed: a waiting thread claims it in turn (and fails as clearly).
  void Abandon(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    known_.erase(key);
    measured_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable measured_;
  /// Unset: a thread is measuring it.
  std::map<std::string, std::optional<std::vector<ModuleLayer>>> known_;
};

/// The precisions of a trial's module that a thread claimed in MeasuredModules, abandoned when
/// it goes unless fulfilled: a failed measure (or an exception) leaves no claim that other
/// threads would wait on forever.
class Claims {
 public:
  Claims() = default;
  Claims(const Claims&) = delete;
  Claims& operator=(const Claims&) = delete;
  ~Claims() {
    for (const auto& key : keys_) MeasuredModules::Shared().Abandon(key);
  }
  void Add(Precision p, std::string key) {
    open_.push_back(p);
    keys_.push_back(std::move(key));
  }
  const std::vector<Precision>& open() const { return open_; }
  /// `measured`: the layers measured in each open precision, in order.
  void Fulfil(std::vector<std::vector<ModuleLayer>> measured) {
    for (size_t c = 0; c < keys_.size(); ++c) {
      MeasuredModules::Shared().Add(keys_[c], std::move(measured[c]));
    }
    open_.clear();
    keys_.clear();
  }

 private:
  std::vector<Precision> open_;
  std::vector<std::string> keys_;  // MeasuredModules::Key, per open precision
};

/// Each child's name, parameters (its own and tied) and buffers (counted at the first child that
/// has them).
std::vector<ModuleLayer> Children(const LayerSequence& seq) {
  std::vector<ModuleLayer> layers;
  std::set<const void*> buffers;
  for (size_t i = 0; i < seq.layers.size(); ++i) {
    ModuleLayer l;
    l.name = seq.names[i];
    for (const auto& p : seq.layers[i]->parameters()) l.parameters += p.numel();
    for (const auto& p : seq.layers[i]->lent_parameters()) l.tied_parameters += p.numel();
    for (const auto& b : seq.layers[i]->buffers(/*recurse=*/true)) {
      if (buffers.insert(b.unsafeGetTensorImpl()).second) l.buffer_bytes += b.nbytes();
    }
    layers.push_back(l);
  }
  return layers;
}

/// Loads the trial's module and measures its children in `precisions` (claimed in
/// MeasuredModules), telling `note` what it does, which takes a while on a large model.
StatusOr<std::vector<std::vector<ModuleLayer>>> LoadAndMeasure(
    const Trial& trial, const std::vector<Precision>& precisions, const ModelNote& note) {
  ASSIGN_OR_RETURN(LayerSequence seq, LoadTorchScript(trial.model));
  try {
    const std::vector<ModuleLayer> layers = Children(seq);
    std::string in;
    for (Precision p : precisions)
      in += (in.empty() ? "" : " and ") + std::string(PrecisionName(p));
    note("measuring the training memory of " + std::to_string(layers.size()) + " children of " +
         trial.model.resolved_path + " in " + in + " on the CPU (2 and 3 sequences of " +
         std::to_string(trial.model.context_length) +
         " tokens; once per file, shape and precision)");
    const auto start = std::chrono::steady_clock::now();
    auto measured = MeasureChildren(trial, seq, layers, precisions);
    char took[32];
    std::snprintf(took, sizeof(took), "%.1f s",
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    note("measured " + trial.model.resolved_path + " in " + took);
    return measured;
  } catch (const std::exception& e) {
    return InvalidArgumentError(Where(trial.model) + ": " + Text(e));
  }
}

}  // namespace

void NoteToStderr(const std::string& line) {
  // The program's name (glibc's): "hydra: ..." from the CLI, "hydra-agent: ..." from an agent.
  std::fprintf(stderr, "%s: %s\n", program_invocation_short_name, line.c_str());
}

Status ResolveModel(Trial* trial, const ModelNote& note) {
  if (trial->model.init) return OpenHfGpt2(trial->model).status();
  if (trial->model.family != ModelFamily::kTorchScript) return OkStatus();
  const auto& known = trial->model.layers;
  if (!known.empty() &&
      (!known.front().memory || known.front().memory->precision == trial->training.precision)) {
    return OkStatus();  // loaded, and measured in this precision (or given, unmeasured)
  }
  std::vector<Precision> needed = {Precision::kFp32};
  if (trial->training.precision == Precision::kBf16) needed.push_back(Precision::kBf16);
  std::vector<std::optional<std::vector<ModuleLayer>>> found;  // per precision needed
  Claims claims;
  for (Precision p : needed) {
    std::string key = MeasuredModules::Key(*trial, p);
    found.push_back(MeasuredModules::Shared().FindOrClaim(key));
    if (!found.back()) claims.Add(p, std::move(key));
  }
  if (!claims.open().empty()) {
    ASSIGN_OR_RETURN(auto measured, LoadAndMeasure(*trial, claims.open(), note));
    for (size_t c = 0; c < measured.size(); ++c) {
      const Precision p = claims.open()[c];
      found[std::find(needed.begin(), needed.end(), p) - needed.begin()] = measured[c];
    }
    claims.Fulfil(std::move(measured));
  }
  ASSIGN_OR_RETURN(trial->model.layers, InTrialPrecision(*trial, std::move(*found[0]),
                                                         found.size() > 1 ? &*found[1] : nullptr));
  return OkStatus();
}

Status SaveStateDictForPython(const LayerSequence& model, const std::string& path) {
  try {
    c10::Dict<std::string, torch::Tensor> dict;
    for (const auto& layer : model.layers) {
      auto* ts = dynamic_cast<const TorchScriptLayer*>(layer.get());
      if (ts == nullptr) return InvalidArgumentError("not a TorchScript model");
      for (const auto& p : ts->child().named_parameters(true)) {
        dict.insert(ts->child_name() + "." + p.name, p.value.detach().cpu().clone());
      }
      for (const auto& b : ts->child().named_buffers(true)) {
        dict.insert(ts->child_name() + "." + b.name, b.value.detach().cpu().clone());
      }
    }
    const std::vector<char> bytes = torch::pickle_save(dict);
    return WriteFileAtomically(path, std::string(bytes.begin(), bytes.end()));
  } catch (const std::exception& e) {
    return InternalError("writing " + path + ": " + Text(e));
  }
}

Status WriteStateDictFromState(const ModelSpec& spec, const std::vector<NamedBuffer>& state,
                               const std::string& path) {
  ASSIGN_OR_RETURN(LayerSequence seq, LoadTorchScript(spec));
  try {
    torch::NoGradGuard no_grad;
    // The state also holds optimizer moments: only the parameters are wanted.
    RETURN_IF_ERROR(CopyBuffersInto(state, seq.NamedParameters(), /*allow_extra=*/true));
  } catch (const std::exception& e) {
    return InternalError("restoring weights for " + path + ": " + Text(e));
  }
  return SaveStateDictForPython(seq, path);
}

}  // namespace hydra::executor
