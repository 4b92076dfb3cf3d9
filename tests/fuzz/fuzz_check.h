#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

namespace hydra::fuzz {

/// Fails the fuzz run (abort: libFuzzer saves the input) when a property of the code under test
/// does not hold. Used for properties, not for inputs the code is right to refuse.
inline void Require(bool holds, const std::string& property) {
  if (holds) return;
  std::fprintf(stderr, "fuzz property violated: %s\n", property.c_str());
  std::abort();
}

}  // namespace hydra::fuzz
