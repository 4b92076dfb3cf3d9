#pragma once
// Helpers shared by the executor tests.

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "agent/executor/executor.h"
#include "common/cost_model.h"
#include "common/partitioner.h"

namespace hydra::executor::testing {

/// A GPT-2 trial of the given shape on the repository's example corpus (byte vocabulary),
/// batch 8, 30 steps, 16 validation sequences; learning rate 0.05 for SGD, else `adamw_lr`.
inline Trial GptTrial(const std::string& name, const std::string& optimizer, int64_t layers,
                      int64_t embd, int64_t heads, int64_t context, int64_t seed, double adamw_lr) {
  Trial t;
  t.name = name;
  t.model.n_layer = layers;
  t.model.n_embd = embd;
  t.model.n_head = heads;
  t.model.context_length = context;
  t.model.vocab_size = 256;
  t.training.optimizer = *ParseName<OptimizerKind>(optimizer);
  t.training.learning_rate = optimizer == "sgd" ? 0.05 : adamw_lr;
  t.training.batch_size = 8;
  t.training.steps = 30;
  t.training.seed = seed;
  t.dataset.resolved_path = std::string(HYDRA_SOURCE_DIR) + "/examples/data/corpus.txt";
  t.dataset.eval_sequences = 16;
  return t;
}

/// Every step loss of `losses` within `relative` of `expected`'s, and as many of them.
inline void ExpectStepLossesNear(const std::vector<double>& losses,
                                 const std::vector<double>& expected, double relative) {
  ASSERT_EQ(losses.size(), expected.size());
  for (size_t i = 0; i < losses.size(); ++i) {
    EXPECT_NEAR(losses[i], expected[i], relative * std::fabs(expected[i])) << "step " << i;
  }
}

/// The losses of `steps` training steps; a failed step fails the test and ends the list.
inline std::vector<double> StepLosses(TrialExecutorInterface* e, int steps) {
  std::vector<double> out;
  for (int i = 0; i < steps; ++i) {
    auto m = e->TrainStep();
    EXPECT_TRUE(m.ok()) << m.status();
    if (!m.ok()) break;
    out.push_back(m->loss);
  }
  return out;
}

/// Runs the rest of the step under way (or a whole step) task by task (RunTask), calling
/// `between()` after each task but the step's last. The step's loss; NaN (and a failure) if a
/// task fails.
inline double StepByTasks(TrialExecutorInterface* e, const std::function<void()>& between) {
  while (true) {
    auto r = e->RunTask();
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return std::nan("");
    if (r->step) return r->step->loss;
    between();
  }
}

/// For up to `plans` budgets of `base` (from 95% of its footprint down, in 2% steps) whose
/// admission by `factory` is `chosen`: `each(trial, percent, admission)`, the trial's budget set
/// to that one, under a trace naming the budget and the plan. Returns how many there were.
inline int ForChosenBudgets(ExecutorFactoryInterface* factory, const Trial& base,
                            const TokenDataset& data,
                            const std::function<bool(const Admission&)>& chosen, int plans,
                            const std::function<void(const Trial&, int, const Admission&)>& each) {
  int tried = 0;
  for (int percent = 95; percent > 5 && tried < plans; percent -= 2) {
    Trial t = base;
    t.resources.device_memory_budget = EstimateTrialFootprint(t).total_bytes() * percent / 100;
    auto admitted = factory->Admit(t, data);
    if (!admitted.ok() || !chosen(*admitted)) continue;
    ++tried;
    SCOPED_TRACE(std::to_string(percent) + "% of the footprint:\n" + FormatPlan(t, admitted->plan));
    each(t, percent, *admitted);
  }
  return tried;
}

}  // namespace hydra::executor::testing
