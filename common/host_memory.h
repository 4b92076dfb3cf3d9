#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace hydra {

/// Where the memory limits are read from; tests point these at a fake tree.
struct HostMemorySources {
  std::string proc_self_cgroup = "/proc/self/cgroup";
  std::string cgroup_root = "/sys/fs/cgroup";
  int64_t physical_bytes = -1;  ///< the node's RAM; < 0: from sysconf
};

/// The memory limit of this process's cgroup in bytes, the tightest of its cgroup and their
/// ancestors: v1's memory.limit_in_bytes where the memory controller is on v1 (v1 or hybrid
/// hierarchies), else v2's memory.max; nullopt when
/// there is no limit ("max", or v1's page-rounded LONG_MAX) or none can be read. In a pod this
/// is the container's memory limit, which the node's RAM says nothing about.
std::optional<int64_t> CgroupMemoryLimit(const HostMemorySources& sources = {});

/// The memory that can hold trials' state by default: 75% of the smaller of the node's RAM
/// and the cgroup's limit (the rest is for the process itself, the page cache, the kernel).
int64_t DefaultHostMemoryBytes(const HostMemorySources& sources = {});

}  // namespace hydra
