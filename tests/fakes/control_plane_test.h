#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "tests/fakes/control_plane.h"

namespace hydra::fakes {

/// A test fixture whose suite shares one test control plane (kube-apiserver + etcd with the
/// MultiModelJob CRD) in a temporary directory: call StartSuite from SetUpTestSuite. Every test
/// fails at once if the control plane did not start. One such suite per test binary.
class ControlPlaneTest : public ::testing::Test {
 protected:
  static void StartSuite(const std::string& name) {
    dir_ = std::filesystem::temp_directory_path() /
           ("hydra-envtest-" + name + "-" + std::to_string(::getpid()));
    const std::string error = StartControlPlaneWithCrd(dir_);
    ok_ = error.empty();
    if (!ok_) std::fprintf(stderr, "%s\n", error.c_str());
  }
  static void TearDownTestSuite() { StopControlPlane(dir_); }
  void SetUp() override { ASSERT_TRUE(ok_) << "the test control plane did not start"; }

  static inline std::filesystem::path dir_;
  static inline bool ok_ = false;
};

}  // namespace hydra::fakes
