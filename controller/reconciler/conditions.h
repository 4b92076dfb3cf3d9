#pragma once

/// Condition types and reasons of MultiModelJob status, in one place (Kubebuilder habit).
/// Conditions are metav1.Condition-shaped: type, status ("True"|"False"|"Unknown"), reason,
/// message, observedGeneration, lastTransitionTime (changes only when status flips).
namespace hydra::controller::conditions {

// Types.
inline constexpr char kReady[] = "Ready";              ///< every unfinished trial has an agent
inline constexpr char kProgressing[] = "Progressing";  ///< trials are training or waiting
inline constexpr char kComplete[] = "Complete";        ///< every trial succeeded
inline constexpr char kFailed[] = "Failed";            ///< the job cannot finish as asked
inline constexpr char kDegraded[] = "Degraded";        ///< something needs attention
/// spec.agents: True while the job has agent pods and Kueue has admitted none of them.
inline constexpr char kQueued[] = "Queued";

// Reasons.
inline constexpr char kTrialsPlaced[] = "TrialsPlaced";
inline constexpr char kWaitingForCapacity[] = "WaitingForCapacity";
inline constexpr char kTrialsTraining[] = "TrialsTraining";
inline constexpr char kSuspended[] = "Suspended";  ///< spec.suspend is true
inline constexpr char kAllTrialsSucceeded[] = "AllTrialsSucceeded";
inline constexpr char kTrialsFailed[] = "TrialsFailed";
inline constexpr char kInvalidSpec[] = "InvalidSpec";
inline constexpr char kAgentUnreachable[] = "AgentUnreachable";
inline constexpr char kInventoryUnavailable[] = "InventoryUnavailable";
inline constexpr char kAsExpected[] = "AsExpected";
inline constexpr char kFinished[] = "Finished";
/// Queued: every agent pod of the job waits for Kueue's admission (its scheduling gate).
inline constexpr char kAwaitingAdmission[] = "AwaitingAdmission";
/// Queued False: some agent pod of the job has been admitted (or needs no admission).
inline constexpr char kAdmitted[] = "Admitted";
/// Queued False: the job has no agent pods (none wanted now, or not yet created).
inline constexpr char kNoAgentPods[] = "NoAgentPods";
/// Degraded: the job's agent pods cannot be listed or created (RBAC, an invalid template, a
/// quota), or fail; the message says which and why.
inline constexpr char kAgentPodsFailing[] = "AgentPodsFailing";
/// An agent refused a trial for a reason no capacity fixes (a missing dataset, a path outside
/// the agents' roots, an invalid spec): the message names it.
inline constexpr char kTrialRejected[] = "TrialRejected";

// Event reasons.
inline constexpr char kEventTrialAssigned[] = "TrialAssigned";
inline constexpr char kEventTrialSucceeded[] = "TrialSucceeded";
inline constexpr char kEventTrialFailed[] = "TrialFailed";
inline constexpr char kEventTrialEarlyStopped[] = "TrialEarlyStopped";
inline constexpr char kEventTrialsSuspended[] = "TrialsSuspended";
inline constexpr char kEventTrialRequeued[] = "TrialRequeued";
inline constexpr char kEventJobComplete[] = "JobComplete";
inline constexpr char kEventJobFailed[] = "JobFailed";
inline constexpr char kEventInvalidSpec[] = "InvalidSpec";
inline constexpr char kEventTrialsCancelled[] = "TrialsCancelled";
inline constexpr char kEventAgentNotice[] = "AgentNotice";
inline constexpr char kEventStaleTrialCancelled[] = "StaleTrialCancelled";
inline constexpr char kEventTrialRejected[] = "TrialRejected";
inline constexpr char kEventAgentPodsCreated[] = "AgentPodsCreated";
inline constexpr char kEventAgentPodsDeleted[] = "AgentPodsDeleted";
inline constexpr char kEventAgentPodFailed[] = "AgentPodFailed";
inline constexpr char kEventAgentPodsNotCreated[] = "AgentPodsNotCreated";

/// The finalizer the controller puts on every MultiModelJob before touching agents.
inline constexpr char kFinalizer[] = "hydra.dev/trials";

}  // namespace hydra::controller::conditions
