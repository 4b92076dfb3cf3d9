#!/usr/bin/env bash
# bench/spill: GPT-2 small (12 layers x 768, byte vocabulary, context 256, batch 8 = 2048 tokens
# per step, AdamW) on a CPU device with budgets of 100% (no spilling), 50% and 25% of the trial's
# footprint, and 25% with the state on disk; rounds alternate the configurations and the ratios
# are to the 100% run of the same invocation.
#   bash bench/spill.sh [--smoke] [--rounds N] [--largest LAYERSxWIDTH] [--precision fp32|bf16]
#                       [--init model.safetensors]   (--largest only: start from a checkpoint)
#   bash bench/spill.sh --gpu cuda:0 [--smoke] [--shapes medium,xl] [--precision bf16]
#                       (a CUDA build: issue 17's GPU benchmark; below)
#   bash bench/spill.sh --gpu cuda:0 --largest auto|LAYERSxWIDTH [--offload host|disk]
#                       (the largest GPT trained on one GPU, its state in host memory or on disk)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN="${HYDRA_BENCH_SPILL_BIN:-build/bench/spill}"
PY="${HYDRA_BENCH_PYTHON:-python3}"
CORPUS=examples/data/corpus.txt
SPILL_DIR="${HYDRA_BENCH_SPILL_DIR:-${TMPDIR:-/tmp}/hydra-bench-spill-$$}"
ROUNDS=2
MODEL="--layers 12 --embd 768 --heads 12 --ctx 256 --batch 8 --steps 3 --warmup 1"
LARGEST=""
PRECISION=fp32
INIT=()
GPU=""
SHAPE_FILTER=""
SMOKE=0
OFFLOAD=host
while [ $# -gt 0 ]; do
  case "$1" in
    --smoke) SMOKE=1; ROUNDS=1; MODEL="--layers 8 --embd 64 --heads 4 --ctx 64 --batch 4 --steps 2 --warmup 1" ;;
    --gpu) GPU="$2"; shift ;;
    --rounds) ROUNDS="$2"; shift ;;
    --largest) LARGEST="$2"; shift ;;
    --precision) PRECISION="$2"; shift ;;
    --init) INIT=(--init "$2"); shift ;;
    --shapes) SHAPE_FILTER="$2"; shift ;;
    --offload) OFFLOAD="$2"; shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
trap 'rm -rf "$SPILL_DIR"' EXIT

