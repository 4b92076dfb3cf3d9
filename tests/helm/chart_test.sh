#!/usr/bin/env bash
# Tests the Helm chart (helm/hydra) with the helm binary of tests/helm/build and the real
# Kubernetes test control plane of tests/envtest:
#   1. helm lint --strict and helm template of the default values and every helm/hydra/ci/*.yaml
#      (with --api-versions monitoring.coreos.com/v1, so ServiceMonitors, PodMonitors and the
#      PrometheusRule render); values the schema must refuse; the monitoring objects left out
#      where the cluster does not serve monitoring.coreos.com/v1; helm package follows the
#      links to crds/ and dashboards/.
#   2. On a fresh kube-apiserver: the CRD applied for real, then the Prometheus Operator's CRDs
#      (from its Go module, pinned below), then every rendered manifest applied with
#      `kubectl apply --server-side --dry-run=server`, and the server's answer checked by
#      check_rendered.py (non-root, read-only root file system, NetworkPolicy, ...).
#
#   tests/helm/chart_test.sh           # registered in CTest as helm_chart_test
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
CHART="$ROOT/helm/hydra"
PROMETHEUS_OPERATOR=v0.85.0   # the monitoring.coreos.com CRDs the monitoring objects must satisfy
NS=hydra-system

log() { echo "helm_chart_test: $*"; }
fail() { echo "helm_chart_test: FAILED: $*" >&2; exit 1; }

