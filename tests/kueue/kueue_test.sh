#!/usr/bin/env bash
# Real Kueue (tests/kueue/up) on the test control plane with the real kube-scheduler: plain Pods
# labelled kueue.x-k8s.io/queue-name, as Hydra's agent pods are when a LocalQueue is named, are
# held by Kueue's scheduling gate until their ClusterQueue has GPU quota for them, then bound.
#   * both pods are created gated (kueue.x-k8s.io/admission), with Kueue's finalizer and label;
#     pods outside the managed namespaces or without a queue label are not touched;
#   * with 1 GPU of quota exactly one is admitted, ungated and bound; the other stays gated,
#     its Workload Pending for quota; raising the quota to 2 admits, ungates and binds it;
#   * a pod that finishes (what a kubelet writes: status.phase Succeeded/Failed) finishes its
#     Workload and releases the quota, and Kueue drops its finalizer;
#   * `kubectl delete` of an admitted pod: Kueue drops its finalizer at once, but the pod stays
#     Terminating (bound; no kubelet) and its Workload stays Admitted, holding the quota; once the
#     pod object is gone its Workload is left behind (a cluster's garbage collector deletes it by
#     its ownerReference; there is none here, so the test does) and only then is quota released;
#   * with the quota at 0 a new pod stays gated; deleting a gated (unbound) pod removes it at once
#     (Kueue drops its finalizer), again leaving its pending Workload behind.
# Nodes are API objects only (no kubelet), as in tests/envtest/scheduler_test.sh.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
"$HERE/build" >/dev/null
eval "$("$ROOT/tests/envtest/up" --with-scheduler)"
trap '"$ROOT/tests/envtest/down" >/dev/null 2>&1 || true' EXIT
"$HERE/up"
"$HERE/up"   # a second run finds Kueue up and answering, and does nothing

fail() {
  echo "FAIL: $*"
  kubectl get pods -A -o wide || true
  kubectl get workloads -A -o wide || true
  echo "--- kueue.log (tail)"; tail -15 "$HYDRA_ENVTEST_DIR/kueue.log" || true
  exit 1
}
wait_for() {  # wait_for DESCRIPTION COMMAND...: until the command prints something non-empty (20 s)
  local what="$1" end=$((SECONDS + 20)); shift
  while [ $SECONDS -lt $end ]; do
    [ -n "$("$@" 2>/dev/null)" ] && return 0
    sleep 0.2
  done
  fail "$what"
}
get() { kubectl get "$@" 2>/dev/null; }   # get pod NAME -o jsonpath=...
is() { [ "$("${@:2}")" = "$1" ] && echo yes; }   # is VALUE COMMAND...: prints yes if it prints VALUE
gates() { get pod "$1" -o jsonpath='{.spec.schedulingGates[*].name}'; }
node_of() { get pod "$1" -o jsonpath='{.spec.nodeName}'; }
gated() { [[ " $(gates "$1") " == *" kueue.x-k8s.io/admission "* ]] && echo yes; }
bound() { [ -z "$(gates "$1")" ] && node_of "$1"; }
either_bound() { bound first; bound second; }
gone() { get pod "$1" -o name >/dev/null || echo yes; }
workload_of() { get workloads -l "kueue.x-k8s.io/job-uid=$(get pod "$1" -o jsonpath='{.metadata.uid}')" -o name; }
cond() {  # cond WORKLOAD TYPE: "status reason"
  get "$1" -o jsonpath="{.status.conditions[?(@.type==\"$2\")].status} {.status.conditions[?(@.type==\"$2\")].reason}"
}
pending_for_quota() {  # the Workload of pod $1 was tried and is Pending for want of GPU quota
  local wl; wl="$(workload_of "$1")"
  [ -n "$wl" ] && [ "$(cond "$wl" QuotaReserved)" = "False Pending" ] &&
    get "$wl" -o jsonpath='{.status.conditions[?(@.type=="QuotaReserved")].message}' | grep -oE 'insufficient (unused )?quota for nvidia.com/gpu'
}
gpu_quota() {
  kubectl patch clusterqueue gpus --type json >/dev/null \
    -p "[{\"op\":\"replace\",\"path\":\"/spec/resourceGroups/0/flavors/0/resources/2/nominalQuota\",\"value\":\"$1\"}]"
}
gpus_in_use() { get clusterqueue gpus -o jsonpath='{.status.flavorsUsage[0].resources[?(@.name=="nvidia.com/gpu")].total}'; }
pod_yaml() {  # pod_yaml NAME [NAMESPACE [LABELS]]
  cat <<YAML
apiVersion: v1
kind: Pod
metadata: {name: $1, namespace: ${2:-default}, labels: {${3-kueue.x-k8s.io/queue-name: gpus}}}
spec:
  containers: [{name: agent, image: hydra, resources: {limits: {nvidia.com/gpu: "1"}}}]
YAML
}

