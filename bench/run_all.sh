#!/usr/bin/env bash
# Runs every benchmark: `--smoke` (CI: tiny sizes, checks they work) or full size (by hand;
# copy the tables into bench/RESULTS.md).
set -euo pipefail
cd "$(dirname "$0")/.."
ARGS=("$@")
echo "== bench/train_throughput"
bash bench/train_throughput.sh "${ARGS[@]}"
echo "== bench/spill"
bash bench/spill.sh "${ARGS[@]}"
if [ "${1:-}" = "--smoke" ]; then
  # The GPU benchmark's own path (bench/spill.sh --gpu), on a CPU device standing in for a GPU:
  # its configurations, bf16 weight transit and the PyTorch eager comparison keep working.
  echo "== bench/spill --gpu (a CPU device standing in)"
  HYDRA_BENCH_PYTHON=/usr/bin/python3 bash bench/spill.sh --gpu cpu:1 --smoke --precision bf16
fi
echo "== bench/plans (the planner's plans for a GPU at an H200's rates; estimates)"
bash bench/plans.sh "${ARGS[@]}"
echo "== bench/host_adamw"
if [ "${1:-}" = "--smoke" ]; then ./build/bench/host_adamw --smoke; else ./build/bench/host_adamw; fi
echo "== bench/schedule"
if [ "${1:-}" = "--smoke" ]; then ./build/bench/schedule --smoke; else ./build/bench/schedule; fi
echo "== bench/agent"
if [ "${1:-}" = "--smoke" ]; then ./build/bench/agent --smoke; else ./build/bench/agent; fi
echo "== bench/controller"
if [ "${1:-}" = "--smoke" ]; then ./build/bench/controller --smoke; else ./build/bench/controller; fi
echo "== bench/controller --agent-pods"
if [ "${1:-}" = "--smoke" ]; then ./build/bench/controller --agent-pods --smoke; else ./build/bench/controller --agent-pods; fi
echo "== bench/early_stopping"
bash bench/early_stopping.sh "${ARGS[@]}"
