#!/usr/bin/env python3
"""Sums Chrome traces of training steps (bench/spill --profile-trace, bench/train_throughput.py
--profile-trace) by GPU kernel, side by side: where one implementation's step spends GPU time
that another's does not.

  python3 bench/trace_summary.py --steps 2 hydra=hydra.json eager=eager.json

Prints, per trace and per step: the span from the first GPU kernel or copy to the last, the
time the GPU was busy (the union of kernels and copies over every stream), the kernels' time by
category (matrix products, attention, optimizer, ...), the synchronizing CUDA calls the host
made, and the kernels taking the most time.
"""
import argparse, json, re, sys

# First match wins: a kernel's category by its name.
CATEGORIES = [
    ("attention", r"flash|fmha|attention|attn"),
    ("optimizer", r"adam|multi_tensor|sgd"),
    ("matmul", r"gemm|nvjet|xmma|cutlass|cublas|matmul|splitk|sm\d\d_"),
    ("layer norm", r"layer_norm|layernorm|welford"),
    ("softmax/loss", r"softmax|nll|cross_entropy|log_sum|logsumexp"),
    ("reduce", r"reduce"),
    ("copy/cast", r"copy|cat_|cast|to_copy|index|gather|scatter"),
    ("elementwise", r"elementwise|vectorized|unrolled|gelu|tanh|mul|add|fill"),
]
SYNC = re.compile(r"Synchronize|cudaMemcpy(?!Async)|cudaFree\b|cudaMalloc\b|cudaHostAlloc|cudaMallocHost")


def category(name):
    low = name.lower()
    for cat, pattern in CATEGORIES:
        if re.search(pattern, low):
            return cat
    return "other"


def load(path):
    with open(path) as f:
        events = json.load(f)
    return events["traceEvents"] if isinstance(events, dict) else events


def busy_us(intervals):
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total


def summarize(events):
    gpu = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    if not gpu:
        return None
    span = (max(e["ts"] + e["dur"] for e in gpu) - min(e["ts"] for e in gpu))
    kernels, cats, copies = {}, {}, {}
    for e in gpu:
        if e["cat"] == "kernel":
            k = kernels.setdefault(e["name"], [0.0, 0])
            k[0] += e["dur"]
            k[1] += 1
            cat = category(e["name"])
            cats[cat] = cats.get(cat, 0.0) + e["dur"]
        else:
            c = copies.setdefault(e["name"], [0.0, 0, 0])
            c[0] += e["dur"]
            c[1] += 1
            c[2] += e.get("args", {}).get("bytes", 0)
    syncs = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "cuda_runtime" and SYNC.search(e.get("name", "")):
            s = syncs.setdefault(e["name"], [0.0, 0])
            s[0] += e["dur"]
            s[1] += 1
    launches = sum(1 for e in events if e.get("ph") == "X" and e.get("cat") == "cuda_runtime"
                   and "Launch" in e.get("name", ""))
    return {"span": span, "busy": busy_us([(e["ts"], e["ts"] + e["dur"]) for e in gpu]),
            "kernel_time": sum(k[0] for k in kernels.values()),
            "kernels": kernels, "cats": cats, "copies": copies, "syncs": syncs, "launches": launches}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("traces", nargs="+", help="label=trace.json")
    p.add_argument("--steps", type=int, default=2, help="steps each trace recorded")
    p.add_argument("--top", type=int, default=20)
    a = p.parse_args()
    runs = []
    for arg in a.traces:
        label, _, path = arg.partition("=")
        try:
            s = summarize(load(path))
        except (OSError, ValueError, KeyError) as e:
            print(f"{label}: cannot read {path}: {e}", file=sys.stderr)
            return 1
        if s is None:
            print(f"{label}: {path} holds no GPU kernels", file=sys.stderr)
            return 1
        runs.append((label, s))
    ms = lambda us: us / 1000.0 / a.steps
    labels = [l for l, _ in runs]
    print("| per step (ms) | " + " | ".join(labels) + " |")
    print("|---|" + "---|" * len(runs))
    rows = [("GPU span (first kernel to last)", lambda s: ms(s["span"])),
            ("GPU busy (kernels and copies, all streams)", lambda s: ms(s["busy"])),
            ("kernels (sum over streams)", lambda s: ms(s["kernel_time"])),
            ("kernel launches", lambda s: s["launches"] / a.steps)]
    cats = sorted({c for _, s in runs for c in s["cats"]}, key=lambda c: -max(s["cats"].get(c, 0) for _, s in runs))
    rows += [(f"  {c}", lambda s, c=c: ms(s["cats"].get(c, 0.0))) for c in cats]
    copies = sorted({c for _, s in runs for c in s["copies"]})
    rows += [(f"{c}", lambda s, c=c: ms(s["copies"].get(c, [0.0])[0])) for c in copies]
    syncs = sorted({c for _, s in runs for c in s["syncs"]})
    rows += [(f"host waits: {c} (calls)", lambda s, c=c: s["syncs"].get(c, [0, 0])[1] / a.steps) for c in syncs]
    for name, f in rows:
        print(f"| {name} | " + " | ".join(f"{f(s):.2f}" for _, s in runs) + " |")
    for label, s in runs:
        print(f"\n{label}: the {a.top} kernels taking the most time (ms and calls a step)")
        top = sorted(s["kernels"].items(), key=lambda kv: -kv[1][0])[: a.top]
        for name, (us, n) in top:
            print(f"  {ms(us):8.3f} {n / a.steps:6.1f}  {category(name):12s} {name[:110]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
