#include "agent/executor/hf_gpt2.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <nlohmann/json.hpp>

namespace hydra::executor {
namespace {

using ::testing::HasSubstr;

ModelSpec Tiny() {
  return {ModelFamily::kGpt2, /*n_layer=*/2, /*n_embd=*/4, /*n_head=*/2, /*context_length=*/6,
          /*vocab_size=*/10};
}

/// The executor's state of a model of `spec`: every element its own value (tensor index *
/// 1000 + element), and an optimizer buffer the export must skip.
std::vector<NamedBuffer> State(const ModelSpec& spec) {
  std::vector<NamedBuffer> out;
  int index = 0;
  for (const auto& t : HfGpt2Tensors(spec)) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    std::vector<float> v(n);
    for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>(index * 1000 + i);
    NamedBuffer b{t.ours, "float32", t.shape, std::vector<char>(n * 4)};
    std::memcpy(b.data.data(), v.data(), n * 4);
    out.push_back(b);
    ++index;
  }
  out.push_back({"embed.wte.exp_avg", "float32", {10, 4}, std::vector<char>(160)});
  return out;
}

float At(const SafetensorsHeader& h, const std::string& bytes, const std::string& name, int64_t i) {
  for (const auto& e : h.tensors) {
    if (e.name != name) continue;
    float v;
    std::memcpy(&v, bytes.data() + h.data_offset + e.begin + 4 * i, 4);
    return v;
  }
  ADD_FAILURE() << "no " << name;
  return 0;
}

TEST(HfGpt2Test, TheTableCoversTheModelLayerByLayer) {
  const auto tensors = HfGpt2Tensors(Tiny());
  ASSERT_EQ(tensors.size(), 2u + 12u * 2u + 2u);
  EXPECT_EQ(tensors.front().layer, 0u);
  EXPECT_EQ(tensors.back().layer, 3u);  // embed, block0, block1, head
  for (const auto& t : tensors) {
    if (t.transposed) {
      EXPECT_EQ(t.hf_shape, (std::vector<int64_t>{t.shape[1], t.shape[0]}));
    }
  }
}

TEST(HfGpt2Test, ExportWritesTransformersNamesAndConv1DLayouts) {
  const ModelSpec spec = Tiny();
  auto bytes = HfGpt2Safetensors(spec, State(spec));
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  auto h = ParseSafetensors(bytes->data(), bytes->size(), bytes->size(), "export");
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->tensors.size(), HfGpt2Tensors(spec).size());  // no optimizer state, no lm_head
  EXPECT_EQ(h->metadata.at("format"), "pt");
  EXPECT_TRUE(CheckHfGpt2(*h, spec, "export").ok());
  // block0.qkv.weight (table index 4) is ours [12, 4]; the file holds [4, 12]: the file's
  // element (r, c) is ours (c, r).
  for (int64_t r = 0; r < 4; ++r) {
    for (int64_t c = 0; c < 12; ++c) {
      EXPECT_EQ(At(*h, *bytes, "transformer.h.0.attn.c_attn.weight", r * 12 + c),
                4000.0f + static_cast<float>(c * 4 + r));
    }
  }
  EXPECT_EQ(At(*h, *bytes, "transformer.wte.weight", 7), 7.0f);
  const auto config = nlohmann::json::parse(HfGpt2Config(spec));
  EXPECT_EQ(config["n_layer"], 2);
  EXPECT_EQ(config["n_positions"], 6);
  EXPECT_EQ(config["activation_function"], "gelu_new");
  EXPECT_EQ(config["architectures"][0], "GPT2LMHeadModel");
}

/// A header of `spec`'s tensors as the file names them, changed by `edit`.
SafetensorsHeader Header(const ModelSpec& spec, bool prefixed = false) {
  SafetensorsHeader h;
  for (const auto& t : HfGpt2Tensors(spec)) {
    SafetensorsEntry e;
    e.name = (prefixed ? "transformer." : "") + t.hf;
    e.shape = t.hf_shape;
    h.tensors.push_back(e);
  }
  return h;
}

TEST(HfGpt2Test, TheCheckAcceptsGpt2sOwnLayoutsAndRefusesMismatchesNamingBothShapes) {
  const ModelSpec spec = Tiny();
  EXPECT_TRUE(CheckHfGpt2(Header(spec), spec, "m").ok());
  EXPECT_TRUE(CheckHfGpt2(Header(spec, true), spec, "m").ok());
  auto more_positions = Header(spec);
  more_positions.tensors[1].shape = {1024, 4};  // GPT-2's 1024 positions: the first 6 used
  more_positions.tensors[1].dtype = SafetensorsDtype::kBF16;
  more_positions.tensors.push_back({"h.0.attn.bias", SafetensorsDtype::kF32, {1, 1, 6, 6}});
  more_positions.tensors.push_back({"lm_head.weight", SafetensorsDtype::kF16, {10, 4}});
  EXPECT_TRUE(CheckHfGpt2(more_positions, spec, "m").ok());

  auto wide = Header(spec);
  wide.tensors[4].shape = {4, 13};
  Status s = CheckHfGpt2(wide, spec, "m.safetensors");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("m.safetensors: tensor 'h.0.attn.c_attn.weight' has "
                                     "shape [4,13], but the manifest's model needs [4,12]"));
  auto few_positions = Header(spec);
  few_positions.tensors[1].shape = {5, 4};
  EXPECT_THAT(CheckHfGpt2(few_positions, spec, "m").message(),
              HasSubstr("at least contextLength positions"));
  auto missing = Header(spec);
  missing.tensors.pop_back();
  EXPECT_THAT(CheckHfGpt2(missing, spec, "m").message(), HasSubstr("no tensor 'ln_f.bias'"));
  auto extra = Header(spec);
  extra.tensors.push_back({"h.2.ln_1.weight", SafetensorsDtype::kF32, {4}});
  EXPECT_THAT(CheckHfGpt2(extra, spec, "m").message(),
              HasSubstr("'h.2.ln_1.weight' is not part of a gpt2 model with nLayer 2"));
  auto ints = Header(spec);
  ints.tensors[0].dtype = SafetensorsDtype::kI64;
  EXPECT_THAT(CheckHfGpt2(ints, spec, "m").message(), HasSubstr("is I64, not F32, BF16 or F16"));
  auto both = Header(spec);
  both.tensors.push_back({"transformer.wte.weight", SafetensorsDtype::kF32, {10, 4}});
  EXPECT_THAT(CheckHfGpt2(both, spec, "m").message(), HasSubstr("with and without"));
}

TEST(HfGpt2Test, ExportRefusesAStateOfAnotherModel) {
  ModelSpec spec = Tiny();
  auto state = State(spec);
  spec.n_embd = 8;
  EXPECT_EQ(HfGpt2Safetensors(spec, state).status().code(), StatusCode::kInvalidArgument);
  state.erase(state.begin());
  EXPECT_THAT(HfGpt2Safetensors(Tiny(), state).status().message(), HasSubstr("'embed.wte'"));
}

}  // namespace
}  // namespace hydra::executor
