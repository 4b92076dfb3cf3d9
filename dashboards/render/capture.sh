#!/usr/bin/env bash
# Regenerates docs/images/hydra-job-dashboard.png from real data: dashboards_test, with
# HYDRA_RENDER_DASHBOARD set, starts the test control plane, Prometheus (scraping every second),
# two hydra-agents and hydra-controller, trains a 4-trial GPT-2 job (node-b is killed half way,
# so its trials restart on node-a), and draws dashboards/hydra-job.json from the scraped series
# with dashboards/render (gnuplot). Takes several minutes on 2 cores.
#
#   bash dashboards/render/capture.sh [OUT.png]     # build dir: $BUILD_DIR or ./build
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="${BUILD_DIR:-$root/build}"
out="$(realpath -m "${1:-$root/docs/images/hydra-job-dashboard.png}")"
mkdir -p "$(dirname "$out")"
cmake --build "$build" --target dashboards_test
HYDRA_RENDER_DASHBOARD="$out" "$build/tests/integration/dashboards_test"
echo "wrote $out"
