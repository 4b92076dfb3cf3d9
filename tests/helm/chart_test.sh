#!/usr/bin/env bash
# Tests the Helm chart (helm/hydra) with the helm binary of tests/helm/build and the real
# Kubernetes test control plane of tests/envtest:
#   1. helm lint --strict and helm template of the default values and every helm/hydra/ci/*.yaml
#      (with --api-versions monitoring.coreos.com/v1, so ServiceMonitors, PodMonitors and the
#      PrometheusRule render), and of each TLS source (generate, the default; certManager with
#      --api-versions cert-manager.io/v1; existingSecret; TLS off) and scrape-job value; values
#      the schema or the templates must refuse, with their messages; the monitoring objects left
#      out where the cluster does not serve monitoring.coreos.com/v1; helm package follows the
#      links to crds/ and dashboards/.
#   2. On a fresh kube-apiserver: the CRD applied for real, then the Prometheus Operator's and
#      cert-manager's CRDs (from their Go modules, pinned below), then every rendered manifest
#      applied with `kubectl apply --server-side --dry-run=server`, and the server's answer
#      checked by check_rendered.py (non-root, read-only root file system, NetworkPolicy, the
#      TLS flags and Secrets of each source, decoded and checked with openssl, the scrape job).
#   3. helm install and upgrades on that kube-apiserver: the generated certificates survive an
#      upgrade (lookup), and are re-issued when their name changes, when they near expiry
#      (tls.generate.renewDays) or when the CA Secret is deleted; NOTES.txt's TLS lines.
#
#   tests/helm/chart_test.sh           # registered in CTest as helm_chart_test
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
CHART="$ROOT/helm/hydra"
PROMETHEUS_OPERATOR=v0.85.0   # the monitoring.coreos.com CRDs the monitoring objects must satisfy
CERT_MANAGER=v1.18.2          # the cert-manager.io CRDs of tls.source=certManager
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
  # check_rendered.py's arguments for this render (one a line).
  case "$name" in
    default) printf '%s\n' --expect Secret --tls generate ;;
    aks-*) printf '%s\n' --expect PodMonitor ServiceMonitor PrometheusRule ConfigMap \
      --tls existingSecret --secrets hydra-agent-tls hydra-controller-tls --job-agents plaintext ;;
    eks-karpenter-*) printf '%s\n' --expect ServiceMonitor --tls generate ;;
    *) printf '%s\n' --tls generate ;;
  esac >"$WORK/$name.check"
  log "lint + template $name: $(grep -c '^kind:' "$WORK/$name.yaml") objects"
done

# Each TLS source and the scrape job's value: render NAME [helm args] -- [check_rendered args].
# (helm lint has no --api-versions: lint only the renders that need no capability; lint turns a
# template's `fail` into an [INFO] line, so the refusals are tested with helm template below.)
render() {
  local name="$1" hargs=() cargs=()
  shift
  while [ $# -gt 0 ] && [ "$1" != -- ]; do hargs+=("$1"); shift; done
  [ $# -eq 0 ] || shift
  cargs=("$@")
  case " ${hargs[*]} " in
    *--api-versions*) ;;
    *) helm lint --strict "$CHART" "${hargs[@]}" >"$WORK/lint-$name.txt" 2>&1 ||
         { cat "$WORK/lint-$name.txt"; fail "helm lint $name"; } ;;
  esac
  helm template hydra "$CHART" -n "$NS" --api-versions monitoring.coreos.com/v1 "${hargs[@]}" \
    >"$WORK/$name.yaml" || fail "helm template $name"
  RENDERED+=("$WORK/$name.yaml")
  printf '%s\n' "${cargs[@]}" >"$WORK/$name.check"
  log "template $name: $(grep -c '^kind:' "$WORK/$name.yaml") objects"
}
render tls-off --set tls.enabled=false -- --tls off --job-agents plaintext
render tls-existing --set tls.source=existingSecret --set tls.agentSecret=agent-certs \
  --set tls.controllerSecret=controller-certs -- \
  --tls existingSecret --secrets agent-certs controller-certs --job-agents plaintext
