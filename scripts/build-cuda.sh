#!/usr/bin/env bash
# Builds Hydra against a CUDA LibTorch on any machine, GPU or not (issue 17 item 1):
#   scripts/build-cuda.sh [--setup-only] [extra cmake -D options]
# 1. Sets up, once, a Python venv cached outside the repo (${HYDRA_CUDA_VENV:-~/.cache/hydra/cuda-venv})
#    holding PyPI's CUDA 13 torch wheel and the CUDA headers, libraries and nvcc from PyPI's
#    nvidia-* wheels (pinned below; a stamp file records what is installed, so later runs skip pip).
#    The CUDA 13 wheels ship only versioned sonames in lib/, and the FindCUDA that TorchConfig still
#    runs wants unversioned names and lib64/: the script adds those links.
# 2. Configures build-cuda/ (or $HYDRA_CUDA_BUILD_DIR) with -DHYDRA_WITH_CUDA=ON against that torch
#    and builds hydra, hydra-agent and the executor tests (tests/unit/executor), with ccache like
#    scripts/build.sh. Compiling and linking need no GPU; the Debian LibTorch 1.13 CPU build in
#    build/ stays the default.
# --setup-only stops after step 1 and prints the venv's site-packages directory.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/venv.sh
source scripts/venv.sh

VENV="${HYDRA_CUDA_VENV:-$HOME/.cache/hydra/cuda-venv}"
BUILD_DIR="${HYDRA_CUDA_BUILD_DIR:-build-cuda}"
# torch 2.11.0 from PyPI is the CUDA 13.0 build, the same as on the GPU machines (torch 2.11.0+cu130,
# nvcc 13.0). nvvm and crt must stay at 13.0: pip otherwise brings 13.x ones whose PTX the 13.0
# ptxas rejects ("Unsupported .version"). cccl provides <nv/target>, which cuda_fp16.h includes.
REQUIREMENTS=(
  "torch==2.11.0"
  "cuda-toolkit[nvcc,cudart]==13.0.2"
  "nvidia-nvvm==13.0.*"
  "nvidia-cuda-crt==13.0.*"
  "nvidia-cuda-cccl==13.0.*"
)

