#!/usr/bin/env bash
# Fuzzes the code that parses bytes from outside (tests/fuzz: the manifest parser and grid
# expansion, the checkpoint reader, the spill-file trailer check, the TrialSpec decoder, the
# safetensors header parser) with
# libFuzzer under ASan + UBSan:
#   scripts/fuzz.sh [seconds-per-target]     (default 30)
# HYDRA_FUZZ_SEED=N and HYDRA_FUZZ_RUNS=M make a run repeatable: seed N, at most M inputs a
# target (the seconds still cap it). scripts/test.sh does that, so a CI verdict does not depend
# on luck; fuzz by hand without them (a random seed) to look for new bugs.
# Builds the torch-free fuzz targets with clang in build-fuzz/ (or $HYDRA_FUZZ_BUILD_DIR) and
# runs each for the given seconds over a copy of its seed corpus and its regressions. Fails if
# any target crashes (a sanitizer report, a violated property, a timeout or running out of
# memory), leaving the input in build-fuzz/crashes/<target>/ and printing it in base64: fix the
# bug and add the input to tests/fuzz/regressions/<target>/, where ctest replays it in every
# build.
set -euo pipefail
cd "$(dirname "$0")/.."
SECS="${1:-30}"
BUILD_DIR="${HYDRA_FUZZ_BUILD_DIR:-build-fuzz}"
TARGETS=(manifest checkpoint spill_trailer trial_proto safetensors)
export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/ccache}"
# A clone at another path (CI's) reuses the cache: paths under the checkout are hashed relative
# to it and the working directory is not hashed (debug info names the first clone's directory).
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}"
export CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-true}"

if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  CXX=clang++ cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DHYDRA_WITH_TORCH=OFF -DHYDRA_BUILD_BENCH=OFF -DHYDRA_FUZZ=ON \
    -DHYDRA_SANITIZE=address,undefined >/dev/null
fi
ninja -C "$BUILD_DIR" -j"${HYDRA_JOBS:-2}" "${TARGETS[@]/#/fuzz_}"

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1}"
export LSAN_OPTIONS="suppressions=$PWD/tests/sanitizers/lsan.supp"

# fuzz TARGET: runs one target; a non-zero status if it crashed.
fuzz() {
  local t="$1" corpus="$BUILD_DIR/fuzz/corpus/$1" crashes="$BUILD_DIR/crashes/$1"
  local log="$BUILD_DIR/fuzz/$1.log"
  rm -rf "$corpus" "$crashes"
  mkdir -p "$corpus" "$crashes"
  for d in "tests/fuzz/corpus/$t" "tests/fuzz/regressions/$t"; do
    if [ -d "$d" ]; then find "$d" -maxdepth 1 -type f -exec cp {} "$corpus/" \; ; fi
  done
  local repeatable=()
  if [ -n "${HYDRA_FUZZ_SEED:-}" ]; then repeatable+=(-seed="$HYDRA_FUZZ_SEED"); fi
  if [ -n "${HYDRA_FUZZ_RUNS:-}" ]; then repeatable+=(-runs="$HYDRA_FUZZ_RUNS"); fi
  echo "== fuzz_$t: ${SECS}s ${repeatable[*]} from $(ls "$corpus" | wc -l) seeds"
  if "$BUILD_DIR/tests/fuzz/fuzz_$t" -max_total_time="$SECS" -timeout=10 -rss_limit_mb=2048 \
      "${repeatable[@]}" -print_final_stats=1 -artifact_prefix="$crashes/" "$corpus" \
      >"$log" 2>&1; then
    grep -E "^stat::(number_of_executed_units|peak_rss_mb)|^#[0-9]+ +DONE" "$log" || true
    return 0
  fi
  tail -n 80 "$log"
  for f in "$crashes"/*; do
    [ -f "$f" ] || continue
    echo "fuzz_$t crashed on $f ($(stat -c %s "$f") bytes), in base64:"
    base64 -w 0 "$f" | head -c 16384
    echo
  done
  return 1
}

failed=()
for t in "${TARGETS[@]}"; do
  fuzz "$t" || failed+=("$t")
done
if ((${#failed[@]})); then
  echo "fuzz: crashes in ${failed[*]} (inputs under $BUILD_DIR/crashes/)" >&2
  exit 1
fi
echo "fuzz: ${#TARGETS[@]} targets ran ${SECS}s each without a crash"
