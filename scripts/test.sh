#!/usr/bin/env bash
# README command 2: set up, build, and run the whole test suite:
#   1. every unit and integration test (ctest) in build/, the Kubernetes ones against a real
#      kube-apiserver + etcd built from Go modules (tests/envtest; with the real kube-scheduler,
#      kube-controller-manager's garbage collector, a test kubelet and real Kueue where a test
#      needs them), the Helm chart rendered by
#      helm (built from its Go module) and applied server-side, the dashboards' PromQL parsed
#      by Prometheus's parser against the metrics real processes export, the GPT-2 checkpoint
#      tests against Hugging Face transformers (scripts/hf-venv.sh: a venv from PyPI, cached),
#   2. the torch-free libraries and their tests under ASan + UBSan in build-asan/,
#   3. libFuzzer on every fuzz target (tests/fuzz) under ASan + UBSan in build-fuzz/, repeatably:
#      seed HYDRA_FUZZ_SEED (default 1), HYDRA_FUZZ_RUNS inputs (default 200000), at most
#      HYDRA_FUZZ_SECONDS (default 120) a target,
#   4. the CUDA build (scripts/build-cuda.sh: PyPI's CUDA LibTorch, cached in ~/.cache/hydra),
#      compiled and linked without a GPU, and its GPU tests, which skip cleanly without one,
#   5. every benchmark at smoke size.
set -euo pipefail
cd "$(dirname "$0")/.."
# Each stage's heading says how long the run has taken so far (CI has 90 minutes).
stage() { echo "== $* ($((SECONDS / 60)) min $((SECONDS % 60)) s into the run)"; }
bash scripts/setup.sh
bash scripts/build.sh

stage "Kubernetes test control plane (tests/envtest: kube-apiserver + etcd, cached)"
tests/envtest/build >/dev/null
stage "test tools from Go modules (helm, Prometheus's PromQL parser, the test kubelet, Kueue; cached)"
tests/helm/build >/dev/null
tests/promql/build >/dev/null
tests/kubelet/build >/dev/null
tests/kueue/build >/dev/null

stage "the Hugging Face venv (transformers, tokenizers from PyPI; cached)"
HYDRA_HF_PYTHON="$(bash scripts/hf-venv.sh)"
export HYDRA_HF_PYTHON  # hf_transformers_test fails, not skips, if it does not work

stage "tests"
(cd build && ctest --output-on-failure --timeout 900 -j1)

stage "sanitizers (ASan + UBSan, torch-free libraries)"
HYDRA_BUILD_DIR=build-asan bash scripts/build.sh -DHYDRA_WITH_TORCH=OFF \
  -DHYDRA_SANITIZE=address,undefined -DCMAKE_BUILD_TYPE=Debug
(cd build-asan && LSAN_OPTIONS="suppressions=$PWD/../tests/sanitizers/lsan.supp" \
  ctest --output-on-failure --timeout 900 -j2)

stage "fuzzing (libFuzzer, ASan + UBSan, repeatable: a fixed seed and number of inputs)"
HYDRA_FUZZ_SEED="${HYDRA_FUZZ_SEED:-1}" HYDRA_FUZZ_RUNS="${HYDRA_FUZZ_RUNS:-200000}" \
  bash scripts/fuzz.sh "${HYDRA_FUZZ_SECONDS:-120}"

stage "CUDA build (compile and link against PyPI's CUDA LibTorch; no GPU needed)"
bash scripts/build-cuda.sh
build-cuda/tests/unit/executor/std_binding_test  # libstdc++'s std::filesystem, not the wheel's
build-cuda/tests/unit/executor/std_binding_static_first_test  # so where -lstdc++ finds libstdc++.a
build-cuda/tests/unit/executor/gpus_test
build-cuda/tests/unit/executor/cuda_executor_test  # skips: no GPU here
# torch 2.11's fused AdamW (a GPU's) against the per-parameter update, and storages freed and
# refilled in place under 2.11's autograd, on the CPU.
build-cuda/tests/unit/executor/optimizer_test
build-cuda/tests/unit/executor/adamw_kernel_test  # the host optimizer's pass, as that build compiles it
build-cuda/tests/unit/executor/storage_in_place_test
# Saved-tensor hooks from C++ (the engine installed before main) under torch 2.11's autograd.
build-cuda/tests/unit/executor/offloaded_graph_test
# LayerNorm and GELU recomputed in backward (a custom autograd function) under torch 2.11.
build-cuda/tests/unit/executor/selective_recompute_test
# torch 2.11's fused attention (a GPU's flash kernels; here the CPU's) against the kept scores,
# alone and in the GPT block (which hands it views of the qkv projection's heads).
build-cuda/tests/unit/executor/attention_test
build-cuda/tests/unit/executor/gpt2_test
# The pilot times a block with the fused attention the executors run (torch 2.11 has it).
build-cuda/tests/unit/executor/pilot_test
# What a block and spilled plans allocate against the cost model and the budget, with torch
# 2.11's CPU kernels (fused attention among them).
build-cuda/tests/unit/executor/device_memory_test
# The GPU code paths of the executors on the CPU, against torch 2.11 (build/ has 1.13).
build-cuda/tests/unit/executor/spilling_executor_test \
  --gtest_filter='*Unsharded*:*Checkpoint*:*Moves*:*Transit*:*Offloaded*'
# The CUDA build's hydra trains the example on the CPU (torch 2.11 there, 1.13 in build/).
cuda_run="$(mktemp -d)"
build-cuda/cli/hydra run examples/tiny-sweep.yaml -o "$cuda_run/out" --progress quiet >/dev/null
test -s "$cuda_run/out/results.json"
rm -rf "$cuda_run"

stage "benchmarks (smoke size)"
bash bench/run_all.sh --smoke
stage "done"