render tls-existing-one --set tls.source=existingSecret --set tls.existingSecret=hydra-certs \
  --set tls.keys.cert=cert.pem --set tls.keys.key=key.pem --set tls.keys.ca=ca.pem -- \
  --tls existingSecret --secrets hydra-certs hydra-certs --job-agents plaintext
# Job-owned agent pods: a CA of the user's with another TLS source; none at all, and no shared
# pool (no Prometheus).
render job-agents-own-ca --set tls.source=existingSecret --set tls.existingSecret=hydra-certs \
  --set jobAgents.caSecret=corp-agents-ca -- \
  --tls existingSecret --secrets hydra-certs hydra-certs --job-agents corp-agents-ca
render job-agents-off --set jobAgents.enabled=false --set controller.prometheusUrl= -- \
  --tls generate --job-agents off --no-shared-pool
# A client identity of "*" (any certificate the CA signed): the generated one still names
# hydra-controller.
render tls-generate-any-client --set 'tls.clientIdentity=*' --set tls.serverName=agents.example.org \
  --set monitoring.serviceMonitor.enabled=true -- \
  --expect Secret ServiceMonitor --tls generate --client-identity '*' --server-name agents.example.org
# cert-manager: the release's own bootstrapped CA, and an issuer of the user's.
render tls-cert-manager --api-versions cert-manager.io/v1 --set tls.source=certManager -- \
  --expect Certificate Issuer --tls certManager --secrets hydra-agent-tls hydra-controller-tls
render tls-cert-manager-issuer --api-versions cert-manager.io/v1 --set tls.source=certManager \
  --set tls.certManager.issuerRef.name=corp-ca --set tls.certManager.issuerRef.kind=ClusterIssuer \
  --set tls.clientIdentity=controller.hydra.example --set monitoring.serviceMonitor.enabled=true \
  --set monitoring.serviceMonitor.agentKind=PodMonitor --set monitoring.agentScrapeJob=hydra-agent-team-b -- \
  --expect Certificate PodMonitor --tls certManager --client-identity controller.hydra.example \
  --scrape-job hydra-agent-team-b --job-agents plaintext
render scrape-job-own-prometheus --set monitoring.agentScrapeJob=kubernetes-pods -- \
  --tls generate --scrape-job kubernetes-pods
grep -q '^kind: Issuer' "$WORK/tls-cert-manager-issuer.yaml" && fail "an Issuer rendered beside issuerRef.name"

# The values schema refuses unknown keys and bad enums.
for bad in agent.bogus=1 agent.spill.type=nfs agent.optimizer=gpu controller.workers=0 monitoring.serviceMonitor.agentKind=Probe \
    agent.grpcAdvertise=podDNS clusterDomain=cluster.local tls.serverName=Bad_Name; do
  if helm template hydra "$CHART" --set "$bad" >/dev/null 2>&1; then
    fail "the values schema accepted --set $bad"
  fi
done
for bad in tls.source=vault tls.generate.certDays=0 tls.generate.renewDays=-1 \
    tls.certManager.duration=1y 'monitoring.agentScrapeJob=bad job' monitoring.agentScrapeJob= \
    tls.clientIdentity= 'tls.clientIdentity=a b'; do
  if helm template hydra "$CHART" --set "$bad" >/dev/null 2>&1; then
    fail "the values schema accepted --set $bad"
  fi
done
# Values the templates refuse, with a message that says why: refuse MESSAGE [helm args].
refuse() {
  local want="$1"
  shift
  if helm template hydra "$CHART" "$@" >/dev/null 2>"$WORK/refused.txt"; then
    fail "rendered: $*"
  fi
  grep -qF -- "$want" "$WORK/refused.txt" || { cat "$WORK/refused.txt"; fail "$*: no message '$want'"; }
}
refuse "this cluster does not serve cert-manager.io/v1" --set tls.source=certManager
refuse "tls.source=existingSecret needs tls.existingSecret" --set tls.source=existingSecret
refuse "tls.source=existingSecret needs tls.existingSecret" --set tls.source=existingSecret \
  --set tls.agentSecret=agent-certs
