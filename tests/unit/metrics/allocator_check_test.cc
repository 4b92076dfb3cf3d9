#include "agent/metrics/allocator_check.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace hydra::agent {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kGiB = int64_t{1} << 30;

DeviceSpec Gpu(int index) {
  DeviceSpec d;
  d.kind = DeviceKind::kCuda;
  d.index = index;
  d.name = "cuda:" + std::to_string(index);
  d.uuid = "GPU-" + std::to_string(index);
  return d;
}

TEST(AllocatorLedgerCheckTest, SaysOnceWhenAGpuGoesOverItsLedgerAndOnceWhenItIsBack) {
  AllocatorLedgerCheck check;
  const int64_t ledger = 10 * kGiB;
  const int64_t edge = ledger + AllocatorLedgerCheck::SlackBytes(ledger);
  EXPECT_EQ(check.Observe(Gpu(0), ledger, {edge, edge}), "");  // slack: not over
  const std::string over = check.Observe(Gpu(0), ledger, {edge + 1, 12 * kGiB});
  EXPECT_THAT(over, HasSubstr("cuda:0 (GPU-0): LibTorch's caching allocator holds"));
  EXPECT_THAT(over, HasSubstr("12.0 GiB reserved"));
  EXPECT_THAT(over, HasSubstr("accounts 10.0 GiB"));
  EXPECT_THAT(over, HasSubstr("under-counts"));
  EXPECT_EQ(check.Observe(Gpu(0), ledger, {12 * kGiB, 13 * kGiB}), "");  // still over: quiet
  EXPECT_EQ(check.Observe(Gpu(1), ledger, {12 * kGiB, 13 * kGiB}).empty(), false);  // per GPU
  EXPECT_THAT(check.Observe(Gpu(0), ledger, {9 * kGiB, edge}), HasSubstr("back within"));
  EXPECT_EQ(check.Observe(Gpu(0), ledger, {9 * kGiB, edge}), "");
}

TEST(AllocatorLedgerCheckTest, SaysWhenOnlyTheCacheIsOverTheLedger) {
  AllocatorLedgerCheck check;
  const int64_t ledger = 10 * kGiB;
  const int64_t edge = ledger + AllocatorLedgerCheck::SlackBytes(ledger);
  const std::string cache = check.Observe(Gpu(0), ledger, {9 * kGiB, edge + 1});
  EXPECT_THAT(cache, HasSubstr("cuda:0 (GPU-0): LibTorch's caching allocator reserves more"));
  EXPECT_THAT(cache, HasSubstr("9.00 GiB in tensors"));
  EXPECT_THAT(cache, HasSubstr("ledger 10.0 GiB"));
  EXPECT_THAT(cache, HasSubstr("other processes on the GPU cannot"));
  EXPECT_EQ(check.Observe(Gpu(0), ledger, {8 * kGiB, 14 * kGiB}), "");  // still: quiet
  // The tensors going over too is the worse reading, said at once.
  EXPECT_THAT(check.Observe(Gpu(0), ledger, {edge + 1, 14 * kGiB}), HasSubstr("under-counts"));
  EXPECT_THAT(check.Observe(Gpu(0), ledger, {9 * kGiB, 14 * kGiB}), HasSubstr("reserves more"));
  // A finished trial's cached blocks on a GPU whose ledger is empty now.
  EXPECT_THAT(check.Observe(Gpu(1), 0, {0, 3 * kGiB}), HasSubstr("reserves more"));
  EXPECT_THAT(check.Observe(Gpu(0), ledger, {9 * kGiB, 10 * kGiB}), HasSubstr("back within"));
}

TEST(AllocatorLedgerCheckTest, TheSlackCoversWorkspacesAndGrowsWithTheLedger) {
  EXPECT_EQ(AllocatorLedgerCheck::SlackBytes(0), kGiB);
  EXPECT_EQ(AllocatorLedgerCheck::SlackBytes(20 * kGiB), 2 * kGiB);
  // An idle GPU whose allocator still holds a finished trial's tensors is over a zero ledger.
  AllocatorLedgerCheck check;
  EXPECT_NE(check.Observe(Gpu(0), 0, {kGiB + 1, kGiB}), "");
}

}  // namespace
}  // namespace hydra::agent
