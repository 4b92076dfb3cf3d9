// ResolveModel's measures of a TorchScript model's children: kept per file, shape and precision,
// measured once however many trials of one model start at once, fp32's shared by bf16 trials, a
// failed measure not left claimed.
#include "agent/executor/model_loader.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tests/unit/executor/executor_testing.h"
#include "tests/unit/executor/torchscript_testing.h"

namespace hydra::executor {
namespace {

class ModelLoaderTest : public ::testing::Test {
 protected:
  void SetUp() override { std::filesystem::create_directories(dir_); }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  /// A small TorchScript GPT saved as `file` (each file is measured on its own), unresolved.
  Trial Unresolved(const std::string& file, Precision precision) {
    Trial t = testing::GptTrial("ts", "adamw", 2, 32, 4, 64, 5, 3e-4);
    t.training.precision = precision;
    testing::SaveTorchScriptGpt(&t.model, 2, 32, 4, (dir_ / file).string());
    return t;
  }

  /// ResolveModel with the lines it says kept in notes_.
  Status Resolve(Trial* t) {
    return ResolveModel(t, [this](const std::string& line) {
      std::lock_guard<std::mutex> lock(mu_);
      notes_.push_back(line);
    });
  }

  /// Resolve on a thread of its own, with its result to wait for (InTime).
  std::future<Status> ResolveAsync(Trial* t) {
    auto done = std::make_shared<std::promise<Status>>();
    std::future<Status> result = done->get_future();
    std::thread([this, t, done] { done->set_value(Resolve(t)); }).detach();
    return result;
  }

  /// `result`, or the test binary ends after two minutes: a thread waiting on a claim that no
  /// thread holds waits forever.
  static Status InTime(std::future<Status>& result) {
    if (result.wait_for(std::chrono::minutes(2)) != std::future_status::ready) {
      std::fprintf(stderr, "ResolveModel still waiting after 2 minutes: a claim left behind\n");
      std::_Exit(1);
    }
    return result.get();
  }

  /// The notes that began a measure, each its precisions (" in fp32 and bf16 on").
  std::vector<std::string> Measures() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::string> in;
    for (const auto& n : notes_) {
      if (n.rfind("measuring", 0) != 0) continue;
      const size_t from = n.find(" in "), to = n.find(" on the CPU");
      in.push_back(n.substr(from + 4, to - from - 4));
    }
    notes_.clear();
    return in;
  }

  const std::filesystem::path dir_ =
      std::filesystem::temp_directory_path() / ("hydra_model_loader_" + std::to_string(::getpid()));
  std::mutex mu_;
  std::vector<std::string> notes_;
};

/// Both measured, child by child, to the byte.
void ExpectSameMemory(const std::vector<ModuleLayer>& a, const std::vector<ModuleLayer>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    SCOPED_TRACE(a[i].name);
    ASSERT_TRUE(a[i].memory && b[i].memory);
    EXPECT_EQ(a[i].memory->precision, b[i].memory->precision);
    EXPECT_EQ(a[i].memory->kept.per_sequence, b[i].memory->kept.per_sequence);
    EXPECT_EQ(a[i].memory->kept.fixed, b[i].memory->kept.fixed);
    EXPECT_EQ(a[i].memory->transient.per_sequence, b[i].memory->transient.per_sequence);
    EXPECT_EQ(a[i].memory->transient.fixed, b[i].memory->transient.fixed);
    EXPECT_EQ(a[i].output_elements, b[i].output_elements);
  }
}