refuse "used only with tls.source=existingSecret" --set tls.agentSecret=agent-certs
refuse "used only with tls.source=existingSecret" --api-versions cert-manager.io/v1 \
  --set tls.source=certManager --set tls.existingSecret=hydra-certs
refuse "must be a lower-case DNS name" --set tls.clientIdentity=Controller_1
log "values schema and templates refuse bad values"
helm template hydra "$CHART" --set agent.optimizer=host >"$WORK/optimizer-host.yaml" ||
  fail "helm template --set agent.optimizer=host"
grep -q -- '- --optimizer=host$' "$WORK/optimizer-host.yaml" ||
  fail "agent.optimizer=host: the agent's args have no --optimizer=host"

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
# module_dir MODULE@VERSION: where the Go module cache holds that module's source.
module_dir() {
  (cd "$WORK" && GOFLAGS=-mod=mod go mod download -json "$1" |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])')
}
PO_DIR="$(module_dir "github.com/prometheus-operator/prometheus-operator@$PROMETHEUS_OPERATOR")"
PO_CRDS=()
for r in servicemonitors podmonitors prometheusrules; do
  f="$PO_DIR/example/prometheus-operator-crd/monitoring.coreos.com_$r.yaml"
  [ -f "$f" ] || fail "no $f in prometheus-operator $PROMETHEUS_OPERATOR"
  PO_CRDS+=(-f "$f")
done

# cert-manager's CRDs are in its module's deploy/crds, as templates of its Helm chart whose
# only template parts are comment lines and label lines: those lines are dropped (leaving
# `labels:` empty).
CM_DIR="$(module_dir "github.com/cert-manager/cert-manager@$CERT_MANAGER")"
CM_CRDS=()
for r in certificates issuers clusterissuers; do
  f="$CM_DIR/deploy/crds/crd-$r.yaml"
  [ -f "$f" ] || fail "no $f in cert-manager $CERT_MANAGER"
  grep -v '{{' "$f" >"$WORK/cert-manager-$r.yaml"
  CM_CRDS+=(-f "$WORK/cert-manager-$r.yaml")
done

eval "$("$ROOT/tests/envtest/up" --dir "$ENVDIR")"
kubectl apply --server-side -f "$ROOT/crds/multimodeljob.yaml" >/dev/null
kubectl apply --server-side "${PO_CRDS[@]}" >/dev/null
kubectl apply --server-side "${CM_CRDS[@]}" >/dev/null
kubectl wait --for=condition=Established --timeout=60s crd/multimodeljobs.hydra.dev \
  crd/servicemonitors.monitoring.coreos.com crd/podmonitors.monitoring.coreos.com \
  crd/prometheusrules.monitoring.coreos.com crd/certificates.cert-manager.io \
  crd/issuers.cert-manager.io crd/clusterissuers.cert-manager.io >/dev/null
for ns in "$NS" monitoring ml-team-a ml-team-b; do kubectl create namespace "$ns" >/dev/null; done
log "control plane up; CRDs established (MultiModelJob, prometheus-operator $PROMETHEUS_OPERATOR, cert-manager $CERT_MANAGER)"

for r in "${RENDERED[@]}"; do
  name="$(basename "$r" .yaml)"
  mapfile -t check <"$WORK/$name.check"
  kubectl apply --server-side --dry-run=server -f "$r" -o json >"$WORK/$name.json" ||
    fail "the API server refused $name"
  # The kinds every render has; the .check file's own --expect adds more.
  python3 "$HERE/check_rendered.py" "$WORK/$name.json" "${check[@]}" \
    --expect Deployment DaemonSet Service ServiceAccount ClusterRole NetworkPolicy
done

