#!/usr/bin/env bash
# Downloads, on a machine with Debian's package archive (the development machine), the Debian
# packages scripts/gpu-check.sh needs on a GPU machine that has no Debian development packages
# and no network: the headers, CMake configs and libraries of the torch-only build
# (-DHYDRA_WITH_SERVICES=OFF). They go to build-gpu-debs/ (ignored by git; pass it as `carry`
# to the device tool), about 3 MB:
#   scripts/gpu-debs.sh [dir]
set -euo pipefail
cd "$(dirname "$0")/.."
DIR="${1:-build-gpu-debs}"
PACKAGES=(
  libyaml-cpp-dev libyaml-cpp0.7 nlohmann-json3-dev libcli11-dev libgtest-dev libgmock-dev
  zlib1g-dev zlib1g libxxhash-dev libxxhash0
)
mkdir -p "$DIR"
(cd "$DIR" && rm -f ./*.deb && apt-get download -q "${PACKAGES[@]}" >/dev/null)
echo "gpu-debs: $(ls "$DIR"/*.deb | wc -l) packages in $DIR ($(du -sh "$DIR" | cut -f1))"
