#!/usr/bin/env bash
# bench/train_throughput: tokens/s of one GPT-2 trial, Hydra's C++ executor against PyTorch eager
# (Debian's python3-torch) on the same model, batch, data and thread count, run alternately in
# one invocation; prints medians and ratios.
#   bash bench/train_throughput.sh [--smoke] [--rounds N]
set -euo pipefail
cd "$(dirname "$0")/.."
SMOKE=0
ROUNDS=3
while [ $# -gt 0 ]; do
  case "$1" in
    --smoke) SMOKE=1; ROUNDS=1 ;;
    --rounds) ROUNDS="$2"; shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
BIN=build/bench/train_throughput
CORPUS=examples/data/corpus.txt
THREADS=2
if [ "$SMOKE" = 1 ]; then
  CONFIGS=("demo|--layers 2 --embd 64 --heads 4 --ctx 64 --batch 4 --steps 2 --warmup 1")
else
  CONFIGS=(
    "demo (4x128, ctx 128, batch 16)|--layers 4 --embd 128 --heads 4 --ctx 128 --batch 16 --steps 40 --warmup 3"
    "wide (2x768, ctx 256, batch 4)|--layers 2 --embd 768 --heads 12 --ctx 256 --batch 4 --steps 8 --warmup 2"
  )
fi
OUT=$(mktemp)
trap 'rm -f "$OUT"' EXIT
for cfg in "${CONFIGS[@]}"; do
  name="${cfg%%|*}"
  args="${cfg#*|}"
  for ((r = 0; r < ROUNDS; r++)); do
    # shellcheck disable=SC2086
    echo "$name|hydra|$("$BIN" --corpus "$CORPUS" --threads $THREADS $args)" >>"$OUT"
    # shellcheck disable=SC2086
    echo "$name|eager|$(/usr/bin/python3 bench/train_throughput.py --corpus "$CORPUS" --threads $THREADS $args)" >>"$OUT"
    if [ "$SMOKE" = 0 ]; then
      # PyTorch eager with its BLAS/OpenMP oversubscription removed by hand, two ways.
      # shellcheck disable=SC2086
      echo "$name|eager-tuned-blas1|$(OPENBLAS_NUM_THREADS=1 /usr/bin/python3 bench/train_throughput.py --corpus "$CORPUS" --threads $THREADS $args)" >>"$OUT"
      # shellcheck disable=SC2086
      echo "$name|eager-tuned-omp1|$(/usr/bin/python3 bench/train_throughput.py --corpus "$CORPUS" --threads 1 $args)" >>"$OUT"
    fi
  done
done
/usr/bin/python3 - "$OUT" <<'PY'
import json, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    name, impl, js = line.rstrip("\n").split("|", 2)
    rows.setdefault(name, {}).setdefault(impl, []).append(json.loads(js)["tokens_per_second"])
print("| config | Hydra C++ tok/s | PyTorch eager tok/s | ratio | eager with threads tuned by hand tok/s | ratio vs tuned |")
print("|---|---|---|---|---|---|")
for name, r in rows.items():
    med = {k: statistics.median(v) for k, v in r.items()}
    h, e = med["hydra"], med["eager"]
    tuned = [k for k in med if k.startswith("eager-tuned")]
    best = max(tuned, key=lambda k: med[k]) if tuned else None
    t = med[best] if best else float("nan")
    how = {"eager-tuned-blas1": "OPENBLAS_NUM_THREADS=1", "eager-tuned-omp1": "torch threads 1"}.get(best, "-")
    print(f"| {name} | {h:.0f} | {e:.0f} | {h/e:.2f} | {t:.0f} ({how}) | {h/t:.2f} |")
print(f"\nmedians of {len(next(iter(rows.values()))['hydra'])} alternating rounds per implementation")
PY
