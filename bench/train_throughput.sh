#!/usr/bin/env bash
# bench/train_throughput: tokens/s of one GPT-2 trial, Hydra's C++ executor against PyTorch eager
# (Debian's python3-torch) on the same model, batch, data and thread count, run alternately in
# one invocation; prints medians and ratios. The GPT-2 small rows (vocabulary 50257) compare
# fp32 and bf16 (Hydra's spec.training.precision against torch.autocast("cpu", bfloat16)).
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
  SMALL=("gpt2-small-smoke|--layers 1 --embd 64 --heads 4 --ctx 32 --vocab 50257 --batch 2 --steps 1 --warmup 1")
else
  CONFIGS=(
    "demo (4x128, ctx 128, batch 16)|--layers 4 --embd 128 --heads 4 --ctx 128 --batch 16 --steps 40 --warmup 3"
    "wide (2x768, ctx 256, batch 4)|--layers 2 --embd 768 --heads 12 --ctx 256 --batch 4 --steps 8 --warmup 2"
  )
  SMALL=("GPT-2 small (12x768, vocab 50257, ctx 256, batch 4)|--layers 12 --embd 768 --heads 12 --ctx 256 --vocab 50257 --batch 4 --steps 4 --warmup 1")
fi
OUT=$(mktemp)
trap 'rm -f "$OUT" "$OUT.small"' EXIT
hydra() { "$BIN" --corpus "$CORPUS" --threads $THREADS "$@"; }
eager() { /usr/bin/python3 bench/train_throughput.py --corpus "$CORPUS" --threads $THREADS "$@"; }
# The allocator setting that keeps freed memory (as Hydra's executors do): PyTorch eager
# page-faults every step's fresh buffers in again without it.
eager_malloc() { MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=2147483647 eager "$@"; }
for cfg in "${CONFIGS[@]}"; do
  name="${cfg%%|*}"
  args="${cfg#*|}"
  for ((r = 0; r < ROUNDS; r++)); do
    # shellcheck disable=SC2086
    echo "$name|hydra|$(hydra $args)" >>"$OUT"
    # shellcheck disable=SC2086
    echo "$name|eager|$(eager $args)" >>"$OUT"
    if [ "$SMOKE" = 0 ]; then
      # PyTorch eager with its BLAS/OpenMP oversubscription removed by hand, two ways.
      # shellcheck disable=SC2086
      echo "$name|eager-tuned-blas1|$(OPENBLAS_NUM_THREADS=1 eager $args)" >>"$OUT"
      # shellcheck disable=SC2086
      echo "$name|eager-tuned-omp1|$(/usr/bin/python3 bench/train_throughput.py --corpus "$CORPUS" --threads 1 $args)" >>"$OUT"
    fi
  done
done
# GPT-2 small with its real vocabulary, fp32 and bf16, every variant alternated per round.
for cfg in "${SMALL[@]}"; do
  name="${cfg%%|*}"
  args="${cfg#*|}"
  for ((r = 0; r < ROUNDS; r++)); do
    for p in fp32 bf16; do
      # shellcheck disable=SC2086
      echo "$name|hydra|$p|$(hydra $args --precision $p)" >>"$OUT.small"
      # shellcheck disable=SC2086
      echo "$name|eager|$p|$(eager $args --precision $p)" >>"$OUT.small"
      if [ "$SMOKE" = 0 ]; then
        # shellcheck disable=SC2086
        echo "$name|eager-tuned-blas1|$p|$(OPENBLAS_NUM_THREADS=1 eager $args --precision $p)" >>"$OUT.small"
        # shellcheck disable=SC2086
        echo "$name|eager-tuned-malloc|$p|$(eager_malloc $args --precision $p)" >>"$OUT.small"
      fi
    done
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
/usr/bin/python3 - "$OUT.small" <<'PY'
import json, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    name, impl, prec, js = line.rstrip("\n").split("|", 3)
    rows.setdefault(name, {}).setdefault((impl, prec), []).append(json.loads(js)["tokens_per_second"])
for name, r in rows.items():
    med = {k: statistics.median(v) for k, v in r.items()}
    print(f"\n{name}: tokens/s (medians of {len(r[('hydra', 'fp32')])} alternating rounds)\n")
    impls = sorted({i for i, _ in med}, key=["hydra", "eager", "eager-tuned-blas1", "eager-tuned-malloc"].index)
    print("| precision | " + " | ".join(impls) + " |")
    print("|---|" + "---|" * len(impls))
    for p in ("fp32", "bf16"):
        print(f"| {p} | " + " | ".join(f"{med[(i, p)]:.0f}" for i in impls) + " |")
    best = lambda p: max(med[(i, p)] for i in impls if i != "hydra")
    h32, h16 = med[("hydra", "fp32")], med[("hydra", "bf16")]
    print(f"\n* Hydra fp32 / PyTorch eager fp32 (default threads): {h32 / med[('eager', 'fp32')]:.2f}"
          f" (best tuned eager: {h32 / best('fp32'):.2f})")
    print(f"* Hydra bf16 / PyTorch bf16 autocast (default threads): {h16 / med[('eager', 'bf16')]:.2f}"
          f" (best tuned eager: {h16 / best('bf16'):.2f})")
    print(f"* Hydra bf16 / Hydra fp32: {h16 / h32:.2f}")
PY
