#include "cli/export.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "agent/executor/checkpoint.h"
#include "agent/executor/hf_gpt2.h"
#include "common/file_util.h"
#include "common/job_json.h"
#include "tests/fakes/temp_dir_test.h"

namespace hydra::cli {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class ExportTest : public fakes::TempDirTest {
 protected:
  ExportTest() : TempDirTest("hydra_export") {}

  static Trial Gpt2() {
    Trial t;
    t.name = "ft-lr1e-3";
    t.model = {ModelFamily::kGpt2, /*n_layer=*/1, /*n_embd=*/8, /*n_head=*/2, /*context_length=*/4,
               /*vocab_size=*/20};
    return t;
  }
  /// A checkpoint of `step` for `t` as the scheduler writes it: every model tensor (filled with
  /// `fill`) plus an optimizer buffer, the model in its meta unless `with_model` is false.
  void Checkpoint(const Trial& t, int64_t step, float fill, bool with_model = true) {
    executor::CheckpointData c;
    c.meta = {{"trial", t.name}, {"step", step}};
    if (with_model) c.meta["model"] = TrialConfigJson(t)["model"];
    for (const auto& e : executor::HfGpt2Tensors(t.model)) {
      int64_t n = 1;
      for (int64_t d : e.shape) n *= d;
      std::vector<float> v(static_cast<size_t>(n), fill);
      executor::NamedBuffer b{e.ours, "float32", e.shape, {}};
      b.data.assign(reinterpret_cast<const char*>(v.data()),
                    reinterpret_cast<const char*>(v.data() + n));
      c.buffers.push_back(b);
      b.name += ".exp_avg";
      c.buffers.push_back(b);
    }
    executor::CheckpointStore store((dir_ / "run" / "trials" / t.name / "checkpoints").string(), 5);
    ASSERT_TRUE(store.Save(step, c).ok());
  }
  StatusOr<ExportReport> Export(const std::string& trial, std::vector<std::string>* w = nullptr) {
    std::vector<std::string> ignored;
    return ExportTrial((dir_ / "run").string(), trial, (dir_ / "out").string(), w ? w : &ignored);
  }
};

TEST_F(ExportTest, WritesTheNewestCheckpointAsAHuggingFaceDirectory) {
  Checkpoint(Gpt2(), 10, 0.5f);
  Checkpoint(Gpt2(), 20, 0.25f);
  auto r = Export("ft-lr1e-3");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->step, 20);
  EXPECT_THAT(r->checkpoint, HasSubstr("ckpt-0000000020"));
  auto file = executor::SafetensorsFile::Open((dir_ / "out" / "model.safetensors").string());
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_TRUE(executor::CheckHfGpt2(file->header(), Gpt2().model, "export").ok());
  const auto* wte = file->Find("transformer.wte.weight");
  ASSERT_NE(wte, nullptr);
  float first = 0;
  std::memcpy(&first, file->Data(*wte), 4);
  EXPECT_EQ(first, 0.25f) << "the newest checkpoint's weights";
  auto config = nlohmann::json::parse(*ReadFile((dir_ / "out" / "config.json").string()));
  EXPECT_EQ(config["n_layer"], 1);
  EXPECT_EQ(config["vocab_size"], 20);
}

TEST_F(ExportTest, ACorruptNewestCheckpointFallsBackWithAWarning) {
  Checkpoint(Gpt2(), 10, 0.5f);
  Checkpoint(Gpt2(), 20, 0.25f);
  const fs::path newest = dir_ / "run/trials/ft-lr1e-3/checkpoints/ckpt-0000000020.hck";
  fs::resize_file(newest, fs::file_size(newest) / 2);
  std::vector<std::string> warnings;
  auto r = Export("ft-lr1e-3", &warnings);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->step, 10);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_THAT(warnings[0], HasSubstr("ckpt-0000000020"));
}

TEST_F(ExportTest, RefusalsNameTheProblem) {
  EXPECT_THAT(Export("ft-lr1e-3").status().message(), HasSubstr("not a hydra run output"));
  Checkpoint(Gpt2(), 10, 0.5f);
  auto unknown = Export("ft-lr3e-4");
  EXPECT_EQ(unknown.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(unknown.status().message(), HasSubstr("its trials: ft-lr1e-3"));
  EXPECT_THAT(Export("../../etc").status().message(), HasSubstr("not a trial name"));

  Trial old = Gpt2();
  old.name = "old";
  Checkpoint(old, 10, 0.5f, /*with_model=*/false);
  EXPECT_THAT(Export("old").status().message(), HasSubstr("does not record its model"));

  Trial ts = Gpt2();
  ts.name = "ts";
  ts.model.family = ModelFamily::kTorchScript;
  Checkpoint(ts, 10, 0.5f);
  EXPECT_THAT(Export("ts").status().message(), HasSubstr("only gpt2 exports"));

  fs::create_directories(dir_ / "run/trials/empty/checkpoints");
  EXPECT_THAT(Export("empty").status().message(), HasSubstr("no intact checkpoint"));
}

}  // namespace
}  // namespace hydra::cli
