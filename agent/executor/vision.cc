#include "agent/executor/vision.h"

#include <cmath>

namespace hydra::executor {
namespace {

/// Linear + optional ReLU, flattening its input first when asked (the MLP's first layer).
class DenseLayer : public SequentialLayer {
 public:
  DenseLayer(int64_t in, int64_t out, bool relu, bool flatten)
      : linear_(register_module("linear", torch::nn::Linear(in, out))),
        relu_(relu),
        flatten_(flatten) {}
  torch::Tensor forward(const torch::Tensor& input) override {
    auto x = flatten_ ? input.flatten(1) : input;
    x = linear_(x);
    return relu_ ? torch::relu(x) : x;
  }
  torch::nn::Linear& linear() { return linear_; }

 private:
  torch::nn::Linear linear_;
  bool relu_, flatten_;
};

/// Groups for GroupNorm over `channels`: 8 when they divide evenly, else 1 (LayerNorm-like).
int64_t Groups(int64_t channels) { return channels % 8 == 0 ? 8 : 1; }

/// GroupNorm in fp32 whatever the convolution computed in (bf16 under autocast): its
/// statistics stay fp32, as LayerNorm's do.
torch::Tensor Normalize(torch::nn::GroupNorm& norm, const torch::Tensor& x) {
  return norm(x.to(torch::kFloat));
}

torch::nn::Conv2d Conv(int64_t in, int64_t out, int64_t kernel, int64_t stride) {
  return torch::nn::Conv2d(
      torch::nn::Conv2dOptions(in, out, kernel).stride(stride).padding(kernel / 2).bias(false));
}

class StemLayer : public SequentialLayer {
 public:
  StemLayer(int64_t in, int64_t width)
      : conv_(register_module("conv", Conv(in, width, 3, 1))),
        norm_(register_module("norm", torch::nn::GroupNorm(Groups(width), width))) {}
  torch::Tensor forward(const torch::Tensor& x) override {
    return torch::relu(Normalize(norm_, conv_(x)));
  }

 private:
  torch::nn::Conv2d conv_;
  torch::nn::GroupNorm norm_;
};

class ResidualBlock : public SequentialLayer {
 public:
  ResidualBlock(int64_t in, int64_t out, int64_t stride)
      : conv1_(register_module("conv1", Conv(in, out, 3, stride))),
        norm1_(register_module("norm1", torch::nn::GroupNorm(Groups(out), out))),
        conv2_(register_module("conv2", Conv(out, out, 3, 1))),
        norm2_(register_module("norm2", torch::nn::GroupNorm(Groups(out), out))) {
    if (stride != 1 || in != out) shortcut_ = register_module("shortcut", Conv(in, out, 1, stride));
  }
  torch::Tensor forward(const torch::Tensor& x) override {
    auto y = torch::relu(Normalize(norm1_, conv1_(x)));
    y = Normalize(norm2_, conv2_(y));
    return torch::relu(y + (shortcut_ ? shortcut_(x) : x));
  }

 private:
  torch::nn::Conv2d conv1_;
  torch::nn::GroupNorm norm1_;
  torch::nn::Conv2d conv2_;
  torch::nn::GroupNorm norm2_;
  torch::nn::Conv2d shortcut_{nullptr};
};

class PoolHead : public SequentialLayer {
 public:
  PoolHead(int64_t width, int64_t classes)
      : linear_(register_module("linear", torch::nn::Linear(width, classes))) {}
  torch::Tensor forward(const torch::Tensor& x) override { return linear_(x.mean({2, 3})); }

 private:
  torch::nn::Linear linear_;
};

/// He (Kaiming normal, fan-in) for weights of 2+ dimensions, zero biases; GroupNorm weights 1.
/// The head's weights are LeCun-normal (std sqrt(1/fan_in)): logits of about unit scale, so
/// training starts near a loss of ln(numClasses) (He put it ~1.3 above; std 0.01 learned
/// 3x slower in examples/images/sweep.yaml).
void Initialise(SequentialLayer& layer, at::Generator& gen, bool head) {
  for (auto& p : layer.named_parameters(/*recurse=*/true)) {
    auto& t = p.value();
    const bool norm = p.key().find("norm") != std::string::npos;
    if (t.dim() >= 2) {
      const double fan_in = static_cast<double>(t.numel() / t.size(0));
      t.normal_(0.0, std::sqrt((head ? 1.0 : 2.0) / fan_in), gen);
    } else if (norm && p.key().find("weight") != std::string::npos) {
      t.fill_(1.0);
    } else {
      t.zero_();
    }
  }
}

/// Initialises `layer`, appends it to `seq` as `name` and reports it.
void Append(LayerSequence& seq, at::Generator& gen, const std::string& name,
            std::shared_ptr<SequentialLayer> layer,
            const std::function<void(const LayerSequence&, size_t)>& on_layer_built) {
  Initialise(*layer, gen, name == "head");
  seq.names.push_back(name);
  seq.layers.push_back(std::move(layer));
  if (on_layer_built) on_layer_built(seq, seq.layers.size() - 1);
}

}  // namespace

LayerSequence BuildMlp(const ModelSpec& spec, const std::vector<int64_t>& image_shape,
                       uint64_t seed,
                       const std::function<void(const LayerSequence&, size_t)>& on_layer_built) {
  torch::NoGradGuard no_grad;
  auto gen = at::detail::createCPUGenerator(seed);
  const int64_t pixels = image_shape[0] * image_shape[1] * image_shape[2];
  LayerSequence seq;
  auto add = [&](const std::string& name, std::shared_ptr<SequentialLayer> layer) {
    Append(seq, gen, name, std::move(layer), on_layer_built);
  };
  add("input", std::make_shared<DenseLayer>(pixels, spec.n_embd, true, true));
  for (int64_t i = 0; i < spec.n_layer; ++i) {
    add("hidden" + std::to_string(i),
        std::make_shared<DenseLayer>(spec.n_embd, spec.n_embd, true, false));
  }
  add("head", std::make_shared<DenseLayer>(spec.n_embd, spec.num_classes, false, false));
  return seq;
}

LayerSequence BuildResNet(const ModelSpec& spec, const std::vector<int64_t>& image_shape,
                          uint64_t seed,
                          const std::function<void(const LayerSequence&, size_t)>& on_layer_built) {
  torch::NoGradGuard no_grad;
  auto gen = at::detail::createCPUGenerator(seed);
  LayerSequence seq;
  auto add = [&](const std::string& name, std::shared_ptr<SequentialLayer> layer) {
    Append(seq, gen, name, std::move(layer), on_layer_built);
  };
  int64_t width = spec.n_embd;
  add("stem", std::make_shared<StemLayer>(image_shape[0], width));
  for (int64_t i = 0; i < spec.n_layer; ++i) {
    // Every third block doubles the channels and halves the resolution.
    const bool down = i % 3 == 2;
    const int64_t out = down ? 2 * width : width;
    add("block" + std::to_string(i), std::make_shared<ResidualBlock>(width, out, down ? 2 : 1));
    width = out;
  }
  add("head", std::make_shared<PoolHead>(width, spec.num_classes));
  return seq;
}

}  // namespace hydra::executor
