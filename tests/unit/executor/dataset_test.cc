#include "agent/executor/dataset.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>

#include "tests/fakes/temp_dir_test.h"

namespace hydra::executor {
namespace {

namespace fs = std::filesystem;

/// 40 tokens first, first + stride, ... as `width`-byte little-endian integers.
std::string LittleEndianTokens(uint32_t first, uint32_t stride, int width) {
  std::string bytes;
  for (uint32_t i = 0; i < 40; ++i) {
    const uint32_t tok = first + i * stride;
    for (int b = 0; b < width; ++b) bytes.push_back(static_cast<char>((tok >> (8 * b)) & 0xff));
  }
  return bytes;
}

class DatasetTest : public fakes::TempDirTest {
 protected:
  DatasetTest() : TempDirTest("hydra_dataset_test") {}
  DatasetSpec Write(const std::string& name, const std::string& bytes, const std::string& format) {
    std::ofstream(dir_ / name, std::ios::binary) << bytes;
    DatasetSpec spec;
    spec.format = *ParseName<DatasetFormat>(format);
    spec.path = name;
    spec.resolved_path = (dir_ / name).string();
    spec.validation_fraction = 0.25;
    return spec;
  }
};

TEST_F(DatasetTest, TextBytesAreTokens) {
  auto spec = Write("a.txt", "abcdefghijklmnopqrstuvwxyz012345", "text");
  auto ds = TokenDataset::Open(spec, 4);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ((*ds)->num_tokens(), 32);
  EXPECT_EQ((*ds)->train_tokens(), 24);
  EXPECT_EQ((*ds)->validation_tokens(), 8);
  EXPECT_EQ((*ds)->max_token(), 'z');
  int64_t out[3];
  (*ds)->Read(1, 3, out);
  EXPECT_EQ(out[0], 'b');
  EXPECT_EQ(out[2], 'd');
}

TEST_F(DatasetTest, TokensU16AreLittleEndian) {
  auto ds = TokenDataset::Open(Write("a.bin", LittleEndianTokens(1000, 300, 2), "tokens-u16"), 4);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ((*ds)->num_tokens(), 40);
  EXPECT_EQ((*ds)->max_token(), 1000 + 39 * 300);
  int64_t out[2];
  (*ds)->Read(2, 2, out);
  EXPECT_EQ(out[0], 1600);
  EXPECT_EQ(out[1], 1900);
}

TEST_F(DatasetTest, TokensU32AreLittleEndianAndPastSixteenBits) {
  const std::string bytes = LittleEndianTokens(70000, 100000, 4);
  auto ds = TokenDataset::Open(Write("a.bin", bytes, "tokens-u32"), 4);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ((*ds)->num_tokens(), 40);
  EXPECT_EQ((*ds)->max_token(), 70000 + 39 * 100000);
  int64_t out[2];
  (*ds)->Read(2, 2, out);
  EXPECT_EQ(out[0], 270000);
  EXPECT_EQ(out[1], 370000);
  auto cut = TokenDataset::Open(Write("c.bin", bytes.substr(0, 158), "tokens-u32"), 4);
  EXPECT_NE(cut.status().message().find("not a multiple of 4 bytes, so it is not a tokens-u32"),
            std::string::npos)
      << cut.status();
}

TEST_F(DatasetTest, ClearErrors) {
  DatasetSpec missing;
  missing.resolved_path = (dir_ / "nope.txt").string();
  auto ds = TokenDataset::Open(missing, 4);
  EXPECT_EQ(ds.status().code(), StatusCode::kNotFound);
  EXPECT_NE(ds.status().message().find("nope.txt"), std::string::npos);

  EXPECT_EQ(TokenDataset::Open(Write("e.txt", "", "text"), 4).status().code(),
            StatusCode::kInvalidArgument);
  auto odd = TokenDataset::Open(Write("o.bin", "abc", "tokens-u16"), 1);
  EXPECT_NE(odd.status().message().find("not a multiple of 2"), std::string::npos);
  auto small = TokenDataset::Open(Write("s.txt", "abcdefgh", "text"), 4);
  EXPECT_NE(small.status().message().find("contextLength + 1"), std::string::npos)
      << small.status();
  DatasetSpec dir_spec;
  dir_spec.resolved_path = dir_.string();
  EXPECT_EQ(TokenDataset::Open(dir_spec, 4).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(DatasetTest, TrainWindowsAreDeterministicInRangeAndVary) {
  std::string text(10000, 'x');
  auto ds = TokenDataset::Open(Write("big.txt", text, "text"), 65);
  ASSERT_TRUE(ds.ok());
  auto a = TrainWindowOffsets(**ds, 1, 5, 16, 65);
  auto b = TrainWindowOffsets(**ds, 1, 5, 16, 65);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, TrainWindowOffsets(**ds, 1, 6, 16, 65));
  EXPECT_NE(a, TrainWindowOffsets(**ds, 2, 5, 16, 65));
  std::set<int64_t> distinct;
  for (int step = 0; step < 50; ++step) {
    for (int64_t o : TrainWindowOffsets(**ds, 1, step, 16, 65)) {
      EXPECT_GE(o, 0);
      EXPECT_LE(o + 65, (*ds)->train_tokens());
      distinct.insert(o);
    }
  }
  EXPECT_GT(distinct.size(), 700u);
}

TEST_F(DatasetTest, ValidationWindowsCoverTheValidationSplit) {
  std::string text(10000, 'x');
  auto ds = TokenDataset::Open(Write("big.txt", text, "text"), 65);
  ASSERT_TRUE(ds.ok());
  auto v = ValidationWindowOffsets(**ds, 8, 65);
  ASSERT_EQ(v.size(), 8u);
  EXPECT_EQ(v.front(), (*ds)->train_tokens());
  EXPECT_EQ(v.back() + 65, (*ds)->num_tokens());
  for (size_t i = 1; i < v.size(); ++i) EXPECT_GT(v[i], v[i - 1]);
}

}  // namespace
}  // namespace hydra::executor