HELM="$("$HERE/build")/helm"
WORK="$(mktemp -d /tmp/hydra-helm-test.XXXXXX)"
ENVDIR="$WORK/hydra-envtest"
cleanup() {
  # The control plane is stopped on every exit path.
  if [ -d "$ENVDIR" ]; then "$ROOT/tests/envtest/down" --dir "$ENVDIR" >/dev/null 2>&1 || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
# Helm's own state (repositories, cache) stays in the scratch directory.
export HELM_CACHE_HOME="$WORK/helm/cache" HELM_CONFIG_HOME="$WORK/helm/config" \
  HELM_DATA_HOME="$WORK/helm/data"
helm() { "$HELM" "$@" 2> >(grep -v 'found symbolic link in path' >&2); }

# --- 1. lint and render --------------------------------------------------------------------
VALUES=(default)
for f in "$CHART"/ci/*-values.yaml; do VALUES+=("$f"); done
[ "${#VALUES[@]}" -ge 4 ] || fail "expected at least three values files in $CHART/ci"
RENDERED=()
for v in "${VALUES[@]}"; do
  name="$(basename "$v" .yaml)"
  args=()
  [ "$v" = default ] || args=(-f "$v")
  helm lint --strict "$CHART" ${args[@]+"${args[@]}"} >"$WORK/lint-$name.txt" 2>&1 ||
    { cat "$WORK/lint-$name.txt"; fail "helm lint $name"; }
  helm template hydra "$CHART" -n "$NS" --api-versions monitoring.coreos.com/v1 \
    ${args[@]+"${args[@]}"} >"$WORK/$name.yaml" || fail "helm template $name"
  RENDERED+=("$WORK/$name.yaml")
  log "lint + template $name: $(grep -c '^kind:' "$WORK/$name.yaml") objects"
done

# The values schema refuses unknown keys and bad enums.
for bad in agent.bogus=1 agent.spill.type=nfs controller.workers=0 monitoring.serviceMonitor.agentKind=Probe \
    agent.grpcAdvertise=podDNS clusterDomain=cluster.local tls.serverName=Bad_Name; do
  if helm template hydra "$CHART" --set "$bad" >/dev/null 2>&1; then
    fail "the values schema accepted --set $bad"
  fi
done
if helm template hydra "$CHART" --set tls.enabled=true >/dev/null 2>&1; then
  fail "tls.enabled without a Secret rendered"
fi
log "values schema refuses bad values"

# The Prometheus Operator's objects render only where the cluster serves them.
MON="$CHART/ci/aks-spot-mtls-monitoring-values.yaml"
helm template hydra "$CHART" -n "$NS" -f "$MON" >"$WORK/no-monitoring-api.yaml"
if grep -Eq '^kind: (ServiceMonitor|PodMonitor|PrometheusRule)' "$WORK/no-monitoring-api.yaml"; then
  fail "monitoring objects rendered without monitoring.coreos.com/v1"
fi
for kind in ServiceMonitor PodMonitor PrometheusRule; do
  grep -q "^kind: $kind" "$WORK/aks-spot-mtls-monitoring-values.yaml" || fail "$MON: no $kind"
done
# The dashboards and the alert groups come from the repository's dashboards/.
for d in "$ROOT"/dashboards/*.json; do
  grep -q "  $(basename "$d"): " "$WORK/aks-spot-mtls-monitoring-values.yaml" ||
    fail "dashboard $(basename "$d") not in a ConfigMap"
done
log "monitoring objects gated on monitoring.coreos.com/v1; dashboards and rules embedded"

# The links to crds/ and dashboards/ are followed by package and by --include-crds.
(cd "$WORK" && helm package "$CHART" >/dev/null) || fail "helm package"
PKG="$(ls "$WORK"/hydra-*.tgz)"
tar -xmzf "$PKG" -C "$WORK" hydra/crds/multimodeljob.yaml
cmp -s "$WORK/hydra/crds/multimodeljob.yaml" "$ROOT/crds/multimodeljob.yaml" ||
  fail "the packaged CRD differs from crds/multimodeljob.yaml"
helm template hydra "$PKG" -n "$NS" --include-crds >"$WORK/with-crds.yaml"
grep -q '^  name: multimodeljobs.hydra.dev$' "$WORK/with-crds.yaml" || fail "--include-crds: no CRD"
log "helm package and --include-crds carry crds/multimodeljob.yaml ($(basename "$PKG"))"

# --- 2. the real API server --------------------------------------------------------------
if ! command -v go >/dev/null; then
  for g in /usr/local/go/bin/go /usr/lib/go/bin/go; do [ -x "$g" ] && PATH="$(dirname "$g"):$PATH"; done
fi
# Outside any module, so that nothing is added to a go.mod.
PO_DIR="$(cd "$WORK" && GOFLAGS=-mod=mod go mod download -json \
  "github.com/prometheus-operator/prometheus-operator@$PROMETHEUS_OPERATOR" |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])')"
PO_CRDS=()
for r in servicemonitors podmonitors prometheusrules; do
  f="$PO_DIR/example/prometheus-operator-crd/monitoring.coreos.com_$r.yaml"
  [ -f "$f" ] || fail "no $f in prometheus-operator $PROMETHEUS_OPERATOR"
  PO_CRDS+=(-f "$f")
done

eval "$("$ROOT/tests/envtest/up" --dir "$ENVDIR")"
kubectl apply --server-side -f "$ROOT/crds/multimodeljob.yaml" >/dev/null
kubectl apply --server-side "${PO_CRDS[@]}" >/dev/null
kubectl wait --for=condition=Established --timeout=60s crd/multimodeljobs.hydra.dev \
  crd/servicemonitors.monitoring.coreos.com crd/podmonitors.monitoring.coreos.com \
  crd/prometheusrules.monitoring.coreos.com >/dev/null
for ns in "$NS" monitoring ml-team-a ml-team-b; do kubectl create namespace "$ns" >/dev/null; done
log "control plane up; CRDs established (MultiModelJob, prometheus-operator $PROMETHEUS_OPERATOR)"

for r in "${RENDERED[@]}"; do
  name="$(basename "$r" .yaml)"
  expect=(Deployment DaemonSet Service ServiceAccount ClusterRole NetworkPolicy)
  case "$name" in
    aks-*) expect+=(PodMonitor ServiceMonitor PrometheusRule ConfigMap) ;;
    eks-karpenter-*) expect+=(ServiceMonitor) ;;
  esac
  kubectl apply --server-side --dry-run=server -f "$r" -o json >"$WORK/$name.json" ||
    fail "the API server refused $name"
  python3 "$HERE/check_rendered.py" "$WORK/$name.json" --expect "${expect[@]}"
done
log "PASSED"
