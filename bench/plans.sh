#!/usr/bin/env bash
# bench/plans: the plans the executor makes for one GPT shape on a GPU at given rates, without a
# GPU (bench/spill --plan-only --simulate-gpu): shards, resident state, the planned device peak
# and the estimated step at each budget (policies: s stash, r recompute, o offload, i recompute
# with the input in host memory; optimizer: d device, h host, R resident on the device).
# Estimates, not measurements: what a change to the planner does to a GPU's plans, shown on any
# machine. The CUDA build's bench/spill plans as a GPU run does (fused attention: LibTorch 2.1+;
# HYDRA_CUDA_TARGETS=spill scripts/build-cuda.sh); Debian's LibTorch 1.13 keeps or recomputes
# the attention scores, so its plans differ.
#   bash bench/plans.sh [--smoke] [--precision fp32|bf16] [--fractions "1 0.5 0.25"]
#                       [--shape "LAYERS WIDTH HEADS BATCH CONTEXT VOCAB"] [--offload host|disk]
# Rates (defaults: an H200's, measured by the GPU check's pilot; bench/RESULTS.md):
#   HYDRA_PLAN_LINK (bytes/s host <-> GPU), HYDRA_PLAN_FP32, HYDRA_PLAN_BF16 (FLOP/s),
#   HYDRA_PLAN_HOST_ADAMW (bytes/s the host's AdamW streams). HYDRA_BENCH_SPILL_BIN picks the
#   binary (default: build-cuda/bench/spill where it exists, else build/bench/spill).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN="${HYDRA_BENCH_SPILL_BIN:-}"
if [ -z "$BIN" ]; then
  BIN=build/bench/spill
  [ -x build-cuda/bench/spill ] && BIN=build-cuda/bench/spill
fi
PY="${HYDRA_BENCH_PYTHON:-python3}"
PRECISION=bf16
FRACTIONS="1 0.5 0.25"
SHAPE="24 1024 16 8 1024 50257" # GPT-2 medium, batch 8 x 1024
OFFLOAD=host
while [ $# -gt 0 ]; do
  case "$1" in
    --smoke) SHAPE="8 64 4 4 64 256"; FRACTIONS="1 0.5" ;;
    --precision) PRECISION="$2"; shift ;;
    --fractions) FRACTIONS="$2"; shift ;;
    --shape) SHAPE="$2"; shift ;;
    --offload) OFFLOAD="$2"; shift ;;
    -h | --help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "unknown argument $1 (--help)" >&2; exit 2 ;;
  esac
  shift
done
[ -x "$BIN" ] || { echo "no $BIN: build it (scripts/build.sh, or HYDRA_CUDA_TARGETS=spill scripts/build-cuda.sh)" >&2; exit 1; }
read -r layers width heads batch ctx vocab <<<"$SHAPE"
SPILL_DIR="${TMPDIR:-/tmp}/hydra-bench-plans-$$"
trap 'rm -rf "$SPILL_DIR"' EXIT
RATES=(--link-rate "${HYDRA_PLAN_LINK:-54e9}" --fp32-rate "${HYDRA_PLAN_FP32:-46.5e12}"
  --bf16-rate "${HYDRA_PLAN_BF16:-330e12}" --host-adamw-rate "${HYDRA_PLAN_HOST_ADAMW:-6e9}")
echo "plans of $layers x $width ($heads heads, batch $batch x $ctx, vocabulary $vocab), $PRECISION," \
  "state in $OFFLOAD, by $BIN at ${RATES[*]}"
echo "| budget | shards | policies | optimizer | resident state | planned device peak | offloaded to host | link per step | estimated step |"
echo "|---|---|---|---|---|---|---|---|---|"
for f in $FRACTIONS; do
  if ! line=$("$BIN" --corpus examples/data/corpus.txt --layers "$layers" --embd "$width" \
      --heads "$heads" --batch "$batch" --ctx "$ctx" --vocab "$vocab" --precision "$PRECISION" \
      --offload "$OFFLOAD" --spill-dir "$SPILL_DIR" --budget-fraction "$f" --threads 1 \
      --plan-only --simulate-gpu "${RATES[@]}" 2>&1); then
    echo "| $f | refused: $(echo "$line" | tail -c 300 | tr '\n' ' ') |||||||"
    continue
  fi
  "$PY" - "$line" "$f" <<'PY'
import json, sys
a, f = json.loads(sys.argv[1]), float(sys.argv[2])
gib = lambda b: f"{b / 2**30:.2f} GiB"
print(f"| {f:.0%} of {gib(a['footprintBytes'])} ({a['attention']} attention) | {a['shards']} | {a['policies']} | "
      f"{a['optimizerPlacements']} | {gib(a['residentBytes']) if a['residentBytes'] else '-'} | "
      f"{gib(a['plannedPeakDeviceBytes'])} | {gib(a['offloadedBytes']) if a['offloadedBytes'] else '-'} | "
      f"{a['linkSeconds'] * 1e3:.1f} ms | {a['estimatedStepSeconds'] * 1e3:.1f} ms |")
PY
done