kubectl apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Node
metadata: {name: gpu-node-1, labels: {kubernetes.io/hostname: gpu-node-1}}
status:
  capacity: {cpu: "16", memory: 64Gi, pods: "110", nvidia.com/gpu: "4"}
  allocatable: {cpu: "16", memory: 64Gi, pods: "110", nvidia.com/gpu: "4"}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: ResourceFlavor
metadata: {name: default-flavor}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: ClusterQueue
metadata: {name: gpus}
spec:
  namespaceSelector: {}
  resourceGroups:
  - coveredResources: [cpu, memory, nvidia.com/gpu]
    flavors:
    - name: default-flavor
      resources:
      - {name: cpu, nominalQuota: "64"}
      - {name: memory, nominalQuota: 256Gi}
      - {name: nvidia.com/gpu, nominalQuota: "1"}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: LocalQueue
metadata: {name: gpus, namespace: default}
spec: {clusterQueue: gpus}
YAML
kubectl taint node gpu-node-1 node.kubernetes.io/not-ready:NoSchedule- >/dev/null 2>&1 || true
wait_for "ClusterQueue gpus did not become Active" \
  get clusterqueue gpus -o jsonpath='{.status.conditions[?(@.type=="Active")].status}'

# Not managed: a pod in kube-system (managedJobsNamespaceSelector) and one with no queue label.
[ -z "$(pod_yaml sys kube-system | kubectl create --dry-run=server -f - -o jsonpath='{.spec.schedulingGates}')" ] ||
  fail "a pod in kube-system was gated"
[ -z "$(pod_yaml plain default "" | kubectl create --dry-run=server -f - -o jsonpath='{.spec.schedulingGates}')" ] ||
  fail "a pod without a queue label was gated"

# Two pods of 1 GPU each against a quota of 1 GPU: both created gated by the pod webhook.
for p in first second; do
  created="$(pod_yaml "$p" | kubectl create -f - \
    -o jsonpath='{.spec.schedulingGates[*].name}|{.metadata.finalizers}|{.metadata.labels.kueue\.x-k8s\.io/managed}')"
  [[ "$created" == *kueue.x-k8s.io/admission*"|"*kueue.x-k8s.io/managed*"|true" ]] ||
    fail "pod $p was not created gated with Kueue's finalizer and label: $created"
done
start=$SECONDS
wait_for "neither pod was admitted and bound" either_bound
if [ -n "$(bound first)" ]; then ADMITTED=first WAITING=second; else ADMITTED=second WAITING=first; fi
[ "$(node_of "$ADMITTED")" = gpu-node-1 ] || fail "pod $ADMITTED bound to '$(node_of "$ADMITTED")'"
[ -n "$(get pod "$ADMITTED" -o jsonpath='{.metadata.annotations.kueue\.x-k8s\.io/workload}')" ] ||
  fail "admitted pod $ADMITTED has no kueue.x-k8s.io/workload annotation"
wait_for "the Workload of pod $WAITING was not Pending for GPU quota" pending_for_quota "$WAITING"
[ -n "$(gated "$WAITING")" ] && [ -z "$(node_of "$WAITING")" ] || fail "pod $WAITING is not held gated"
echo "ok: $ADMITTED admitted and bound in $((SECONDS - start)) s; $WAITING gated, Pending for quota"