setup_venv() {
  local py="${HYDRA_CUDA_PYTHON:-}"
  if [ -z "$py" ]; then
    if [ -x /usr/bin/python3 ]; then py=/usr/bin/python3; else py="$(command -v python3)"; fi
  fi
  # About 3 GB of downloads and 5 GB on disk the first time.
  pinned_venv build-cuda "$VENV" "$py" .hydra-cuda-stamp "" "${REQUIREMENTS[@]}"
  SP="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  CU="$SP/nvidia/cu13"
  [ -x "$CU/bin/nvcc" ] || { echo "build-cuda: no nvcc at $CU/bin/nvcc" >&2; exit 1; }
  [ -f "$SP/torch/share/cmake/Torch/TorchConfig.cmake" ] || {
    echo "build-cuda: no TorchConfig.cmake under $SP/torch" >&2
    exit 1
  }
  # Unversioned names (libcudart.so -> libcudart.so.13) and lib64/ for FindCUDA.
  local f b
  for f in "$CU"/lib/*.so.*; do
    [ -e "$f" ] || continue
    b="${f%%.so.*}.so"
    [ -e "$b" ] || ln -s "$(basename "$f")" "$b"
  done
  [ -e "$CU/lib64" ] || ln -s lib "$CU/lib64"
  # The wheel's include/ also holds protobuf 3.13's headers (include/google), an -isystem
  # directory of every torch target: they would shadow Debian's protobuf 3.21 in translation
  # units that include gRPC's generated code (agent/main.cc). No torch header needs them.
  if [ -d "$SP/torch/include/google" ]; then
    mv "$SP/torch/include/google" "$SP/torch/include/google.hidden-by-hydra"
  fi
  exec 9>&-
}

SETUP_ONLY=0
if [ "${1:-}" = "--setup-only" ]; then
  SETUP_ONLY=1
  shift
fi
setup_venv
if ((SETUP_ONLY)); then
  echo "$SP"
  exit 0
fi

# ccache and precompiled headers, as in scripts/build.sh (CMakeLists.txt sets the ccache launcher).
export CCACHE_SLOPPINESS="${CCACHE_SLOPPINESS:-pch_defines,time_macros,include_file_mtime,include_file_ctime}"
export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/ccache}"
# A clone at another path (CI's) reuses the cache: paths under the checkout are hashed relative
# to it and the working directory is not hashed (debug info names the first clone's directory).
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}"
export CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-true}"
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  # Torch_DIR and Caffe2_DIR, not CMAKE_PREFIX_PATH=$SP/torch: the wheel also ships protoc 3.13
  # (torch/bin) and protobuf 3.13 headers (torch/include/google), which FindProtobuf would then
  # pick over Debian's protobuf 3.21; and Debian's LibTorch 1.13 config must never be found.
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DHYDRA_WITH_CUDA=ON \
    -DTorch_DIR="$SP/torch/share/cmake/Torch" -DCaffe2_DIR="$SP/torch/share/cmake/Caffe2" \
    -DCUDAToolkit_ROOT="$CU" -DCUDA_TOOLKIT_ROOT_DIR="$CU" -DCMAKE_CUDA_COMPILER="$CU/bin/nvcc" \
    "$@"
fi

# hydra, hydra-agent and every test declared in tests/unit/executor (or $HYDRA_CUDA_TARGETS).
if [ -n "${HYDRA_CUDA_TARGETS:-}" ]; then
  read -r -a TARGETS <<<"$HYDRA_CUDA_TARGETS"
else
  TARGETS=(hydra hydra-agent)
  while read -r t; do TARGETS+=("$t"); done < <(
    sed -n 's/.*hydra_cc_test(NAME \([A-Za-z0-9_-]*\).*/\1/p' tests/unit/executor/CMakeLists.txt)
fi
start=$SECONDS
ninja -C "$BUILD_DIR" -j"${HYDRA_JOBS:-2}" "${TARGETS[@]}"
echo "build-cuda: built ${TARGETS[*]} in $((SECONDS - start)) s" >&2

# What was built must load the wheel's torch only, with torch_cuda linked in (a mix with Debian's
# LibTorch 1.13 aborts at load; without torch_cuda, CUDA reads unavailable).
for t in "${TARGETS[@]}"; do
  bin="$(find "$BUILD_DIR" -type f -executable -name "$t" -not -path '*/CMakeFiles/*' | head -n 1)"
  [ -n "$bin" ] || continue
  needed="$(readelf -d "$bin" | grep NEEDED)"
  grep -q '\[libtorch' <<<"$needed" || continue  # a torch-free test (dataset_test)
  if ! grep -q '\[libtorch_cuda.so\]' <<<"$needed"; then
    echo "build-cuda: $bin does not link libtorch_cuda.so" >&2
    exit 1
  fi
  first="$(grep -o -E '\[lib(stdc\+\+|torch)[^]]*\]' <<<"$needed" | head -n 1)"
  if [ "$first" != "[libstdc++.so.6]" ]; then
    echo "build-cuda: $bin lists $first before libstdc++.so.6: the wheel's libtorch.so would" \
      "take its std::filesystem calls" >&2
    exit 1
  fi
  foreign="$(ldd "$bin" | grep -E '^\s*lib(torch|c10)[^ ]* => ' | grep -v " => $SP/" || true)"
  if [ -n "$foreign" ]; then
    echo "build-cuda: $bin loads a LibTorch other than the wheel's:" >&2
    echo "$foreign" >&2
    exit 1
  fi
done
echo "build-cuda: the programs that use torch link the CUDA LibTorch of $SP/torch only" >&2