# gpu_largest: the largest GPT trained on one GPU ($GPU), in a CUDA build: the GPU's memory as
# the device budget (what a trial without deviceMemoryBudget gets), or half the model's
# footprint where that is less, so that it spills even on a GPU that would hold it (the host's
# RAM, not the GPU, may bound the model: 128 GiB beside an H200's 139), the state in host memory
# (--offload host) or on disk (--offload disk), GPT-2's vocabulary, context 1024, batch 2, heads
# of 128 wide; one step after a warm-up. --largest auto takes, of the shapes below (or
# HYDRA_BENCH_LARGEST_SHAPES), the largest whose admission fits: its host bytes within 70% of
# the memory this process may still take (MemAvailable, and the cgroup's limit), and on disk its
# spill files within 85% of the spill directory's free space. Uses time_left and timed_out of
# the GPU branch below.
# largest_dims LAYERSxWIDTH [TIER]: bench/spill's arguments for that shape (gpu_largest's ctx
# and batch), budget aside, in DIMS; the state in TIER (default: --offload's).
largest_dims() {
  local layers=${1%x*} width=${1#*x}
  DIMS=(--corpus "$CORPUS" --layers "$layers" --embd "$width"
    --heads $((width / 128 > 0 ? width / 128 : 1)) --ctx "$ctx" --vocab 50257 --batch "$batch"
    --offload "${2:-$OFFLOAD}" --spill-dir "$SPILL_DIR" --precision "$PRECISION")
}

gpu_largest() {
  local shapes=(${HYDRA_BENCH_LARGEST_SHAPES:-80x8192 64x6144 48x6144 48x5120 40x5120 40x4096 36x4096 32x4096 32x3072 32x2560 24x2048 24x1024})
  [ "$LARGEST" = auto ] || shapes=("$LARGEST")
  local ctx=${HYDRA_BENCH_LARGEST_CTX:-1024} batch=${HYDRA_BENCH_LARGEST_BATCH:-2}
  mkdir -p "$SPILL_DIR"
  local host_free disk_free
  host_free=$(awk '/^MemAvailable:/ {printf "%.0f", $2 * 1024}' /proc/meminfo)
  if [ -r /sys/fs/cgroup/memory.max ] && [ "$(cat /sys/fs/cgroup/memory.max)" != max ]; then
    local cg=$(($(cat /sys/fs/cgroup/memory.max) - $(cat /sys/fs/cgroup/memory.current)))
    ((cg < host_free)) && host_free=$cg
  fi
  disk_free=$(($(stat -f -c '%a * %S' "$SPILL_DIR")))
  local chosen="" plan="" at="" budget="" limit=()
  for shape in "${shapes[@]}"; do
    local layers=${shape%x*} width=${shape#*x}
    # Every parameter's weights and AdamW state (12 bytes) sit in host memory or on disk.
    local params=$((12 * layers * width * width + 50257 * width))
    local tier_free=$((disk_free * 85 / 100))
    [ "$OFFLOAD" = disk ] || tier_free=$((host_free * 7 / 10))
    if ((12 * params > tier_free)); then
      echo "$shape: $((12 * params >> 30)) GiB of weights and AdamW state, over $((tier_free >> 30)) GiB of $OFFLOAD"
      continue
    fi
    # The budget to train it under: the GPU's memory, or half the footprint where that is less;
    # then its admission at that budget (the host and disk bytes the run will take: a plan at
    # the GPU's whole memory holds the model in one shard, whose host staging is the model's).
    # The footprint is asked of a plan with the state in host memory: on disk, one shard of the
    # whole model reserves twice its state there (a write-back beside a read), and the fifth
    # GPU run passed over 32x3072 so, refused for 84 GiB where at half the footprint it needs
    # about half that.
    largest_dims "$shape" host
    if ! plan=$("$BIN" --devices "$GPU" "${DIMS[@]}" --budget-device --plan-only 2>"$OUT.err"); then
      echo "$shape: refused: $(tail -c 200 "$OUT.err" | tr '\n' ' ')"
      continue
    fi
    budget=$("$PY" -c 'import json, sys; a = json.loads(sys.argv[1]); half = a["footprintBytes"] // 2
print(min(a["deviceMemoryBytes"], half) if a["deviceMemoryBytes"] > 0 else half)' "$plan")
    # Half the footprint leaves too little beside the tied embedding of a small model: the
    # device's memory then.
    largest_dims "$shape"
    limit=(--budget-bytes "$budget")
    if ! at=$("$BIN" --devices "$GPU" "${DIMS[@]}" "${limit[@]}" --plan-only 2>/dev/null); then
      limit=(--budget-device)
      if ! at=$("$BIN" --devices "$GPU" "${DIMS[@]}" "${limit[@]}" --plan-only 2>"$OUT.err"); then
        echo "$shape: refused: $(tail -c 200 "$OUT.err" | tr '\n' ' ')"
        continue
      fi
    fi
    if "$PY" -c 'import json, sys; a = json.loads(sys.argv[1]); h, d = int(sys.argv[2]), int(sys.argv[3])
ok = a["hostBytes"] <= h * 0.7 and a["diskBytes"] <= d * 0.85
hb, db, hl, dl = a["hostBytes"] / 2**30, a["diskBytes"] / 2**30, h * 0.7 / 2**30, d * 0.85 / 2**30
ok or print(f"{sys.argv[4]}: host {hb:.1f} GiB (limit {hl:.1f}), disk {db:.1f} GiB (limit {dl:.1f}): too much")
sys.exit(0 if ok else 1)' "$at" "$host_free" "$disk_free" "$shape"; then
      chosen=$shape
      break
    fi
  done
  echo "host memory available: $((host_free >> 30)) GiB; spill directory free: $((disk_free >> 30)) GiB"
  if [ -z "$chosen" ]; then
    echo "no shape of ${shapes[*]} fits (last: $(tail -c 300 "$OUT.err" 2>/dev/null))"
    return 0
  fi
  local left line
  largest_dims "$chosen"
  left=$(time_left)
  # shellcheck disable=SC2086
  if ((left > 0)) && line=$(timeout -k 10 "$left" "$BIN" --devices "$GPU" "${DIMS[@]}" "${limit[@]}" \
      --steps 1 --warmup 1 2>"$OUT.err"); then
    "$PY" - "$line" "$chosen" <<'PY'
import json, sys
r, shape = json.loads(sys.argv[1]), sys.argv[2]
gib = lambda b: f"{b / 2**30:.1f} GiB"
print("| shape | parameters | state tier | device budget | footprint | shards (policies) | optimizer per shard (d/h) | host / disk bytes | set-up | seconds per step | tokens/s | device peak: ledger / allocator / reserved | peak resident | loss |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
print(f"| {shape} {r['precision']} | {r['parameters'] / 1e9:.2f} B | {r['offload']} | {gib(r['budgetBytes'])} on {r['deviceModel']} | "
      f"{gib(r['footprintBytes'])} ({r['footprintBytes'] / max(r['budgetBytes'], 1):.1f}x the budget) | "
      f"{r['shards']} ({r['policies']}) | {r['optimizerPlacements']} | {gib(r['hostBytes'])} / {gib(r['diskBytes'])} | "
      f"{r['setupSeconds']:.0f} s | {r['secondsPerStep']:.1f} | {r['tokensPerSecond']:.0f} | "
      f"{gib(r['peakDeviceBytes'])} / {gib(r['allocatorPeakBytes'])} / {gib(r['reservedPeakBytes'])} | "
      f"{gib(r['peakResidentBytes'])} | {r['finalLoss']:.3f} |")
if str(r.get("device", "")).startswith("cuda"):
    print(f"\nLibTorch's caching allocator made expandable segments: {'yes' if r['expandableSegments'] else 'no'}"
          f"{'; %d allocations freed the cache and retried' % r['allocatorRetries'] if r.get('allocatorRetries') else ''}")
PY
  else
    timed_out "$?" "$left"
    echo "$chosen ($OFFLOAD) failed: $(tail -c 300 "$OUT.err")"
  fi
}

if [ -n "$GPU" ]; then
  # On one GPU: the GPT-2 medium (24 x 1024) and XL (48 x 1600) shapes, GPT-2's vocabulary,
  # context 1024, at 100%, 50% and 25% of the footprint with the state in host memory and 25%
  # with it on disk, the optimizer where the measured link puts it; tokens/s as ratios to the
  # unspilled run, and PyTorch eager (bench/train_throughput.py) on the same GPU and shape.
  # name layers width heads batch context vocabulary
  SHAPES=("medium 24 1024 16 8 1024 50257" "xl 48 1600 25 4 1024 50257")
  # The unspilled run, the one every ratio divides by, and eager, which it is compared with:
  # more steps, the same for both (one noisy step moved the ratio by a few percent). Spilled
  # runs warm up two steps: the executor's lookahead holds shards only from the third on.
  STEPS="--steps 3 --warmup 2" REF_STEPS=8 REF_WARMUP=2
  if ((SMOKE)); then SHAPES=("smoke 8 128 4 8 64 256"); STEPS="--steps 2 --warmup 1" REF_STEPS=2 REF_WARMUP=1; fi
  if [ -n "$SHAPE_FILTER" ]; then
    kept=()
    for shape in "${SHAPES[@]}"; do
      [[ ",$SHAPE_FILTER," == *",${shape%% *},"* ]] && kept+=("$shape")
    done
    ((${#kept[@]})) || { echo "--shapes: none of '$SHAPE_FILTER' is a shape here" >&2; exit 2; }
    SHAPES=("${kept[@]}")
  fi
  # HYDRA_BENCH_DEADLINE (seconds since the epoch; unset: none): a GPU machine is lent for
  # minutes, so each run gets the time left and a run that cannot start in time is recorded as
  # skipped. The most telling runs come first: unspilled, PyTorch eager, 50%, then the rest.
  # HYDRA_BENCH_RUN_MAX (seconds; unset: none) caps each run, so that one that hangs leaves
  # time for the rest.
  DEADLINE="${HYDRA_BENCH_DEADLINE:-0}"
  # HYDRA_BENCH_PROFILE_DIR (unset: none): the unspilled run, the first at 50% and eager's record
  # two more steps' GPU kernels there (<shape>-<precision>-hydra.json, ...-spilled50.json,
  # ...-eager-<attention>-<adamw>.json), for bench/trace_summary.py.
  PROFILE_DIR="${HYDRA_BENCH_PROFILE_DIR:-}"
  [ -z "$PROFILE_DIR" ] || mkdir -p "$PROFILE_DIR"
  RUN_MAX="${HYDRA_BENCH_RUN_MAX:-100000}"
  OUT=$(mktemp)
  trap 'rm -rf "$SPILL_DIR" "$OUT" "$OUT.err" "$OUT.line"' EXIT
  json_tail() { "$PY" -c 'import json,sys; print(json.dumps(open(sys.argv[1]).read()[-300:]))' "$OUT.err"; }
  # timed_out RC LEFT: a run that had no time, or was killed at the deadline, says so.
  timed_out() {
    if (($2 <= 0)); then
      echo "skipped: out of time" >"$OUT.err"
    elif (($1 == 124 || $1 == 137)); then
      echo "skipped: out of time after $2 s" >"$OUT.err"
    fi
  }
  # time_left: prints the seconds a run may take (0: none left); 100000 without a deadline.
  time_left() {
    local left=100000
    [ "$DEADLINE" = 0 ] || left=$((DEADLINE - $(date +%s)))
    ((left < RUN_MAX)) || left=$RUN_MAX
    if ((left < 30)); then echo 0; else echo "$left"; fi
  }
  if [ -n "$LARGEST" ]; then
    gpu_largest
    exit 0
  fi
  eager_done=""
  for shape in "${SHAPES[@]}"; do
    set -- $shape
    name=$1 ctx=$6 vocab=$7 dims="--layers $2 --embd $3 --heads $4 --ctx $6 --vocab $7 --batch $5"
    eager_args="--layers $2 --embd $3 --heads $4 --ctx $ctx --vocab $vocab --batch $5"
    # Budgets are fractions of the footprint the plans count (attention fused, where the
    # build fuses it). Eager runs PyTorch's fused attention (F.scaled_dot_product_attention), as
    # Hydra does. 50% with every shard but the last recomputing its forward: what keeping
    # graphs on the GPU buys; last, unspilled with the scores kept, and eager so: what fusing
    # attention buys.
    # --cap-device: the allocator capped at the budget, as on a GPU that trials share (its
    # cached, fragmented memory then counts; the row says how often it had to retry).
    # --no-activation-offload: the same budget with no graph offloaded to host memory (kept on
    # the GPU or recomputed), what offloading buys.
    # --no-selective-recompute: the same with every LayerNorm and GELU output kept.
    # --no-resident-state: the same with every shard's state crossing the link each step (the
    # plans keep some shards' state on the GPU where the link would bound the step: bf16).
    # --no-lookahead: the same with shards coming up and leaving only when the plan says (what
    # the executor's lookahead buys: weights kept from forward to backward, uploads begun early).
    CFGS=("1.0 host" "eager auto" "0.5 host" "0.5 host --no-lookahead" "0.5 host --no-resident-state"
      "0.5 host --no-activation-offload"
      "0.5 host --no-selective-recompute" "0.5 host --cap-device"
      "0.5 host --no-device-stash" "0.25 host" "0.25 host --no-activation-offload"
      "0.25 host --cap-device" "0.25 disk" "1.0 host --no-fused-attention" "eager math")
    # On a GPU, eager also with AdamW(fused=True), the fastest PyTorch has (Hydra's is fused).
    [[ "$GPU" != cuda* ]] || CFGS=("${CFGS[@]:0:2}" "eager auto fused" "${CFGS[@]:2}")
    # bf16: then issue 18 item 2's side by side, matrix weights sent as bf16 to a host-stepped
    # optimizer (measured once: off by default).
    if [ "$PRECISION" = bf16 ]; then
      CFGS+=("0.25 host --optimizer=host" "0.25 host --optimizer=host --bf16-transit")
    fi
    # HYDRA_BENCH_CONFIGS ("1.0 host;eager auto fused;0.5 host", say): only these runs.
    if [ -n "${HYDRA_BENCH_CONFIGS:-}" ]; then
      kept=()
      for cfg in "${CFGS[@]}"; do
        [[ ";$HYDRA_BENCH_CONFIGS;" == *";$cfg;"* ]] && kept+=("$cfg")
      done
      CFGS=("${kept[@]}")
    fi
    for cfg in "${CFGS[@]}"; do
      set -- $cfg
      left=$(time_left)
      if [ "$1" = eager ]; then
        # "auto": the attention of Hydra's unspilled run of this shape (fused: PyTorch's SDPA;
        # the scores kept: math); each kind runs once.
        attention=$2
        if [ "$attention" = auto ]; then
          attention=math
          grep -q "\"shape\": \"$name\", \"args\": \"\", .*\"attention\":\"fused\"" "$OUT" && attention=sdpa
        fi
        adamw=${3:-default}
        [[ " $eager_done " == *" $name/$attention/$adamw "* ]] && continue
        eager_done+=" $name/$attention/$adamw"
        trace=()
        [ -z "$PROFILE_DIR" ] || trace=(--profile-trace "$PROFILE_DIR/$name-$PRECISION-eager-$attention-$adamw.json")
        # shellcheck disable=SC2086
        if ((left > 0)) && timeout -k 10 "$left" "$PY" bench/train_throughput.py --device "$GPU" \
            --corpus "$CORPUS" $eager_args --steps $REF_STEPS --warmup $REF_WARMUP --precision "$PRECISION" \
            --attention "$attention" --adamw "$adamw" "${trace[@]}" >"$OUT.line" 2>"$OUT.err"; then
          sed "s/^{/{\"shape\": \"$name\", /" "$OUT.line" >>"$OUT"
        else
          timed_out "$?" "$left"
          echo "{\"shape\": \"$name\", \"impl\": \"pytorch-eager\", \"attention\": \"$attention\", \"adamw\": \"$adamw\", \"error\": $(json_tail)}" >>"$OUT"
        fi
        continue
      fi
      steps=$STEPS trace=()
      if [ "$cfg" = "1.0 host" ]; then
        steps="--steps $REF_STEPS --warmup $REF_WARMUP"
        [ -z "$PROFILE_DIR" ] || trace=(--profile-trace "$PROFILE_DIR/$name-$PRECISION-hydra.json")
      elif [ "$cfg" = "0.5 host" ] && [ -n "$PROFILE_DIR" ]; then
        trace=(--profile-trace "$PROFILE_DIR/$name-$PRECISION-spilled50.json")
      fi
      # shellcheck disable=SC2086
      if ((left > 0)) && line=$(timeout -k 10 "$left" "$BIN" --devices "$GPU" --corpus "$CORPUS" $dims \
          $steps --budget-fraction "$1" --offload "$2" "${@:3}" "${trace[@]}" --spill-dir "$SPILL_DIR" \
          --precision "$PRECISION" 2>"$OUT.err"); then
        echo "{\"shape\": \"$name\", \"args\": \"${*:3}\", ${line#\{}" >>"$OUT"
        # The run's own lines (the factory's measured rates) and its JSON line (the plan's
        # estimated step among them) to stderr: gpu-check.sh keeps them in its logs.
        { echo "== $name $*"; cat "$OUT.err"; echo "$line"; } >&2
      else
        timed_out "$?" "$left"
        echo "{\"shape\": \"$name\", \"budgetFraction\": $1, \"offload\": \"$2\", \"args\": \"${*:3}\", \"error\": $(json_tail)}" >>"$OUT"
      fi
    done
  done
  "$PY" - "$OUT" <<'PY'
import json, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
shapes = {}
for r in runs:
    shapes.setdefault(r.get("shape") or "", []).append(r)
print("| shape | budget | state tier | shards (s: stash, r: recompute, i: recompute, input in host memory, o: offload) | optimizer per shard (d/h; R: on the device, state resident) | tokens/s | ratio to unspilled | step: planned (link) / measured | device peak: planned / ledger / allocator / reserved |")
print("|---|---|---|---|---|---|---|---|---|")
for name, rs in shapes.items():
    spill = [r for r in rs if r.get("impl") != "pytorch-eager"]
    eager = [r for r in rs if r.get("impl") == "pytorch-eager"]
    base = next((r for r in spill if r.get("budgetFraction") == 1.0 and "tokensPerSecond" in r), None)
    for r in spill:
        if "tokensPerSecond" not in r:
            error = r.get('error', '').strip()
            outcome = error if error.startswith("skipped") else f"failed: {error[-100:]}"
            print(f"| {name} | {r['budgetFraction']:.0%} | {r['offload']} | - | {r.get('args') or '-'} | "
                  f"{outcome} | - | - | - |")
            continue
        ratio = f"{r['tokensPerSecond'] / base['tokensPerSecond']:.2f}" if base else "-"
        attention = f", attention {r['attention']}" if r.get("attention", "kept") != "kept" else ""
        attention += ", LayerNorm/GELU recomputed" if r.get("selectiveRecompute") else ""
        attention += f", {r['residentBytes'] / 2**30:.2f} GiB resident" if r.get("residentBytes") else ""
        attention += f"; {r['args']}" if r.get("args") else ""
        if r.get("budgetFraction", 1.0) < 1.0 and "bytesUploadedPerStep" in r:
            attention += f"; {r['bytesUploadedPerStep'] / 1e9:.2f} GB up a step"
            attention += f", {r.get('lookaheadHoldsPerStep', 0):.1f} lookahead holds" if r.get("lookahead") else ""
        print(f"| {name}: {r['parameters'] / 1e6:.0f}M on {r['deviceModel']} | {r['budgetFraction']:.0%} "
              f"({r['budgetBytes'] / 2**30:.1f} GiB) | {r['offload']} | {r['shards']} "
              f"({r.get('policies', '')}{attention}) | "
              f"{r['optimizerPlacements']}{' + bf16 transit' if r.get('bf16Transit') else ''} | "
              f"{r['tokensPerSecond']:.0f} | {ratio} | "
              # The planner's estimate of a step (its link part where it weighed the link)
              # beside the step measured: what calibrates the estimate.
              f"{r.get('estimatedStepSeconds', 0) * 1e3:.1f} ({r.get('linkSeconds', 0) * 1e3:.1f}) / "
              f"{r['secondsPerStep'] * 1e3:.1f} ms | "
              f"{r.get('plannedPeakDeviceBytes', 0) / 2**30:.2f} / "
              f"{r['peakDeviceBytes'] / 2**30:.2f} / {r.get('allocatorPeakBytes', 0) / 2**30:.2f} / "
              f"{r.get('reservedPeakBytes', 0) / 2**30:.2f} GiB"
              f"{', %d allocator retries' % r['allocatorRetries'] if r.get('allocatorRetries') else ''} |")
    for e in eager:
        fused_adamw = ", fused AdamW" if e.get("adamw") == "fused" else ""
        label = f"{name}: PyTorch eager ({e.get('attention', 'math')} attention{fused_adamw}), same GPU"
        if "error" in e:
            error = e['error'].strip()
            outcome = error if error.startswith("skipped") else f"failed: {error[-100:]}"
            print(f"| {label} | - | - | - | - | {outcome} | - | - | - |")
            continue
        # Against Hydra's unspilled run with the same attention.
        same = next((r for r in spill if r.get("budgetFraction") == 1.0 and "tokensPerSecond" in r and
                     (r.get("attention") == "fused") == (e.get("attention") == "sdpa")), None)
        vs = f"Hydra unspilled / eager: {same['tokensPerSecond'] / e['tokens_per_second']:.2f}" if same else "-"
        print(f"| {label} | - | - | - | - | {e['tokens_per_second']:.0f} | {vs} | - | "
              f"{e.get('peak_allocated_bytes', 0) / 2**30:.1f} GiB (allocator) |")
gpu = [r for r in runs if str(r.get("device", "")).startswith("cuda") and "expandableSegments" in r]
if gpu:
    print(f"\nLibTorch's caching allocator made expandable segments: "
          f"{'yes' if all(r['expandableSegments'] for r in gpu) else 'no'}")
PY
  exit 0
fi

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
