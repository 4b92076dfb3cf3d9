#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace hydra {

/// A device that trains trials: a CUDA GPU, or a CPU device with a memory budget.
struct DeviceSpec {
  std::string name;          ///< "cpu:0", "cuda:1"
  int64_t memory_bytes = 0;  ///< device memory (a CPU device's budget)
};

/// Parses the --devices flag of hydra-agent: "cpu:N" or "cpu:N,budget=Q" (Q a byte quantity
/// such as 4Gi; default `default_budget` bytes per device). INVALID_ARGUMENT naming the
/// problem otherwise.
StatusOr<std::vector<DeviceSpec>> ParseDevicesFlag(const std::string& flag, int64_t default_budget);

/// The CPU's model name ("Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz") from /proc/cpuinfo;
/// empty if unknown. Float results are bit-identical only on the same CPU kind.
std::string CpuModelName();

}  // namespace hydra
