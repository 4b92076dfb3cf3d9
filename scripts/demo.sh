#!/usr/bin/env bash
# README command 1: set up, build, and train the example model-selection job.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
exec ./build/cli/hydra run examples/gpt2-sweep.yaml "$@"
