#pragma once

#include <string>

#include "common/status.h"

namespace hydra {

/// Replaces `path` with `content` atomically (temporary file, fsync, rename): readers see the
/// old or the new file, never a torn one.
Status WriteFileAtomically(const std::string& path, const std::string& content);

/// Reads a whole file.
StatusOr<std::string> ReadFile(const std::string& path);

}  // namespace hydra
