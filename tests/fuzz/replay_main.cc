// A main for the fuzz targets in builds without libFuzzer (gcc, the ASan build): runs
// LLVMFuzzerTestOneInput once over every input named on the command line, so that the seed
// corpora and the crash regressions are replayed by ctest in every build. Memory is capped at
// 4 GiB, so that an input that makes the code under test allocate without bound fails the test
// quickly instead of pushing the machine into swap or the OOM killer.

#include <sys/resource.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <system_error>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

#if defined(__SANITIZE_ADDRESS__)
#define HYDRA_REPLAY_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define HYDRA_REPLAY_ASAN 1
#endif
#endif

#ifdef HYDRA_REPLAY_ASAN
/// ASan reserves terabytes of address space, so RLIMIT_AS cannot cap it: its RSS limit does.
extern "C" const char* __asan_default_options() { return "hard_rss_limit_mb=4096"; }
#endif

namespace {

namespace fs = std::filesystem;

void LimitMemory() {
#ifndef HYDRA_REPLAY_ASAN
  const rlim_t bytes = rlim_t{4096} << 20;
  const rlimit limit{bytes, bytes};
  if (::setrlimit(RLIMIT_AS, &limit) != 0) std::perror("setrlimit(RLIMIT_AS)");
#endif
}

/// The files named, and the regular files directly inside the directories named, each group
/// sorted. A directory that does not exist counts as empty: regressions/<target>/ appears with
/// its first input.
std::vector<fs::path> Inputs(int argc, char** argv) {
  std::vector<fs::path> inputs;
  for (int i = 1; i < argc; ++i) {
    const fs::path arg(argv[i]);
    std::error_code ec;
    if (!fs::is_directory(arg, ec)) {
      if (fs::exists(arg, ec)) inputs.push_back(arg);
      continue;
    }
    std::vector<fs::path> found;
    for (const auto& entry : fs::directory_iterator(arg, ec)) {
      if (entry.is_regular_file(ec)) found.push_back(entry.path());
    }
    std::sort(found.begin(), found.end());
    inputs.insert(inputs.end(), found.begin(), found.end());
  }
  return inputs;
}

bool ReadBytes(const fs::path& path, std::vector<uint8_t>* bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  bytes->assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return !in.bad();
}

}  // namespace

int main(int argc, char** argv) {
  LimitMemory();
  const std::vector<fs::path> inputs = Inputs(argc, argv);
  if (inputs.empty()) {
    std::fprintf(stderr, "no inputs found in the paths given\n");
    return 1;
  }
  for (const auto& path : inputs) {
    std::vector<uint8_t> bytes;
    if (!ReadBytes(path, &bytes)) {
      std::fprintf(stderr, "cannot read %s\n", path.c_str());
      return 1;
    }
    std::printf("replaying %s (%zu bytes)\n", path.c_str(), bytes.size());
    std::fflush(stdout);
    LLVMFuzzerTestOneInput(bytes.data(), bytes.size());
  }
  std::printf("%zu inputs replayed without a crash\n", inputs.size());
  return 0;
}
