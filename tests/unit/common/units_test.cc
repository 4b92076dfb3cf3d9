#include "common/units.h"

#include <gtest/gtest.h>

#include "common/status.h"

namespace hydra {
namespace {

TEST(UnitsTest, ParsesKubernetesQuantities) {
  EXPECT_EQ(*ParseByteQuantity("512Mi"), 512LL << 20);
  EXPECT_EQ(*ParseByteQuantity("4Gi"), 4LL << 30);
  EXPECT_EQ(*ParseByteQuantity("1G"), 1000000000LL);
  EXPECT_EQ(*ParseByteQuantity("1500k"), 1500000LL);
  EXPECT_EQ(*ParseByteQuantity("123"), 123LL);
  EXPECT_EQ(*ParseByteQuantity("1.5Gi"), 3LL << 29);
  EXPECT_EQ(*ParseByteQuantity("1e9"), 1000000000LL);
}

TEST(UnitsTest, RejectsBadQuantities) {
  for (const char* bad : {"", "abc", "12Mb", "-1Gi", "1e30Ei", "Mi"}) {
    auto q = ParseByteQuantity(bad);
    EXPECT_FALSE(q.ok()) << bad;
    if (!q.ok()) {
      EXPECT_EQ(q.status().code(), StatusCode::kInvalidArgument) << bad;
    }
  }
}

TEST(UnitsTest, Formats) {
  EXPECT_EQ(FormatBytes(812), "812 B");
  EXPECT_EQ(FormatBytes(512LL << 20), "512.0 MiB");
  EXPECT_EQ(FormatBytes(3LL << 29), "1.50 GiB");
  EXPECT_EQ(FormatDuration(42), "42s");
  EXPECT_EQ(FormatDuration(185), "3m05s");
  EXPECT_EQ(FormatDuration(3720), "1h02m");
}

TEST(StatusTest, ValuesAndContext) {
  Status s = InvalidArgumentError("bad");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.WithContext("job.yaml").ToString(), "INVALID_ARGUMENT: job.yaml: bad");
  EXPECT_EQ(ErrnoError("open x", ENOENT).code(), StatusCode::kNotFound);
  EXPECT_EQ(ErrnoError("write x", ENOSPC).code(), StatusCode::kResourceExhausted);
  StatusOr<int> v = 3;
  EXPECT_TRUE(v.ok());
  EXPECT_EQ(*v, 3);
  StatusOr<int> e = NotFoundError("x");
  EXPECT_EQ(e.status().code(), StatusCode::kNotFound);
}

Status Chain(bool fail) {
  auto inner = [&]() -> StatusOr<int> {
    if (fail) return DataLossError("inner");
    return 7;
  };
  ASSIGN_OR_RETURN(int v, inner());
  RETURN_IF_ERROR(v == 7 ? OkStatus() : InternalError("wrong"));
  return OkStatus();
}

TEST(StatusTest, Macros) {
  EXPECT_TRUE(Chain(false).ok());
  EXPECT_EQ(Chain(true).code(), StatusCode::kDataLoss);
}

}  // namespace
}  // namespace hydra
