#include "common/admission.h"

#include <utility>

namespace hydra {

StatusOr<Admission> PlanAdmission(const Trial& trial, const PartitionOptions& options) {
  Admission a;
  ASSIGN_OR_RETURN(a.plan, PlanShards(trial, options));
  const PartitionPlan& p = a.plan;
  a.host_bytes = (p.state_tier == StateTier::kHost ? p.total_state_bytes + p.peak_device_bytes
                                                   : p.peak_device_bytes) +
                 p.offloaded_bytes;
  a.disk_bytes = SpillDiskBytes(trial, p);
  a.est_step_seconds = EstimatedStepSeconds(p);
  return a;
}

}  // namespace hydra
