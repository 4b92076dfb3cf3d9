#!/usr/bin/env bash
# bench/spill: GPT-2 small (12 layers x 768, byte vocabulary, context 256, batch 8 = 2048 tokens
# per step, AdamW) on a CPU device with budgets of 100% (no spilling), 50% and 25% of the trial's
# footprint, and 25% with the state on disk; rounds alternate the configurations and the ratios
# are to the 100% run of the same invocation.
#   bash bench/spill.sh [--smoke] [--rounds N] [--largest LAYERSxWIDTH] [--precision fp32|bf16]
#                       [--init model.safetensors]   (--largest only: start from a checkpoint)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=build/bench/spill
CORPUS=examples/data/corpus.txt
SPILL_DIR="${HYDRA_BENCH_SPILL_DIR:-${TMPDIR:-/tmp}/hydra-bench-spill-$$}"
ROUNDS=2
MODEL="--layers 12 --embd 768 --heads 12 --ctx 256 --batch 8 --steps 3 --warmup 1"
LARGEST=""
PRECISION=fp32
INIT=()
while [ $# -gt 0 ]; do
  case "$1" in
    --smoke) ROUNDS=1; MODEL="--layers 8 --embd 64 --heads 4 --ctx 64 --batch 4 --steps 2 --warmup 1" ;;
    --rounds) ROUNDS="$2"; shift ;;
    --largest) LARGEST="$2"; shift ;;
    --precision) PRECISION="$2"; shift ;;
    --init) INIT=(--init "$2"); shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
trap 'rm -rf "$SPILL_DIR"' EXIT

if [ -n "$LARGEST" ]; then
  # The largest GPT-style model: 3 steps with the state on disk under a 2.5 GiB device budget,
  # GPT-2's vocabulary, and no RAM for stashed activations (every shard recomputes), so that
  # resident memory stays near the budget.
  layers="${LARGEST%x*}"; width="${LARGEST#*x}"
  heads=$((width / 64))
  /usr/bin/time -f "max resident (VmHWM) %M KiB, %e s wall" \
    "$BIN" --corpus "$CORPUS" --layers "$layers" --embd "$width" --heads "$heads" --ctx 256 \
    --vocab 50257 --batch 2 --steps 3 --warmup 0 --offload disk --host-budget 0 \
    --spill-dir "$SPILL_DIR" --budget-bytes $((2560 * 1024 * 1024)) --precision "$PRECISION" \
    ${INIT[@]+"${INIT[@]}"}
  exit 0
fi

OUT=$(mktemp)
trap 'rm -rf "$SPILL_DIR" "$OUT"' EXIT
CONFIGS=("1.0 host -1" "0.5 host -1" "0.25 host -1" "0.25 disk -1" "0.25 disk 0")
for ((r = 0; r < ROUNDS; r++)); do
  for cfg in "${CONFIGS[@]}"; do
    set -- $cfg
    # shellcheck disable=SC2086
    "$BIN" --corpus "$CORPUS" $MODEL --budget-fraction "$1" --offload "$2" --host-budget "$3" \
      --spill-dir "$SPILL_DIR" >>"$OUT"
  done
done
/usr/bin/python3 - "$OUT" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
groups = {}
for r in runs:
    groups.setdefault((r["budgetFraction"], r["offload"], r["hostBudget"]), []).append(r)
base = statistics.median(r["tokensPerSecond"] for r in groups[(1.0, "host", -1)])
first = runs[0]
print(f"model: {first['parameters']/1e6:.1f}M parameters, footprint {first['footprintBytes']/2**20:.0f} MiB "
      f"(state {first['stateBytes']/2**20:.0f} MiB); medians of {len(groups[(1.0, 'host', -1)])} rounds")
print("| budget | state tier | host RAM for stash | shards | policies (s=stash, r=recompute) | tokens/s | ratio to no-spill | "
      "accounted device peak | resident growth (peak - baseline) | disk read/written per step |")
print("|---|---|---|---|---|---|---|---|---|---|")
for (frac, tier, host), rs in groups.items():
    tps = statistics.median(r["tokensPerSecond"] for r in rs)
    r = rs[0]
    growth = max(x["peakResidentBytes"] - x["baselineResidentBytes"] for x in rs)
    hb = "unlimited" if host < 0 else f"{host/2**20:.0f} MiB"
    print(f"| {frac:.0%} ({r['budgetBytes']/2**20:.0f} MiB) | {tier} | {hb} | {r['shards']} | {r['policies']} | "
          f"{tps:.1f} | {tps/base:.2f} | {r['peakDeviceBytes']/2**20:.0f} MiB | {growth/2**20:.0f} MiB | "
          f"{r['diskReadBytesPerStep']/2**20:.0f} / {r['diskWrittenBytesPerStep']/2**20:.0f} MiB |")
PY
