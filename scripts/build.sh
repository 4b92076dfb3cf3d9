#!/usr/bin/env bash
# Configures and builds Hydra with Ninja and ccache into build/ (or $HYDRA_BUILD_DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${HYDRA_BUILD_DIR:-build}"
# ccache and precompiled headers: these settings let ccache cache PCH users.
export CCACHE_SLOPPINESS="${CCACHE_SLOPPINESS:-pch_defines,time_macros,include_file_mtime,include_file_ctime}"
export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/ccache}"
# A clone at another path (CI's) reuses the cache: paths under the checkout are hashed relative
# to it and the working directory is not hashed (debug info names the first clone's directory).
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}"
export CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-true}"
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@"
fi
ninja -C "$BUILD_DIR" -j"${HYDRA_JOBS:-2}"