TEST_F(ModelLoaderTest, TrialsOfOneModelStartedAtOnceMeasureItOnce) {
  // An agent prepares the trials the controller starts on gRPC's threads: a sweep's eight
  // trials of one model measured it eight times at once (eight times the time, and the host
  // memory of eight measures: a GPT-2-vocabulary head's logits at three sequences each).
  const Trial given = Unresolved("gpt.pt", Precision::kFp32);
  std::vector<Trial> trials(4, given);
  std::vector<std::future<Status>> resolved;
  for (auto& t : trials) resolved.push_back(ResolveAsync(&t));
  for (auto& r : resolved) {
    const Status s = InTime(r);
    ASSERT_TRUE(s.ok()) << s;
  }
  EXPECT_EQ(Measures(), std::vector<std::string>{"fp32"});
  ASSERT_EQ(trials[0].model.layers.size(), 4u);  // embedding, 2 blocks, head
  for (size_t i = 1; i < trials.size(); ++i) {
    ExpectSameMemory(trials[0].model.layers, trials[i].model.layers);
  }
}

TEST_F(ModelLoaderTest, ABf16TrialMeasuresFp32BesideBf16AndSharesIt) {
  // A bf16 trial plans with the larger of each child's fp32 and bf16 measure: an fp32 trial of
  // the same model afterwards measures nothing, and gets what a measure of fp32 alone gets.
  Trial bf16 = Unresolved("a.pt", Precision::kBf16);
  ASSERT_TRUE(Resolve(&bf16).ok());
  EXPECT_EQ(Measures(), std::vector<std::string>{"fp32 and bf16"});
  Trial fp32 = bf16;
  fp32.model.layers.clear();
  fp32.training.precision = Precision::kFp32;
  ASSERT_TRUE(Resolve(&fp32).ok());
  EXPECT_TRUE(Measures().empty());
  Trial alone = Unresolved("b.pt", Precision::kFp32);  // the same model, another file
  ASSERT_TRUE(Resolve(&alone).ok());
  EXPECT_EQ(Measures(), std::vector<std::string>{"fp32"});
  ExpectSameMemory(fp32.model.layers, alone.model.layers);
  for (const auto& l : bf16.model.layers) EXPECT_EQ(l.memory->precision, Precision::kBf16);
}

TEST_F(ModelLoaderTest, ABf16TrialAfterAnFp32OneMeasuresBf16Alone) {
  Trial fp32 = Unresolved("a.pt", Precision::kFp32);
  ASSERT_TRUE(Resolve(&fp32).ok());
  EXPECT_EQ(Measures(), std::vector<std::string>{"fp32"});
  Trial bf16 = fp32;
  bf16.training.precision = Precision::kBf16;  // measured in fp32: measured again
  ASSERT_TRUE(Resolve(&bf16).ok());
  EXPECT_EQ(Measures(), std::vector<std::string>{"bf16"});
  Trial both = Unresolved("b.pt", Precision::kBf16);  // both measured on one module
  ASSERT_TRUE(Resolve(&both).ok());
  EXPECT_EQ(Measures(), std::vector<std::string>{"fp32 and bf16"});
  ExpectSameMemory(bf16.model.layers, both.model.layers);
}

TEST_F(ModelLoaderTest, AFailedMeasureIsNotLeftClaimed) {
  // A file that is not a module fails with its path named, the next trial of it too (it
  // would wait forever on a claim no thread holds), and a good file at that path afterwards
  // loads (the failure is not kept either).
  Trial t = testing::GptTrial("ts", "adamw", 2, 32, 4, 64, 5, 3e-4);
  t.model.family = ModelFamily::kTorchScript;
  t.model.path = t.model.resolved_path = (dir_ / "bad.pt").string();
  { std::ofstream(t.model.resolved_path) << "not a TorchScript archive"; }
  for (int attempt = 0; attempt < 2; ++attempt) {
    Trial copy = t;
    auto result = ResolveAsync(&copy);
    const Status s = InTime(result);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find("bad.pt"), std::string::npos) << s;
  }
  Trial good = Unresolved("bad.pt", Precision::kFp32);  // rewritten: another size and time
  auto result = ResolveAsync(&good);
  const Status s = InTime(result);
  EXPECT_TRUE(s.ok()) << s;
}

}  // namespace
}  // namespace hydra::executor
