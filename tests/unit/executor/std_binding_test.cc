// PyPI's CUDA LibTorch (libtorch.so) carries, and exports, its own copy of parts of libstdc++
// (std::filesystem among them). A program whose global symbol scope finds that copy first calls
// it instead of libstdc++'s: on an H200 machine (GCC 13, Ubuntu 24.04) std::filesystem::
// remove_all jumped to address 0 in every test that removed a directory. CMakeLists.txt lists
// libstdc++ first among each program's libraries; this test checks that the symbols resolve
// there (the order the dynamic loader searches, whatever the cause when it does not).
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "agent/executor/executor.h"

namespace hydra::executor {
namespace {

/// The file of the object whose definition of `symbol` the program's global scope finds first
/// ("" when no loaded object defines it).
std::string DefiningObject(const char* symbol) {
  void* address = dlsym(RTLD_DEFAULT, symbol);
  Dl_info info{};
  if (address == nullptr || dladdr(address, &info) == 0 || info.dli_fname == nullptr) return "";
  return info.dli_fname;
}

TEST(StdBindingTest, StdFilesystemResolvesToLibstdcxxNotToLibTorchsCopy) {
  // The calls the project makes most; their mangled names are the same in every libstdc++
  // since GCC 9 (the C++11 string ABI).
  const char* symbols[] = {
      "_ZNSt10filesystem10remove_allERKNS_7__cxx114pathE",
      "_ZNSt10filesystem10remove_allERKNS_7__cxx114pathERSt10error_code",
      "_ZNSt10filesystem18create_directoriesERKNS_7__cxx114pathE",
      "_ZNSt10filesystem19temp_directory_pathB5cxx11Ev",
      "_ZNSt10filesystem6statusERKNS_7__cxx114pathE",
      "_ZNSt10filesystem6renameERKNS_7__cxx114pathES3_",
  };
  for (const char* symbol : symbols) {
    const std::string object = DefiningObject(symbol);
    EXPECT_NE(object.find("libstdc++"), std::string::npos)
        << symbol << " resolves to " << (object.empty() ? "nothing" : object)
        << ", not to libstdc++.so.6; LD_PRELOAD="
        << (getenv("LD_PRELOAD") ? getenv("LD_PRELOAD") : "");
  }
  // And a call through it works (it jumped to address 0 where the binding went wrong).
  const auto dir = std::filesystem::temp_directory_path() / "hydra_std_binding_test";
  std::filesystem::create_directories(dir / "a");
  EXPECT_EQ(std::filesystem::remove_all(dir), 2u);
  EXPECT_EQ(std::filesystem::remove_all(dir), 0u);
}

}  // namespace
}  // namespace hydra::executor
