#include "agent/executor/hf_gpt2_init.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <deque>
#include <fstream>

#include "agent/executor/gpt2.h"
#include "agent/executor/model_loader.h"
#include "agent/executor/tensor_buffers.h"
#include "agent/executor/torchscript.h"
#include "common/file_util.h"
#include "tests/fakes/temp_dir_test.h"

namespace hydra::executor {
namespace {

class HfGpt2InitTest : public fakes::TempDirTest {
 protected:
  HfGpt2InitTest() : TempDirTest("hydra_hf_gpt2_init_") {}
  static ModelSpec Spec() {
    return {ModelFamily::kGpt2, /*n_layer=*/2, /*n_embd=*/16, /*n_head=*/2, /*context_length=*/8,
            /*vocab_size=*/40};
  }
  static std::vector<NamedBuffer> StateOf(const LayerSequence& seq) {
    std::vector<NamedBuffer> out;
    for (const auto& [name, p] : seq.NamedParameters()) out.push_back(TensorToBuffer(name, p));
    return out;
  }
  /// Loads every layer of a fresh model (another seed) from `path`.
  LayerSequence Loaded(const std::string& path) {
    auto file = SafetensorsFile::Open(path);
    EXPECT_TRUE(file.ok()) << file.status();
    EXPECT_TRUE(CheckHfGpt2(file->header(), Spec(), path).ok());
    LayerSequence seq = BuildGpt2(Spec(), 2);
    for (size_t i = 0; i < seq.layers.size(); ++i) {
      Status s = LoadHfGpt2Layer(*file, Spec(), seq, i);
      EXPECT_TRUE(s.ok()) << s;
    }
    return seq;
  }
  static torch::Tensor Logits(const LayerSequence& seq) {
    torch::NoGradGuard g;
    torch::Tensor x = torch::arange(16, torch::kLong).remainder(40).view({2, 8});
    for (const auto& l : seq.layers) x = l->forward(x);
    return x;
  }
};

TEST_F(HfGpt2InitTest, AnExportedModelLoadsBackExactly) {
  const LayerSequence a = BuildGpt2(Spec(), 1);
  auto bytes = HfGpt2Safetensors(Spec(), StateOf(a));
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  const std::string path = (dir_ / "model.safetensors").string();
  ASSERT_TRUE(WriteFileAtomically(path, *bytes).ok());
  const LayerSequence b = Loaded(path);
  const auto pa = a.NamedParameters(), pb = b.NamedParameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_TRUE(torch::equal(pa[i].second, pb[i].second)) << pa[i].first;
  }
  EXPECT_TRUE(torch::equal(Logits(a), Logits(b)));
}

TEST_F(HfGpt2InitTest, Bf16AndF16CheckpointsWidenToFp32AndExtraPositionsAreCut) {
  const LayerSequence a = BuildGpt2(Spec(), 1);
  // The HF layout of `a`, re-typed: wte as BF16, wpe with 20 positions as F16, the rest F32.
  auto f32 = HfGpt2Safetensors(Spec(), StateOf(a));
  ASSERT_TRUE(f32.ok());
  auto header = ParseSafetensors(f32->data(), f32->size(), f32->size(), "f32");
  ASSERT_TRUE(header.ok());
  std::deque<torch::Tensor> keep;
  std::vector<SafetensorsTensor> tensors;
  for (const auto& e : header->tensors) {
    auto t = torch::from_blob(const_cast<char*>(f32->data() + header->data_offset + e.begin),
                              e.shape, torch::kFloat)
                 .clone();
    SafetensorsDtype dtype = SafetensorsDtype::kF32;
    if (e.name == "transformer.wte.weight") {
      t = t.to(torch::kBFloat16);
      dtype = SafetensorsDtype::kBF16;
    } else if (e.name == "transformer.wpe.weight") {
      t = torch::cat({t, torch::full({12, 16}, 7.0f)}).to(torch::kHalf);
      dtype = SafetensorsDtype::kF16;
    }
    keep.push_back(t.contiguous());
    tensors.push_back({e.name.substr(12), dtype, keep.back().sizes().vec(), keep.back().data_ptr(),
                       static_cast<size_t>(keep.back().nbytes())});
  }
  auto bytes = SerializeSafetensors(tensors, {});
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  const std::string path = (dir_ / "mixed.safetensors").string();
  ASSERT_TRUE(WriteFileAtomically(path, *bytes).ok());
  const LayerSequence b = Loaded(path);
  const auto pa = a.NamedParameters(), pb = b.NamedParameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    torch::Tensor want = pa[i].second;
    if (pa[i].first == "embed.wte") want = want.to(torch::kBFloat16).to(torch::kFloat);
    if (pa[i].first == "embed.wpe") want = want.to(torch::kHalf).to(torch::kFloat);
    EXPECT_TRUE(torch::equal(pb[i].second, want)) << pa[i].first;
  }
}

/// spec.model.init: the trial's model and its checkpoint.
Trial InitTrial(const std::string& path, int64_t n_embd = 16) {
  Trial t;
  t.name = "t";
  t.model = {ModelFamily::kGpt2, /*n_layer=*/2, n_embd, /*n_head=*/2, /*context_length=*/8,
             /*vocab_size=*/40};
  ModelInit init;
  init.path = init.resolved_path = path;
  t.model.init = init;
  return t;
}

TEST_F(HfGpt2InitTest, ATrialWithInitStartsFromTheWrittenModel) {
  const LayerSequence a = BuildGpt2(Spec(), 1);
  ASSERT_TRUE(WriteHfGpt2(Spec(), StateOf(a), (dir_ / "hf").string()).ok());
  Trial t = InitTrial((dir_ / "hf" / "model.safetensors").string());
  t.training.seed = 99;  // another seed: the weights come from the file
  ASSERT_TRUE(ResolveModel(&t).ok());
  std::vector<size_t> seen;
  auto b = BuildModel(t, [&](const LayerSequence&, size_t layer) { seen.push_back(layer); });
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(seen, (std::vector<size_t>{0, 1, 2, 3})) << "layer by layer, in order";
  EXPECT_TRUE(torch::equal(Logits(a), Logits(*b)));
}

TEST_F(HfGpt2InitTest, ACheckpointThatDoesNotFitTheManifestIsRefusedBeforeTraining) {
  const LayerSequence a = BuildGpt2(Spec(), 1);
  ASSERT_TRUE(WriteHfGpt2(Spec(), StateOf(a), (dir_ / "hf").string()).ok());
  const std::string path = (dir_ / "hf" / "model.safetensors").string();
  Trial wider = InitTrial(path, /*n_embd=*/32);
  Status s = ResolveModel(&wider);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), ::testing::HasSubstr("spec.model.init.path: " + path));
  EXPECT_THAT(s.message(), ::testing::HasSubstr("'transformer.wte.weight' has shape [40,16]"));
  Trial missing = InitTrial((dir_ / "nope.safetensors").string());
  s = ResolveModel(&missing);
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_THAT(s.message(), ::testing::HasSubstr("spec.model.init.path: "));
  Trial sharded = InitTrial((dir_ / "model.safetensors.index.json").string());
  std::ofstream(dir_ / "model.safetensors.index.json") << "{}";
  EXPECT_THAT(ResolveModel(&sharded).message(), ::testing::HasSubstr("a sharded checkpoint"));
  std::ofstream(dir_ / "cut.safetensors") << std::string("\x10\0\0\0\0\0\0\0{\"a\":", 13);
  Trial cut = InitTrial((dir_ / "cut.safetensors").string());
  EXPECT_EQ(ResolveModel(&cut).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace hydra::executor
