#pragma once
// A TorchScript model for the executor tests, written in C++ (torch::jit::Module::define): no
// Python needed.

#include <gtest/gtest.h>
#include <torch/script.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "agent/executor/model_loader.h"
#include "common/job.h"
#include "tests/unit/executor/executor_testing.h"

namespace hydra::executor::testing {

/// A TorchScript module of `spec`'s shape (an embedding, `layers` pre-LN attention blocks with a
/// ReLU MLP, a LayerNorm and LM head, GPT-2's layout written in TorchScript by hand, its
/// attention's scores kept as PyTorch's eager code keeps them) saved to `path`, and `spec`
/// pointed at it.
inline void SaveTorchScriptGpt(ModelSpec* spec, int64_t layers, int64_t width, int64_t heads,
                               const std::string& path) {
  const int64_t V = spec->vocab_size, T = spec->context_length, C = width;
  torch::manual_seed(0);
  const auto w = [](std::vector<int64_t> shape) { return 0.02 * torch::randn(shape); };
  const auto child = [](const std::string& type, const std::string& source,
                        const std::vector<std::pair<std::string, torch::Tensor>>& tensors) {
    torch::jit::Module m(type);
    for (const auto& [name, t] : tensors) {
      if (name == "mask") {
        m.register_buffer(name, t);
      } else {
        m.register_parameter(name, t, /*is_buffer=*/false);
      }
    }
    m.define(source);
    return m;
  };
  const std::string c = std::to_string(C), shape = ".view(b, t, " + std::to_string(heads) + ", " +
                                                   std::to_string(C / heads) + ").transpose(1, 2)";
  const std::string block = R"(
def forward(self, x):
    b = x.size(0)
    t = x.size(1)
    qkv = torch.linear(torch.layer_norm(x, [)" +
                            c + R"(], self.ln1_w, self.ln1_b, 1e-5), self.qkv_w, self.qkv_b)
    q = qkv.narrow(2, 0, )" +
                            c + ")" + shape + R"(
    k = qkv.narrow(2, )" + c +
                            ", " + c + ")" + shape + R"(
    v = qkv.narrow(2, )" + std::to_string(2 * C) +
                            ", " + c + ")" + shape + R"(
    att = torch.matmul(q, k.transpose(-2, -1)) * )" +
                            std::to_string(1.0 / std::sqrt(static_cast<double>(C / heads))) +
                            R"( + self.mask
    y = torch.matmul(torch.softmax(att, -1), v).transpose(1, 2).reshape(b, t, )" +
                            c + R"()
    x = x + torch.linear(y, self.proj_w, self.proj_b)
    hidden = torch.relu(torch.linear(torch.layer_norm(x, [)" +
                            c + R"(], self.ln2_w, self.ln2_b, 1e-5), self.fc_w, self.fc_b))
    return x + torch.linear(hidden, self.out_w, self.out_b)
)";
  torch::jit::Module model("Gpt");
  model.register_module("embed", child("Embed", R"(
def forward(self, idx):
    return torch.embedding(self.wte, idx) + self.wpe
)",
                                       {{"wte", w({V, C})}, {"wpe", w({T, C})}}));
  std::string chain = "self.embed.forward(idx)";
  for (int64_t i = 0; i < layers; ++i) {
    const std::string name = "block" + std::to_string(i);
    model.register_module(name, child("Block", block,
                                      {{"ln1_w", torch::ones({C})},
                                       {"ln1_b", torch::zeros({C})},
                                       {"qkv_w", w({3 * C, C})},
                                       {"qkv_b", torch::zeros({3 * C})},
                                       {"proj_w", w({C, C})},
                                       {"proj_b", torch::zeros({C})},
                                       {"ln2_w", torch::ones({C})},
                                       {"ln2_b", torch::zeros({C})},
                                       {"fc_w", w({4 * C, C})},
                                       {"fc_b", torch::zeros({4 * C})},
                                       {"out_w", w({C, 4 * C})},
                                       {"out_b", torch::zeros({C})},
                                       {"mask", torch::full({T, T}, -1e9).triu(1)}}));
    chain = "self." + name + ".forward(" + chain + ")";
  }
  model.register_module(
      "head",
      child("Head",
            R"(
def forward(self, x):
    return torch.linear(torch.layer_norm(x, [)" +
                c + R"(], self.ln_w, self.ln_b, 1e-5), self.lm_w)
)",
            {{"ln_w", torch::ones({C})}, {"ln_b", torch::zeros({C})}, {"lm_w", w({V, C})}}));
  model.define("def forward(self, idx):\n    return self.head.forward(" + chain + ")\n");
  model.save(path);
  spec->family = ModelFamily::kTorchScript;
  spec->path = spec->resolved_path = path;
}

/// A TorchScript GPT (4 blocks of width 32, 4 heads, context 256: its scores outweigh the
/// rest of a block 2 to 1) saved in `dir`, its children measured in `precision`.
inline Trial TorchScriptTrial(const std::filesystem::path& dir, Precision precision) {
  Trial t = GptTrial("ts", "adamw", 4, 32, 4, 256, 5, 3e-4);
  t.training.precision = precision;
  SaveTorchScriptGpt(&t.model, 4, 32, 4, (dir / "gpt.pt").string());
  const Status resolved = ResolveModel(&t);
  EXPECT_TRUE(resolved.ok()) << resolved;
  return t;
}

}  // namespace hydra::executor::testing
