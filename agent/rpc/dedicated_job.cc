#include "agent/rpc/dedicated_job.h"

#include <sstream>
#include <vector>

namespace hydra::agent {

std::string DedicatedJob::ToString() const {
  return namespace_ + "/" + name + " (uid " + uid + ")";
}

StatusOr<DedicatedJob> ParseDedicatedJob(const std::string& flag) {
  std::vector<std::string> parts;
  std::stringstream in(flag);
  for (std::string part; std::getline(in, part, '/');) parts.push_back(part);
  if (!flag.empty() && flag.back() == '/') parts.push_back("");
  if (parts.size() != 3 || parts[0].empty() || parts[1].empty() || parts[2].empty()) {
    return InvalidArgumentError("--dedicated-job: '" + flag +
                                "' is not NAMESPACE/NAME/UID (the MultiModelJob this agent "
                                "serves, all three parts)");
  }
  return DedicatedJob{parts[0], parts[1], parts[2]};
}

Status CheckDedicatedJob(const std::optional<DedicatedJob>& dedicated, const std::string& ns,
                         const std::string& job, const std::string& uid, const std::string& what) {
  if (!dedicated) return OkStatus();
  if (dedicated->namespace_ == ns && dedicated->name == job && dedicated->uid == uid) {
    return OkStatus();
  }
  return PermissionDeniedError("this agent serves only MultiModelJob " + dedicated->ToString() +
                               "; a trial of " + ns + "/" + job + " (uid " + uid + ") is not " +
                               what + " here");
}

}  // namespace hydra::agent
