#!/usr/bin/env bash
# Installs the Debian packages Hydra needs, only those that are missing. Idempotent.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config clang-format
  clang libclang-rt-dev
  libtorch-dev libopenblas0-pthread
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libcpprest-dev prometheus-cpp-dev
  libgtest-dev libgmock-dev libyaml-cpp-dev nlohmann-json3-dev libcli11-dev zlib1g-dev
  libxxhash-dev
  gnuplot-nox openssl curl iproute2 prometheus
  python3 python3-torch python3-venv
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup: all packages present"
fi
