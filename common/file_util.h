#pragma once

#include <string>

#include "common/status.h"

namespace hydra {

/// Replaces `path` with `content` atomically (temporary file, fsync, rename): readers see the
/// old or the new file, never a torn one.
Status WriteFileAtomically(const std::string& path, const std::string& content);

/// Reads a whole file.
StatusOr<std::string> ReadFile(const std::string& path);

/// Reads a PEM file (certificate, key or CA bundle); INVALID_ARGUMENT if it holds no PEM block,
/// errors name `what` (e.g. the flag) and the path.
StatusOr<std::string> ReadPemFile(const std::string& what, const std::string& path);

}  // namespace hydra
