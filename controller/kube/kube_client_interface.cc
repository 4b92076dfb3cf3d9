#include "controller/kube/kube_client_interface.h"

namespace hydra::kube {

bool IsConflict(const Status& s) { return s.code() == StatusCode::kAborted; }
bool IsGone(const Status& s) { return s.code() == StatusCode::kOutOfRange; }

StatusOr<Json> KubeClientInterface::UpdateWithRetry(const ResourceKind& kind, const std::string& ns,
                                                    const std::string& name,
                                                    const std::function<bool(Json&)>& mutate,
                                                    int attempts, bool status) {
  Status last;
  for (int i = 0; i < attempts; ++i) {
    ASSIGN_OR_RETURN(Json object, Get(kind, ns, name));
    if (!mutate(object)) return object;
    auto updated = status ? UpdateStatus(kind, ns, object) : Update(kind, ns, object);
    if (updated.ok() || !IsConflict(updated.status())) return updated;
    last = updated.status();
  }
  return last.WithContext("still conflicting after " + std::to_string(attempts) + " attempts");
}

}  // namespace hydra::kube
