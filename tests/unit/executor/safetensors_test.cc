#include "agent/executor/safetensors.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include "common/file_util.h"
#include "tests/fakes/temp_dir_test.h"

namespace hydra::executor {
namespace {

using ::testing::HasSubstr;

/// A file of `header` (its length prefixed) and `data_bytes` zero bytes.
std::string Raw(const std::string& header, size_t data_bytes) {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);  // x86-64: little-endian
  return out + header + std::string(data_bytes, '\0');
}

Status Parse(const std::string& file) {
  return ParseSafetensors(file.data(), file.size(), file.size(), "m.safetensors").status();
}

TEST(SafetensorsTest, WrittenFilesReadBackTensorByTensor) {
  const float w[6] = {1, 2, 3, 4, 5, 6};
  const uint16_t h[2] = {0x3f80, 0x4000};  // bf16 1.0 and 2.0
  auto bytes = SerializeSafetensors({{"wte.weight", SafetensorsDtype::kF32, {2, 3}, w, sizeof(w)},
                                     {"ln.bias", SafetensorsDtype::kBF16, {2}, h, sizeof(h)}},
                                    {{"format", "pt"}});
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  uint64_t n = 0;
  std::memcpy(&n, bytes->data(), 8);
  EXPECT_EQ(n % 8, 0u);
  auto header = ParseSafetensors(bytes->data(), bytes->size(), bytes->size(), "x");
  ASSERT_TRUE(header.ok()) << header.status();
  EXPECT_EQ(header->metadata.at("format"), "pt");
  ASSERT_EQ(header->tensors.size(), 2u);
  EXPECT_EQ(header->tensors[0].name, "wte.weight");  // in the order of their data
  EXPECT_EQ(header->tensors[0].shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(header->tensors[1].dtype, SafetensorsDtype::kBF16);
  EXPECT_EQ(header->tensors[1].numel(), 2);
}

class SafetensorsFileTest : public fakes::TempDirTest {
 protected:
  SafetensorsFileTest() : TempDirTest("hydra_safetensors_") {}
  /// `tensors` serialized to model.safetensors in the test's directory, then opened.
  StatusOr<SafetensorsFile> Written(const std::vector<SafetensorsTensor>& tensors) {
    auto bytes = SerializeSafetensors(tensors, {});
    if (!bytes.ok()) return bytes.status();
    const std::string path = (dir_ / "model.safetensors").string();
    RETURN_IF_ERROR(WriteFileAtomically(path, *bytes));
    return SafetensorsFile::Open(path);
  }
};

TEST_F(SafetensorsFileTest, ReleasedPagesReadBackFromTheFile) {
  std::vector<float> big(5000);  // several pages, not page-aligned in the file
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<float>(i) * 0.25f;
  const float small[3] = {1, 2, 3};
  auto file =
      Written({{"s", SafetensorsDtype::kF32, {3}, small, sizeof(small)},
               {"big", SafetensorsDtype::kF32, {5000}, big.data(), big.size() * sizeof(float)}});
  ASSERT_TRUE(file.ok()) << file.status();
  const auto* e = file->Find("big");
  ASSERT_NE(e, nullptr);
  ASSERT_EQ(std::memcmp(file->Data(*e), big.data(), big.size() * 4), 0);
  file->Release(*e);
  file->Release(*file->Find("s"));  // within one page: nothing to drop
  EXPECT_EQ(std::memcmp(file->Data(*e), big.data(), big.size() * 4), 0);
  EXPECT_EQ(std::memcmp(file->Data(*file->Find("s")), small, sizeof(small)), 0);
}

TEST_F(SafetensorsFileTest, AMappedFileGivesEachTensorsBytesInPlace) {
  const float w[4] = {0.5f, -1.5f, 2.0f, 8.0f};
  const int64_t ids[2] = {7, 9};
  auto file = Written({{"a", SafetensorsDtype::kF32, {4}, w, sizeof(w)},
                       {"b", SafetensorsDtype::kI64, {1, 2}, ids, sizeof(ids)}});
  ASSERT_TRUE(file.ok()) << file.status();
  const auto* a = file->Find("a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(std::memcmp(file->Data(*a), w, sizeof(w)), 0);
  const auto* b = file->Find("b");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(std::memcmp(file->Data(*b), ids, sizeof(ids)), 0);
  EXPECT_EQ(file->Find("c"), nullptr);
  SafetensorsFile moved(std::move(file).value());
  EXPECT_EQ(std::memcmp(moved.Data(*moved.Find("a")), w, sizeof(w)), 0);
  EXPECT_EQ(SafetensorsFile::Open((dir_ / "none.safetensors").string()).status().code(),
            StatusCode::kNotFound);
}

TEST_F(SafetensorsFileTest, ATruncatedFileIsRefusedNamingIt) {
  const float w[4] = {1, 2, 3, 4};
  auto bytes = SerializeSafetensors({{"a", SafetensorsDtype::kF32, {4}, w, sizeof(w)}}, {});
  const std::string path = (dir_ / "cut.safetensors").string();
  ASSERT_TRUE(WriteFileAtomically(path, bytes->substr(0, bytes->size() - 3)).ok());
  Status s = SafetensorsFile::Open(path).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr(path));
  EXPECT_THAT(s.message(), HasSubstr("tensor 'a'"));
  ASSERT_TRUE(WriteFileAtomically(path, "abc").ok());
  EXPECT_THAT(SafetensorsFile::Open(path).status().message(), HasSubstr("too short"));
  ASSERT_TRUE(WriteFileAtomically(path, bytes->substr(0, 20)).ok());
  EXPECT_THAT(SafetensorsFile::Open(path).status().message(), HasSubstr("runs past the end"));
}

TEST(SafetensorsTest, MalformedHeadersAreRefusedNamingTheProblem) {
  const std::string ok_a = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  struct Case {
    std::string file, message;
  };
  const std::vector<Case> cases = {
      {Raw("{" + ok_a + R"(,"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12),
       "tensor 'b' (bytes 4..12) overlaps tensor 'a' (bytes 0..8)"},
      {Raw(R"({"a":{"dtype":"F31","shape":[2],"data_offsets":[0,8]}})", 8), "dtype \"F31\""},
      {Raw(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8),
       "data_offsets span 8 bytes, but shape [3] of F32 is 12 bytes"},
      {Raw(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8), "dimension"},
      {Raw(R"({"a":{"dtype":"F32","shape":[1048576,1048576,1048576],"data_offsets":[0,8]}})", 8),
       "over 2^50"},
      {Raw("{" + ok_a + R"(,"b":{"dtype":"U8","shape":[2],"data_offsets":[10,12]}})", 12),
       "data bytes 8..10 belong to no tensor"},
      {Raw("{" + ok_a + "}", 9), "data bytes 8..9 after the last tensor"},
      {Raw(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
           8),
       "names tensor 'a' twice"},
      {Raw(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}})", 8),
       "unknown field 'x'"},
      {Raw(R"({"a":{"dtype":"F32","shape":[2]}})", 8), "needs dtype, shape and data_offsets"},
      {Raw(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8), "do not lie"},
      {Raw(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8,9]}})", 8), "[begin, end]"},
      {Raw(R"({"__metadata__":{"k":1},)" + ok_a + "}", 8), "__metadata__ 'k'"},
      {Raw(R"( {})", 0), "does not start with '{'"},
      {Raw(R"({"a":)", 0), "not valid JSON"},
      {Raw(R"([1])", 0), "does not start with '{'"},
  };
  for (const auto& c : cases) {
    Status s = Parse(c.file);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << c.message;
    EXPECT_THAT(s.message(), HasSubstr(c.message));
    EXPECT_THAT(s.message(), HasSubstr("m.safetensors"));
  }
  std::string huge(8, '\0');
  const uint64_t n = kMaxSafetensorsHeaderBytes + 1;
  std::memcpy(huge.data(), &n, 8);
  EXPECT_THAT(Parse(huge).message(), HasSubstr("over the limit"));
  // Empty tensors take no bytes and may share an offset.
  EXPECT_TRUE(Parse(Raw(R"({"e":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},)" + ok_a +
                            R"(,"f":{"dtype":"I8","shape":[2,0],"data_offsets":[8,8]}})",
                        8))
                  .ok());
}

TEST(SafetensorsTest, TheWriterRefusesBytesThatDoNotMakeTheShapeAndRepeatedNames) {
  const float w[2] = {1, 2};
  EXPECT_EQ(
      SerializeSafetensors({{"a", SafetensorsDtype::kF32, {3}, w, sizeof(w)}}, {}).status().code(),
      StatusCode::kInvalidArgument);
  EXPECT_EQ(SerializeSafetensors({{"a", SafetensorsDtype::kF32, {2}, w, sizeof(w)},
                                  {"a", SafetensorsDtype::kF32, {2}, w, sizeof(w)}},
                                 {})
                .status()
                .code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace hydra::executor
