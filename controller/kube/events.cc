#include "controller/kube/events.h"

#include <chrono>
#include <cstdio>

#include "controller/kube/leader_election.h"

namespace hydra::kube {

StatusOr<Json> RecordEvent(KubeClientInterface& client, const Json& object, const std::string& type,
                           const std::string& reason, const std::string& message,
                           const std::string& component) {
  if (type != "Normal" && type != "Warning") {
    return InvalidArgumentError("event type must be Normal or Warning, got " + type);
  }
  const auto& md = object["metadata"];
  const std::string name = md.value("name", "");
  const std::string ns = md.value("namespace", "default");
  char suffix[32];
  std::snprintf(
      suffix, sizeof(suffix), "%llx",
      static_cast<unsigned long long>(std::chrono::system_clock::now().time_since_epoch().count()));
  const std::string now = TimeNow();
  Json event = {{"apiVersion", "v1"},
                {"kind", "Event"},
                {"metadata", {{"name", name + "." + suffix}, {"namespace", ns}}},
                {"involvedObject",
                 {{"apiVersion", object.value("apiVersion", "")},
                  {"kind", object.value("kind", "")},
                  {"name", name},
                  {"namespace", ns},
                  {"uid", md.value("uid", "")},
                  {"resourceVersion", md.value("resourceVersion", "")}}},
                {"type", type},
                {"reason", reason},
                {"message", message},
                {"source", {{"component", component}}},
                {"reportingComponent", component},
                {"firstTimestamp", now},
                {"lastTimestamp", now},
                {"count", 1}};
  return client.Create(kEvents, ns, event);
}

}  // namespace hydra::kube
