#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace hydra::executor {

/// Device memory a spilling step leaves free, task by task, for holding spilled shards on a
/// discrete device longer than the plan fetches them (SpillingExecutor's lookahead): a shard's
/// weights kept from its forward to its backward instead of uploaded twice, its backward's
/// upload (weights and optimizer state) started while the host link is idle, a shard kept on
/// the device across the step's end until its next forward.
///
/// A step runs the same tasks, acquiring the same device bytes, every time. What the tier
/// ledger held at most during a task of the last step, less what the lookahead held early when
/// that task began, is what the task needs without it (its base; an overestimate where a hold
/// began inside the task, which is safe). A hold of `bytes` over a span of tasks is granted
/// where every task it spans has room for it beside its base and the holds already granted,
/// under the limit. Nothing is granted until two steps have been recorded: the first step
/// begins with nothing on the device, unlike the rest. Torch-free.
class Lookahead {
 public:
  /// `tasks`: a step's tasks; `limit`: the device bytes the bases and holds may fill together
  /// (the budget less a margin for what the ledger does not see).
  Lookahead(size_t tasks, int64_t limit);

  /// Task `t` of the step under way is done: `peak`, the ledger's device bytes at most during
  /// it; `early`, the bytes held early (granted, before the plan's own fetch) when it began.
  void Record(size_t t, int64_t peak, int64_t early);
  /// The step under way ended: its record (if every task has one) is the bases from now on,
  /// and the next step's grants become this step's.
  void EndStep();
  /// Whether `bytes` more fit beside every task from `from` to `until` (exclusive: none when
  /// they are equal; task indices of this step, or tasks + i for the next step's task i; from
  /// <= until <= 2 x tasks); if so, the hold is granted (counted in those tasks). Never before
  /// measured().
  bool Grant(size_t from, size_t until, int64_t bytes);
  /// Forgets the measurements and the grants (the shards' places changed outside a step: an
  /// evaluation, an export or import, a move, a failed step).
  void Reset();
  /// Forgets the grants, this step's and the next's, and keeps the measurements: every hold
  /// ended (a move to another device within a step; what each task needs is the same there).
  void DropGrants();
  /// Two steps recorded since the start or the last Reset.
  bool measured() const { return steps_ >= 2; }
  int64_t limit() const { return limit_; }

 private:
  size_t tasks_;
  int64_t limit_;
  std::vector<int64_t> base_;       // per task: the last recorded step's need
  std::vector<int64_t> recording_;  // per task: the step under way's, so far
  std::vector<bool> recorded_;      // per task: recording_ set in the step under way
  std::vector<int64_t> granted_;    // 2 x tasks: this step's tasks, then the next step's
  int steps_ = 0;
};

}  // namespace hydra::executor
