#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"

namespace hydra {

/// Parses a Kubernetes resource quantity of bytes: "512Mi", "4Gi", "1G", "1500k", "123".
/// Binary suffixes Ki Mi Gi Ti Pi Ei, decimal k M G T P E, and decimal exponents ("1e9").
StatusOr<int64_t> ParseByteQuantity(const std::string& text);

/// Human-readable bytes with binary units: "512.0 MiB", "1.50 GiB", "812 B".
std::string FormatBytes(int64_t bytes);

/// Human-readable duration: "42s", "3m05s", "1h02m".
std::string FormatDuration(double seconds);

}  // namespace hydra
