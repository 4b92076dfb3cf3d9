#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

/// Per-test scratch directories for tests that use real files.
namespace hydra::fakes {

/// <tmp>/<prefix>_<pid>_<running test's name>: unique to this process and test. Not created.
inline std::filesystem::path TestDirPath(const std::string& prefix) {
  return std::filesystem::temp_directory_path() /
         (prefix + "_" + std::to_string(::getpid()) + "_" +
          ::testing::UnitTest::GetInstance()->current_test_info()->name());
}

/// A fixture whose `dir_` is a fresh, empty TestDirPath(prefix) during each test, removed
/// after it.
class TempDirTest : public ::testing::Test {
 protected:
  explicit TempDirTest(std::string prefix) : prefix_(std::move(prefix)) {}
  void SetUp() override {
    dir_ = TestDirPath(prefix_);
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::filesystem::path dir_;

 private:
  std::string prefix_;
};

}  // namespace hydra::fakes
