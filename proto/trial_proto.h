#pragma once

#include <string>
#include <vector>

#include "common/job.h"
#include "common/partitioner.h"
#include "common/status.h"
#include "common/trial_result.h"
#include "hydra/agent/v1/agent.pb.h"

/// The one codec between the agent protocol's messages and common's types; the agent decodes
/// what the controller encodes with the same functions.
namespace hydra::wire {

namespace v1 = ::hydra::agent::v1;

/// Encodes a trial's identity and effective configuration.
void TrialToProto(const Trial& trial, v1::TrialSpec* out);

/// The trial's identity as the protocol names it.
v1::TrialRef TrialRefOf(const Trial& trial);

/// The registry key of a TrialRef or a TrialStatus's identity: TrialKey of the same trial.
std::string TrialKeyOf(const v1::TrialRef& ref);
std::string TrialKeyOf(const v1::TrialStatus& status);

/// Decodes and validates a trial by the manifest's rules; INVALID_ARGUMENT listing every
/// problem with paths such as "trial.training.learningRate". The dataset path must be
/// absolute.
StatusOr<Trial> TrialFromProto(const v1::TrialSpec& spec);

void ShardPlanToProto(const PartitionPlan& plan, v1::ShardPlan* out);

/// The first layer of shards 1..n-1: what spec.resources.shardBoundaries would say.
std::vector<int64_t> ShardBoundaries(const v1::ShardPlan& plan);

v1::TrialState TrialStateToProto(const std::string& state);
std::string TrialStateFromProto(v1::TrialState state);

/// Most evaluations a TrialStatus carries (TrialStatus.evaluations).
inline constexpr size_t kMaxReportedEvaluations = 64;

/// The record of a trial as TrialStatus, its identity included (checkpoint dir, plan and
/// device are left for the caller).

void TrialResultToProto(const TrialResult& result, v1::TrialStatus* out);

}  // namespace hydra::wire