# --- 3. generated certificates across helm install and upgrades ----------------------------
# Only a real install can look up: the Secrets of one upgrade are the next one's input.
UNS=hydra-upgrade
kubectl create namespace "$UNS" >/dev/null
pem() { kubectl -n "$UNS" get secret "$1" -o jsonpath='{.data.tls\.crt}'; }
pod_sum() {
  kubectl -n "$UNS" get "$1" -o jsonpath='{.spec.template.metadata.annotations.hydra\.dev/tls-checksum}'
}
state() {  # the CA, the two certificates and the pods' checksums, one a line
  pem hydra-ca; echo; pem hydra-agent-tls; echo; pem hydra-controller-tls; echo
  pod_sum daemonset/hydra-agent; echo; pod_sum deployment/hydra-controller; echo
}
# check_release NAME [check_rendered args]: what the release holds now passes check_rendered.py.
check_release() {
  local name="$1"
  shift
  # The label leaves out Helm's own release Secrets.
  kubectl -n "$UNS" get secrets,daemonsets,deployments,services,networkpolicies \
    -l app.kubernetes.io/instance=hydra -o json >"$WORK/release-$name.json"
  python3 "$HERE/check_rendered.py" "$WORK/release-$name.json" --tls generate \
    --secrets hydra-agent-tls hydra-controller-tls "$@" >"$WORK/release-$name.txt" ||
    { cat "$WORK/release-$name.txt"; fail "the release after $name"; }
}
# same|new CA AGENT CONTROLLER: which lines of the state changed since $before.
compare() {
  local step="$1" i=0 what
  mapfile -t after < <(state)
  shift
  for what in "$@"; do
    case "$what" in
      same) [ "${before[$i]}" = "${after[$i]}" ] || fail "$step: line $i of the state changed" ;;
      new) [ "${before[$i]}" != "${after[$i]}" ] || fail "$step: line $i of the state is unchanged" ;;
    esac
    [ -n "${after[$i]}" ] || fail "$step: line $i of the state is empty"
    i=$((i + 1))
  done
  before=("${after[@]}")
}
helm install hydra "$CHART" -n "$UNS" >"$WORK/install.txt" || fail "helm install"
grep -q 'gRPC: *mutual TLS, certificates generated by the chart' "$WORK/install.txt" ||
  { cat "$WORK/install.txt"; fail "NOTES.txt: no generated-TLS line"; }
check_release install --server-name hydra-agent.hydra-upgrade.svc
mapfile -t before < <(state)
#        CA   agent controller agent-pods controller-pods
helm upgrade hydra "$CHART" -n "$UNS" >/dev/null || fail "helm upgrade"
compare "an upgrade" same same same same same
check_release upgrade --server-name hydra-agent.hydra-upgrade.svc
helm upgrade hydra "$CHART" -n "$UNS" --set tls.serverName=agents.hydra.example >/dev/null ||
  fail "helm upgrade (serverName)"
compare "a new tls.serverName" same new same new same
check_release server-name --server-name agents.hydra.example
helm upgrade hydra "$CHART" -n "$UNS" --set tls.serverName=agents.hydra.example \
  --set tls.generate.renewDays=1000 >/dev/null || fail "helm upgrade (renewDays)"
compare "certificates with fewer than renewDays left" same new new new new
check_release renew --server-name agents.hydra.example
kubectl -n "$UNS" delete secret hydra-ca >/dev/null
helm upgrade hydra "$CHART" -n "$UNS" --set tls.serverName=agents.hydra.example >/dev/null ||
  fail "helm upgrade (CA deleted)"
compare "a deleted CA Secret" new new new new new
check_release new-ca --server-name agents.hydra.example
# --reuse-values: the previous release's values (tls.serverName) hold nothing generated.
helm upgrade hydra "$CHART" -n "$UNS" --reuse-values >/dev/null || fail "helm upgrade --reuse-values"
compare "an upgrade with --reuse-values" same same same same same
check_release reuse-values --server-name agents.hydra.example
log "generated certificates: kept by upgrades; re-issued for a new name, near expiry, a new CA"

# NOTES.txt warns when TLS is off.
helm upgrade hydra "$CHART" -n "$UNS" --dry-run=server --set tls.enabled=false >"$WORK/notes-off.txt" ||
  fail "helm upgrade --dry-run=server (TLS off)"
grep -q 'WARNING: tls.enabled=false. The agents serve gRPC in PLAINTEXT' "$WORK/notes-off.txt" ||
  { sed -n '/^NOTES:/,$p' "$WORK/notes-off.txt"; fail "NOTES.txt: no warning with tls.enabled=false"; }
log "NOTES.txt: TLS lines and the warning without TLS"
log "PASSED"
