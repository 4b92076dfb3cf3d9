#include "common/host_memory.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

namespace hydra {
namespace {

namespace fs = std::filesystem;

/// v1 writes "no limit" as LONG_MAX rounded down to a page; anything this large is no limit.
constexpr int64_t kV1Unlimited = int64_t{1} << 62;

/// The first line of a limit file as bytes; nullopt for "max", unreadable or malformed files.
std::optional<int64_t> ReadLimit(const fs::path& file) {
  std::ifstream in(file);
  std::string text;
  if (!in || !std::getline(in, text) || text.empty() || text == "max") return std::nullopt;
  if (text.find_first_not_of("0123456789") != std::string::npos || text.size() > 19) {
    return std::nullopt;
  }
  const int64_t v = std::stoll(text);
  if (v <= 0 || v >= kV1Unlimited) return std::nullopt;
  return v;
}

/// The tightest `file` limit on the way from `dir` up to `root` (a cgroup's ancestors limit it
/// too; in a container with a cgroup namespace, `dir` is the root itself).
std::optional<int64_t> TightestUpwards(const fs::path& root, const std::string& cgroup_path,
                                       const char* file) {
  std::optional<int64_t> tightest;
  fs::path rel = fs::path(cgroup_path).relative_path().lexically_normal();
  if (rel.string() == ".") rel.clear();
  if (!rel.empty() && *rel.begin() == "..") return std::nullopt;  // outside our mount
  for (;;) {
    if (auto v = ReadLimit(root / rel / file)) tightest = tightest ? std::min(*tightest, *v) : *v;
    if (rel.empty()) break;
    rel = rel.parent_path();
  }
  return tightest;
}

/// The lines of /proc/self/cgroup: "0::/path" (v2), "N:memory:/path" or "N:cpu,memory:/path"
/// (v1). Returns the v2 path and the v1 memory path found, if any.
void ReadCgroupPaths(const std::string& file, std::optional<std::string>* v2,
                     std::optional<std::string>* v1_memory) {
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    const auto first = line.find(':');
    const auto second = first == std::string::npos ? first : line.find(':', first + 1);
    if (second == std::string::npos) continue;
    const std::string id = line.substr(0, first);
    const std::string controllers = line.substr(first + 1, second - first - 1);
    const std::string path = line.substr(second + 1);
    if (id == "0" && controllers.empty()) {
      *v2 = path;
      continue;
    }
    std::stringstream list(controllers);
    std::string c;
    while (std::getline(list, c, ',')) {
      if (c == "memory") *v1_memory = path;
    }
  }
}

}  // namespace

std::optional<int64_t> CgroupMemoryLimit(const HostMemorySources& sources) {
  std::optional<std::string> v2, v1;
  ReadCgroupPaths(sources.proc_self_cgroup, &v2, &v1);
  const fs::path root(sources.cgroup_root);
  if (v1) {
    // v1 (or hybrid, where memory stays on v1): the memory controller's own hierarchy.
    if (auto limit = TightestUpwards(root / "memory", *v1, "memory.limit_in_bytes")) return limit;
  }
  if (v2) return TightestUpwards(root, *v2, "memory.max");
  return std::nullopt;
}

int64_t DefaultHostMemoryBytes(const HostMemorySources& sources) {
  int64_t physical = sources.physical_bytes;
  if (physical < 0) {
    physical = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
  }
  if (auto limit = CgroupMemoryLimit(sources)) physical = std::min(physical, *limit);
  return static_cast<int64_t>(0.75 * static_cast<double>(physical));
}

}  // namespace hydra
