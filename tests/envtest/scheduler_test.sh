#!/usr/bin/env bash
# The test control plane's real kube-scheduler (tests/envtest/up --with-scheduler), the part of
# issue 20's test cluster that decides where agent pods go: a pod whose GPUs a node has is bound
# to it; one asking for more GPUs than any node has stays Pending with PodScheduled=False,
# Unschedulable (what a cluster autoscaler scales up from) until a node that fits is added.
# Nodes are API objects only here (no kubelet runs); the not-ready taint the API server puts on a
# new node is removed as a node lifecycle controller would.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
eval "$("$HERE/up" --with-scheduler)"
trap '"$HERE/down" >/dev/null 2>&1 || true' EXIT
fail() { echo "FAIL: $*"; kubectl get pods -o wide || true; exit 1; }

node() {  # node NAME GPUS
  kubectl apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Node
metadata: {name: $1, labels: {kubernetes.io/hostname: $1}}
status:
  capacity: {cpu: "16", memory: 64Gi, pods: "110", nvidia.com/gpu: "$2"}
  allocatable: {cpu: "16", memory: 64Gi, pods: "110", nvidia.com/gpu: "$2"}
YAML
  kubectl taint node "$1" node.kubernetes.io/not-ready:NoSchedule- >/dev/null 2>&1 || true
}
pod() {  # pod NAME GPUS
  kubectl apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: $1}
spec:
  containers: [{name: agent, image: hydra, resources: {limits: {nvidia.com/gpu: "$2"}}}]
YAML
}
wait_for() {  # wait_for DESCRIPTION COMMAND...: until the command prints something non-empty
  local what="$1"; shift
  for _ in $(seq 1 100); do
    [ -n "$("$@" 2>/dev/null)" ] && return 0
    sleep 0.2
  done
  fail "$what"
}

node gpu-node-1 2
pod fits 2
pod too-big 4
wait_for "pod fits was not bound to gpu-node-1" \
  kubectl get pod fits -o jsonpath='{.spec.nodeName}'
[ "$(kubectl get pod fits -o jsonpath='{.spec.nodeName}')" = gpu-node-1 ] || fail "fits bound elsewhere"
wait_for "pod too-big was not reported Unschedulable" \
  kubectl get pod too-big -o jsonpath='{.status.conditions[?(@.reason=="Unschedulable")].type}'
[ -z "$(kubectl get pod too-big -o jsonpath='{.spec.nodeName}')" ] || fail "too-big was bound"
# The stand-in for an autoscaler: a node that fits is added, and the pending pod goes there.
node gpu-node-2 8
wait_for "pod too-big was not bound once gpu-node-2 was added" \
  kubectl get pod too-big -o jsonpath='{.spec.nodeName}'
[ "$(kubectl get pod too-big -o jsonpath='{.spec.nodeName}')" = gpu-node-2 ] || fail "too-big bound elsewhere"
echo "PASS: bound by GPUs, Unschedulable while no node fits, bound once one is added"
