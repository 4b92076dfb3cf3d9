#pragma once

#include <string>
#include <vector>

#include "common/job.h"
#include "common/status.h"

/// Where a trial's files may live on an agent, and how they are removed. Torch- and gRPC-free.
namespace hydra::agent {

/// `path` with symlinks and ".." resolved (the part that exists; the rest lexically).
StatusOr<std::string> ResolvePath(const std::string& path);

/// Whether `a` is `b` or a directory above or below it (both resolved, absolute).
bool PathsNest(const std::string& a, const std::string& b);

/// The checkpoint directory a trial may use: `resolved` (an absolute, resolved path) must be
/// <root>/<namespace>/<job>/<name> or below it for one of `roots` (resolved), so that it is
/// never a root, another job's or another trial's directory or one of their ancestors.
/// INVALID_ARGUMENT naming the expected directory otherwise.
Status CheckCheckpointLayout(const Trial& trial, const std::string& resolved,
                             const std::vector<std::string>& roots);

/// Creates `dir` (and its parents) if missing, then opens it without following a symlink in
/// its last component and checks that what was opened is a directory whose real path is
/// `dir`: a symlink swapped in anywhere along the path after the layout check is refused.
Status CreateCheckedDirectory(const std::string& dir);

/// Removes the trial's own files from its checkpoint directory `dir` (checkpoints, ATTEMPT,
/// model.pt and their temporary files; symlinks are removed, never followed), then `dir`
/// itself if that left it empty. Other files stay. OK if `dir` does not exist.
Status RemoveTrialFiles(const std::string& dir);

}  // namespace hydra::agent