gpu_quota 2
start=$SECONDS
wait_for "pod $WAITING was not admitted and bound once the quota was 2" bound "$WAITING"
[ "$(gpus_in_use)" = 2 ] || fail "ClusterQueue uses $(gpus_in_use) GPUs, not 2"
echo "ok: quota raised to 2: $WAITING ungated and bound in $((SECONDS - start)) s"

# A pod that finishes: the kubelet's status update releases its quota and Kueue's finalizer.
kubectl patch pod "$ADMITTED" --subresource=status --type merge -p '{"status":{"phase":"Succeeded"}}' >/dev/null
wl="$(workload_of "$ADMITTED")"
wait_for "the Workload of finished pod $ADMITTED did not finish" is "True Succeeded" cond "$wl" Finished
wait_for "quota of finished pod $ADMITTED was not released" is 1 gpus_in_use
wait_for "Kueue kept its finalizer on finished pod $ADMITTED" \
  is "" get pod "$ADMITTED" -o jsonpath='{.metadata.finalizers}'
kubectl delete pod "$ADMITTED" --grace-period=0 --force >/dev/null 2>&1
echo "ok: a finished pod's Workload finished, quota released, finalizer dropped"

# `kubectl delete` of the admitted, running pod.
wl="$(workload_of "$WAITING")"
uid="$(get pod "$WAITING" -o jsonpath='{.metadata.uid}')"
kubectl delete pod "$WAITING" --wait=false >/dev/null
wait_for "Kueue kept its finalizer on deleted pod $WAITING" \
  is "" get pod "$WAITING" -o jsonpath='{.metadata.finalizers}'
sleep 1
[ -n "$(get pod "$WAITING" -o jsonpath='{.metadata.deletionTimestamp}')" ] ||
  fail "deleted bound pod $WAITING went away without a kubelet"
[ "$(cond "$wl" Admitted)" = "True Admitted" ] && [ "$(gpus_in_use)" = 1 ] ||
  fail "the Workload of terminating pod $WAITING released its quota: $(cond "$wl" Admitted), $(gpus_in_use) GPUs"
# What the kubelet does once the containers are gone: delete with grace period 0.
kubectl delete pod "$WAITING" --grace-period=0 --force >/dev/null 2>&1
wait_for "pod $WAITING is still there after a forced delete" gone "$WAITING"
sleep 1
[ "$(cond "$wl" Admitted)" = "True Admitted" ] && [ "$(gpus_in_use)" = 1 ] ||
  fail "expected the Workload of deleted pod $WAITING to be left Admitted (no garbage collector)"
# The garbage collector's part: the Workload is owned by the pod (uid in kueue.x-k8s.io/job-uid).
kubectl delete workloads -l "kueue.x-k8s.io/job-uid=$uid" >/dev/null
wait_for "quota of deleted pod $WAITING was not released with its Workload" is 0 gpus_in_use
echo "ok: deleted admitted pod: finalizer dropped at once, quota held until its Workload is deleted"

# Quota 0: a new pod stays gated; deleting it (unbound) removes it at once.
gpu_quota 0
pod_yaml third | kubectl create -f - >/dev/null
wait_for "the Workload of pod third was not Pending for GPU quota" pending_for_quota third
sleep 2
[ -n "$(gated third)" ] && [ -z "$(node_of third)" ] || fail "pod third was admitted with a quota of 0"
uid="$(get pod third -o jsonpath='{.metadata.uid}')"
kubectl delete pod third --timeout=10s >/dev/null || fail "gated pod third was not deleted"
# Its pending Workload is left behind too (it would be admitted, for no pod, once quota frees up).
[ -n "$(get workloads -l "kueue.x-k8s.io/job-uid=$uid" -o name)" ] ||
  fail "the Workload of deleted pod third went away without a garbage collector"
kubectl delete workloads -l "kueue.x-k8s.io/job-uid=$uid" >/dev/null
echo "ok: quota 0: pod third held gated; deleted at once, its Workload left behind"
echo "PASS: Kueue $(awk '$1 == "sigs.k8s.io/kueue" { print $2 }' "$HERE/go.mod") gates pods, admits them by GPU quota and releases it"
