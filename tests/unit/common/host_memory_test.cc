#include "common/host_memory.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "tests/fakes/temp_dir_test.h"

namespace hydra {
namespace {

namespace fs = std::filesystem;

/// A fake /proc/self/cgroup and /sys/fs/cgroup tree in a temporary directory.
class HostMemoryTest : public fakes::TempDirTest {
 protected:
  HostMemoryTest() : TempDirTest("hydra_host_memory_test") {}
  void SetUp() override {
    TempDirTest::SetUp();
    fs::create_directories(dir_ / "cgroup");
    sources_.proc_self_cgroup = (dir_ / "proc_self_cgroup").string();
    sources_.cgroup_root = (dir_ / "cgroup").string();
    sources_.physical_bytes = int64_t{64} << 30;
  }
  void Write(const fs::path& rel, const std::string& text) {
    const fs::path path = rel.is_absolute() ? rel : dir_ / "cgroup" / rel;
    fs::create_directories(path.parent_path());
    std::ofstream(path) << text;
  }
  void Membership(const std::string& text) { Write(sources_.proc_self_cgroup, text); }

  HostMemorySources sources_;
};

TEST_F(HostMemoryTest, CgroupV2TakesTheTightestLimitOnTheWayUp) {
  Membership("0::/kubepods/pod1/agent\n");
  Write("kubepods/pod1/agent/memory.max", "max\n");
  Write("kubepods/pod1/memory.max", "8589934592\n");
  Write("kubepods/memory.max", "17179869184\n");
  EXPECT_EQ(CgroupMemoryLimit(sources_), int64_t{8} << 30);
  EXPECT_EQ(DefaultHostMemoryBytes(sources_), int64_t{6} << 30) << "75% of the pod's 8 GiB";
}

TEST_F(HostMemoryTest, ACgroupNamespaceSeesItsOwnLimitAtTheRoot) {
  Membership("0::/\n");
  Write("memory.max", "4294967296\n");
  EXPECT_EQ(CgroupMemoryLimit(sources_), int64_t{4} << 30);
}

TEST_F(HostMemoryTest, CgroupV1MemoryControllerAndItsUnlimitedValue) {
  Membership("4:memory:/kubepods/burstable/pod2/c1\n3:cpu,cpuacct:/x\n0::/\n");
  Write("memory/kubepods/burstable/pod2/c1/memory.limit_in_bytes", "2147483648\n");
  EXPECT_EQ(CgroupMemoryLimit(sources_), int64_t{2} << 30);
  Write("memory/kubepods/burstable/pod2/c1/memory.limit_in_bytes", "9223372036854771712\n");
  EXPECT_EQ(CgroupMemoryLimit(sources_), std::nullopt) << "page-rounded LONG_MAX: no limit";
  // A v1 container without a cgroup namespace: its path is the host's, its mount its own.
  fs::remove_all(dir_ / "cgroup/memory/kubepods");
  Write("memory/memory.limit_in_bytes", "1073741824\n");
  EXPECT_EQ(CgroupMemoryLimit(sources_), int64_t{1} << 30);
}

TEST_F(HostMemoryTest, NoLimitOrUnreadableFilesLeaveTheRam) {
  EXPECT_EQ(CgroupMemoryLimit(sources_), std::nullopt) << "no /proc/self/cgroup";
  Membership("0::/a\n");
  EXPECT_EQ(CgroupMemoryLimit(sources_), std::nullopt) << "no memory.max";
  for (const char* bad : {"max\n", "-5\n", "lots\n", "\n", "99999999999999999999999\n"}) {
    Write("a/memory.max", bad);
    EXPECT_EQ(CgroupMemoryLimit(sources_), std::nullopt) << bad;
  }
  EXPECT_EQ(DefaultHostMemoryBytes(sources_), int64_t{48} << 30) << "75% of the 64 GiB of RAM";
  Membership("0::/../../etc\n");
  EXPECT_EQ(CgroupMemoryLimit(sources_), std::nullopt) << "a path outside the mount";
}

TEST_F(HostMemoryTest, ALimitAboveTheRamLeavesTheRam) {
  Membership("0::/\n");
  Write("memory.max", std::to_string(int64_t{128} << 30) + "\n");
  EXPECT_EQ(DefaultHostMemoryBytes(sources_), int64_t{48} << 30);
}

TEST(HostMemoryOnThisMachineTest, TheDefaultIsPositiveAndAtMostTheRam) {
  const int64_t ram = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
  const int64_t d = DefaultHostMemoryBytes();
  EXPECT_GT(d, 0);
  EXPECT_LE(d, ram);
}

}  // namespace
}  // namespace hydra
