#pragma once

/// Every metric hydra-controller exports (docs/metrics.md lists them).
namespace hydra::controller::metric_names {

// Counter. Labels: result ("success"|"error"|"requeue").
inline constexpr char kReconcilesTotal[] = "hydra_controller_reconciles_total";
// Counter. Reconciles that returned an error.
inline constexpr char kReconcileErrorsTotal[] = "hydra_controller_reconcile_errors_total";
// Histogram in seconds.
inline constexpr char kReconcileDurationSeconds[] = "hydra_controller_reconcile_duration_seconds";
// Gauge: keys waiting in the work queue.
inline constexpr char kQueueDepth[] = "hydra_controller_queue_depth";
// Gauge. Labels: state. Trials of all jobs as of their last reconcile.
inline constexpr char kTrials[] = "hydra_controller_trials";
// Gauge: 1 while this replica leads.
inline constexpr char kIsLeader[] = "hydra_controller_is_leader";
// Counter: trials assigned to agents.
inline constexpr char kAssignmentsTotal[] = "hydra_controller_assignments_total";
inline constexpr char kAgentsLostTotal[] = "hydra_controller_agents_lost_total";
inline constexpr char kTrialRestartsTotal[] = "hydra_controller_trial_restarts_total";

}  // namespace hydra::controller::metric_names
