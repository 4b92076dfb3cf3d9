#pragma once

#include <string>

#include "controller/kube/kube_client_interface.h"

namespace hydra::kube {

/// Records a core/v1 Event about `object` (as read from the API: apiVersion, kind and
/// metadata), as `kubectl describe` shows them. `type` is "Normal" or "Warning"; `reason` a
/// CamelCase word; `component` the reporter ("hydra-controller").
StatusOr<Json> RecordEvent(KubeClientInterface& client, const Json& object, const std::string& type,
                           const std::string& reason, const std::string& message,
                           const std::string& component);

}  // namespace hydra::kube
