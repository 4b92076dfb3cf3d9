#pragma once
// An agent dedicated to one MultiModelJob (a pod the controller created for it, spec.agents):
// it takes, cancels, limits and reports only that job's trials. gRPC-free.

#include <optional>
#include <string>

#include "common/status.h"

namespace hydra::agent {

/// The job an agent serves: its namespace, name and uid (all three, as a trial's identity).
struct DedicatedJob {
  std::string namespace_;
  std::string name;
  std::string uid;
  /// "namespace/name (uid UID)", for messages.
  std::string ToString() const;
};

/// --dedicated-job's value, "NAMESPACE/NAME/UID"; INVALID_ARGUMENT naming the flag otherwise.
StatusOr<DedicatedJob> ParseDedicatedJob(const std::string& flag);

/// OK when the agent serves every job (`dedicated` unset) or the trial (namespace, job, uid) is
/// of its job; else PERMISSION_DENIED saying which job the agent serves and that `what` (e.g.
/// "assigned") is refused.
Status CheckDedicatedJob(const std::optional<DedicatedJob>& dedicated, const std::string& ns,
                         const std::string& job, const std::string& uid, const std::string& what);

}  // namespace hydra::agent
