#!/usr/bin/env bash
# bench/early_stopping: time to the best model of a random search, every trial trained to the
# end against ASHA early stopping, on the same 16 drawn trials (examples/random-asha.yaml, its
# model and steps scaled up at full size). Both runs use the same devices and threads; rounds
# alternate them; the ratios are between runs of one invocation.
# At full size ASHA runs twice, its first rung at step 10 and at step 30 of 270.
#   bash bench/early_stopping.sh [--smoke] [--rounds N] [--min-steps "10 30"]
set -euo pipefail
cd "$(dirname "$0")/.."
HYDRA=build/cli/hydra
ROUNDS=2
SMOKE=0
MIN_STEPS="10 30"
while [ $# -gt 0 ]; do
  case "$1" in
    --smoke) SMOKE=1; ROUNDS=1; MIN_STEPS=10 ;;
    --min-steps) MIN_STEPS="$2"; shift ;;
    --rounds) ROUNDS="$2"; shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cp examples/data/corpus.txt "$WORK/corpus.txt"
sed 's|path: data/corpus.txt|path: corpus.txt|' examples/random-asha.yaml >"$WORK/asha.yaml"
if [ "$SMOKE" = 0 ]; then
  # Wider, longer trials: rungs at 10, 30 and 90 of 270 steps.
  sed -i -e 's|nEmbd: 32, nHead: 2, contextLength: 32|nEmbd: 64, nHead: 4, contextLength: 64|' \
    -e 's|nLayer: {intUniform: \[1, 3\]}|nLayer: {intUniform: [1, 4]}|' \
    -e 's|steps: 90, batchSize: 8, seed: 3, evalEverySteps: 30, checkpointEverySteps: 30|steps: 270, batchSize: 8, seed: 3, evalEverySteps: 90, checkpointEverySteps: 90|' \
    "$WORK/asha.yaml"
fi
for m in $MIN_STEPS; do
  sed "s|minSteps: 10|minSteps: $m|" "$WORK/asha.yaml" >"$WORK/asha-$m.yaml"
done
# The same job without early stopping.
awk '/^    earlyStopping:/ {skip = 1; next} /^  training:/ {skip = 0} !skip' "$WORK/asha.yaml" \
  >"$WORK/full.yaml"

run() {  # run <name> <round>: wall seconds, steps trained, best final validation loss, stopped
  local out="$WORK/out-$1-$2"
  local t0 t1
  t0=$(date +%s.%N)
  "$HYDRA" run "$WORK/$1.yaml" -o "$out" --progress quiet >"$WORK/log-$1-$2" 2>&1 ||
    { cat "$WORK/log-$1-$2"; exit 1; }
  t1=$(date +%s.%N)
  python3 - "$out/results.json" "$t0" "$t1" "$1" <<'PY'
import json, sys
trials = json.load(open(sys.argv[1]))["trials"]
steps = sum(t["steps"] for t in trials)
done = [t for t in trials if t["state"] == "Succeeded"]
best = min(t["finalValLoss"] for t in done)
stopped = sum(t["state"] == "EarlyStopped" for t in trials)
print(f"{sys.argv[4]} {float(sys.argv[3]) - float(sys.argv[2]):.2f} {steps} {best:.6f} {stopped} "
      f"{min(done, key=lambda t: t['finalValLoss'])['name']}")
PY
}

echo "$(nproc) cores; $ROUNDS round(s), full and asha alternated; $(grep -c . "$WORK/asha.yaml") manifest lines"
RESULTS="$WORK/results.txt"
for ((r = 0; r < ROUNDS; r++)); do
  run full "$r" | tee -a "$RESULTS"
  for m in $MIN_STEPS; do run "asha-$m" "$r" | tee -a "$RESULTS"; done
done
python3 - "$RESULTS" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
kinds = list(dict.fromkeys(r[0] for r in rows))
def median(kind, col):
    return statistics.median(float(r[col]) for r in rows if r[0] == kind)
best = {r[0]: r[5] for r in rows}
print()
print("| search | wall s (median) | steps trained | stopped early | best val loss | best trial | wall / full | best loss / full |")
print("|---|---|---|---|---|---|---|---|")
for k in kinds:
    name = "every trial to the end" if k == "full" else f"ASHA, minSteps {k.split('-')[1]}, reductionFactor 3"
    print(f"| {name} | {median(k, 1):.1f} | {median(k, 2):.0f} | {median(k, 4):.0f} | "
          f"{median(k, 3):.4f} | {best[k]} | {median(k, 1) / median('full', 1):.2f} | "
          f"{median(k, 3) / median('full', 3):.4f} |")
PY
