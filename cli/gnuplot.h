#pragma once

#include <string>

#include "common/status.h"

namespace hydra::cli {

/// Runs `gnuplot script_path` and waits. UNAVAILABLE if gnuplot is not installed, INTERNAL if it
/// fails.
Status RunGnuplot(const std::string& script_path);

}  // namespace hydra::cli
