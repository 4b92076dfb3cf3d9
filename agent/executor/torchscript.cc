#include "agent/executor/torchscript.h"

#include <torch/script.h>
#include <torch/serialize.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "agent/executor/gpt2.h"
#include "agent/executor/hf_gpt2_init.h"
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
  if (trial.model.family == "mlp") {
    return BuildMlp(trial.model, trial.dataset.image_shape, seed, on_layer_built);
  }
  if (trial.model.family == "resnet") {
    return BuildResNet(trial.model, trial.dataset.image_shape, seed, on_layer_built);
  }
  if (trial.model.family != "torchscript") {
    if (trial.model.init) return BuildHfGpt2(trial.model, on_layer_built);
    return BuildGpt2(trial.model, seed, on_layer_built);
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
  return trial.model.family == "torchscript" || trial.model.family == "gpt2";
}

Status WriteModelFiles(const Trial& trial, const std::vector<NamedBuffer>& state,
                       const std::string& dir) {
  if (trial.model.family == "torchscript") {
    return WriteStateDictFromState(trial.model, state,
                                   (std::filesystem::path(dir) / "model.pt").string());
  }
  if (trial.model.family == "gpt2") return WriteHfGpt2(trial.model, state, dir);
  return OkStatus();
}

Status ResolveModel(Trial* trial) {
  if (trial->model.init) return OpenHfGpt2(trial->model).status();
  if (trial->model.family != "torchscript" || !trial->model.layers.empty()) return OkStatus();
  ASSIGN_OR_RETURN(LayerSequence seq, LoadTorchScript(trial->model));
  try {
    torch::NoGradGuard no_grad;
    auto x = SampleTokens(trial->model, 1);
    std::vector<ModuleLayer> layers;
    for (size_t i = 0; i < seq.layers.size(); ++i) {
      ModuleLayer l;
      l.name = seq.names[i];
      for (const auto& p : seq.layers[i]->parameters()) l.parameters += p.numel();
      for (const auto& p : seq.layers[i]->lent_parameters()) l.tied_parameters += p.numel();
      x = seq.layers[i]->forward(x);
      l.output_elements = x.numel();
      layers.push_back(l);
    }
    trial->model.layers = std::move(layers);
    return OkStatus();
  } catch (const std::exception& e) {
    return InvalidArgumentError(Where(trial->model) + ": " + Text(e));
  }
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
