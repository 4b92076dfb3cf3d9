#pragma once
// The phases of a reconcile pass, in the order Reconciler::Reconcile runs them. Each reads and
// writes the pass's typed state (pass.h); the API server and the agents are reached only
// through the context's interfaces, so each phase is tested alone with fakes
// (tests/unit/controller/reconciler_phases_test.cc).

#include "common/status.h"
#include "controller/reconciler/pass.h"

namespace hydra::controller {

/// Reads the job into `pass` (nothing else). NOT_FOUND: the job is gone.
Status ReadJob(const ReconcileContext& ctx, const std::string& ns, const std::string& name,
               Pass& pass);

/// Deleting: cancels the job's trials on their agents (removing checkpoints with
/// checkpointRetention Delete), deletes the job's agent pods, then removes the finalizer.
Status Finalize(const ReconcileContext& ctx, Pass& pass);

/// Puts the finalizer on the job before any state outside the API server exists. False: the
/// write lost a conflict (re-read and start over).
StatusOr<bool> EnsureFinalizer(const ReconcileContext& ctx, Pass& pass);

/// The spec through `hydra run`'s parser into trials and their status entries. False when it is
/// invalid (the InvalidSpec status is written).
StatusOr<bool> LoadTrials(const ReconcileContext& ctx, Pass& pass);

/// The agents the job may use and their latest reports: the shared pool's inventory
/// (Prometheus), or with spec.agents the job's own pods (listed; a Ready pod's agent is its pod
/// IP) and what their agents report over gRPC.
void ObserveAgents(const ReconcileContext& ctx, Pass& pass);
/// Stops polling the endpoints the job's own pods had at its last pass that `still` does not
/// name (every one, with none: the job is gone). Its pods' addresses are nobody's once the pods
/// are gone: nothing is sent there.
void ForgetGoneEndpoints(const ReconcileContext& ctx, const Pass& pass,
                         const std::vector<std::string>& still);

/// Each placed trial's entry from its agent's report; lost, drained and forgotten trials go
/// back to placement (a job's own pod that failed or is gone loses its trials at once).
void FollowTrials(const ReconcileContext& ctx, Pass& pass);

/// Adopts copies an earlier pass assigned but could not record; cancels stale copies.
void AdoptOrCancelStale(const ReconcileContext& ctx, Pass& pass);

/// Early stopping (spec.search.earlyStopping): decides over the stored evaluations and the
/// agents' reports, into the entries.
void StopEarly(const ReconcileContext& ctx, Pass& pass);

/// spec.agents: creates the pods the runnable trials can keep busy (within minAgents and
/// maxAgents), deletes failed pods (replaced) and idle pods past that number, and every pod once
/// the job has ended or is suspended. Nothing for the shared pool.
void ScaleAgents(const ReconcileContext& ctx, Pass& pass);

/// Places waiting trials, each with a fresh attempt number stored before any agent is called.
/// False when that write lost a conflict.
StatusOr<bool> PlaceWaitingTrials(const ReconcileContext& ctx, Pass& pass);

/// Counts, best trial, conditions (with spec.agents also Queued and status.agents) and the
/// Events of this pass's transitions.
void Summarize(const ReconcileContext& ctx, Pass& pass);

/// Writes the pass's status (entries in grid order) if it changed. False on a conflict.
StatusOr<bool> WriteStatus(const ReconcileContext& ctx, Pass& pass);

/// After the status write: tells each agent what its trials' entries say and its report does
/// not show yet: a step limit or a stop (LimitTrial), or with spec.suspend a suspension.
void TellAgents(const ReconcileContext& ctx, Pass& pass);

// Helpers the phases share.

/// Sends trial `n` back to placement (Pending), or fails it past spec.maxRestarts.
void RequeueTrial(const ReconcileContext& ctx, Pass& pass, const std::string& n,
                  const std::string& reason, const std::string& why);

/// Fills an entry from its agent's report: state, step, losses, checkpoint, shard plan (at most
/// kMaxStatusShards shards) and message (at most kMaxStatusMessageBytes).
void ApplyTrialReport(const v1::TrialStatus& report, TrialEntry& entry);

/// A shard plan as status shows it.
ShardPlanStatus PlanStatus(const v1::ShardPlan& plan);

}  // namespace hydra::controller
