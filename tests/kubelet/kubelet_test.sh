#!/usr/bin/env bash
# The test kubelet (tests/kubelet) on the test control plane with the real kube-scheduler: pods
# bound to its nodes run as local processes, each in its own network namespace.
#   (a) two pods serving `python3 -m http.server 8000` (command, args with $(POD_NAME) from the
#       downward API, httpGet readiness on port 8000 and on a named port) become Running and
#       Ready, each with its own pod IP, and both answer curl from the host on port 8000;
#   (b) a pod asking for 2 GPUs is Unschedulable on node-1 (1 GPU), the autoscaler adds auto-1
#       with 2 GPUs and the pod runs there;
#   (c) `kubectl delete pod`: the process gets SIGTERM (its trap writes a marker file) and the
#       pod object goes away;
#   (d) `kubectl delete node auto-1` (a spot reclaim): the pod's process is killed, the pod
#       ends Failed with DisruptionTarget/DeletionByPodGC and is deleted (a finalizer holds it
#       for inspection; removing it lets it go);
#   (e) a command without --binary mapping: pod Failed, reason UnknownCommand;
#   (f) a Secret volume: the pod reads the Secret's key at the mount path, read-only, and the
#       host's directory there stays empty (a mount namespace of the container's own);
#   also: restartPolicy Always restarts an exiting container (restartCount, lastState), a
#   Never pod exiting 0 is Succeeded, and no netns of the kubelet is left after its pods are
#   deleted and after it stops (SIGTERM: exit 0).
# Needs root (network namespaces), iproute2, curl and python3.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
if [ "$(id -u)" != 0 ] || ! command -v ip >/dev/null; then
  echo "SKIP: the test kubelet needs root and iproute2 (network namespaces)"
  exit 77
fi
KBIN="$("$HERE/build")"
eval "$("$ROOT/tests/envtest/up" --with-scheduler)"
WORK="$(mktemp -d /tmp/hydra-kubelet-test.XXXXXX)"
trap '"$ROOT/tests/envtest/down" >/dev/null 2>&1 || true; rm -rf "$WORK"' EXIT
PY="$(command -v python3)"
START=$SECONDS

fail() {
  echo "FAIL: $*"
  kubectl get nodes -o wide || true
  kubectl get pods -o wide || true
  echo "--- kubelet log (tail)"; tail -40 "$WORK/kubelet.log" || true
  for f in "$WORK"/logs/*.log; do [ -f "$f" ] && { echo "--- $f"; tail -5 "$f"; }; done
  exit 1
}
wait_for() {  # wait_for DESCRIPTION COMMAND...: until the command prints something non-empty
  local what="$1"; shift
  for _ in $(seq 1 150); do
    [ -n "$("$@" 2>/dev/null)" ] && return 0
    sleep 0.2
  done
  fail "$what"
}
get() { kubectl get "$@" 2>/dev/null; }
is() {  # is WANT COMMAND...: prints ok when the command prints WANT
  local want="$1"; shift
  [ "$("$@" 2>/dev/null)" = "$want" ] && echo ok
}

mkdir -p "$WORK/logs" "$WORK/www/web-1" "$WORK/www/web-2"
echo "hello from web-1" >"$WORK/www/web-1/index.html"
echo "hello from web-2" >"$WORK/www/web-2/index.html"
"$KBIN/test-kubelet" --node node-1=1 --autoscale-max-nodes 2 --autoscale-gpus 2 \
  --binary python3="$PY" --log-dir "$WORK/logs" 2>"$WORK/kubelet.log" &
KPID=$!
echo "$KPID" >"$HYDRA_ENVTEST_DIR/kubelet.pid"
wait_for "node-1 did not become Ready" \
  get node node-1 -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}'
wait_for "node-1 kept the not-ready taint" is "" get node node-1 -o jsonpath='{.spec.taints}'

web() {  # web NAME PORT: python3 -m http.server 8000 serving $WORK/www/NAME, ready by PORT
  kubectl apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: $1}
spec:
  containers:
  - name: web
    image: python:3
    command: [python3, -m, http.server]
    args: ["8000", --directory, "$WORK/www/\$(POD_NAME)"]
    env:
    - name: POD_NAME
      valueFrom: {fieldRef: {fieldPath: metadata.name}}
    ports: [{name: http, containerPort: 8000}]
    readinessProbe:
      httpGet: {path: /, port: $2}
      periodSeconds: 1
YAML
}
simple() {  # simple NAME RESTART_POLICY GPUS COMMAND_JSON [FINALIZER]
  kubectl apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata:
  name: $1
  finalizers: [${5:-}]
spec:
  restartPolicy: $2
  terminationGracePeriodSeconds: 10
  containers:
  - name: main
    image: python:3
    command: $4
    resources: {limits: {nvidia.com/gpu: "$3"}}
YAML
}
TRAP="import signal,sys,time
def term(*_):
    open(sys.argv[1], 'w').write('SIGTERM')
    sys.exit(0)
signal.signal(signal.SIGTERM, term)
print('trap set', flush=True)
while True: time.sleep(0.1)"
TRAP_JSON="$(python3 -c 'import json,sys; print(json.dumps(sys.argv[1:]))' python3 -c "$TRAP" "$WORK/trap.marker")"

web web-1 8000
web web-2 http
simple big Always 2 '[python3, -c, "import time; time.sleep(3600)"]' test.hydra.dev/hold
simple trap Always 0 "$TRAP_JSON"
simple bad Never 0 '[hydra-no-such-binary, --flag]'
simple crash Always 0 '[python3, -c, "import sys; sys.exit(3)"]'
simple done Never 0 '[python3, -c, "print(42)"]'

# (b) Unschedulable first (node-1 has 1 GPU), then the autoscaler's node. The condition lasts
# only until auto-1 exists (1 s after it is seen): the scheduler's FailedScheduling event stays.
wait_for "pod big was not reported Unschedulable" \
  get events --field-selector involvedObject.name=big,reason=FailedScheduling -o jsonpath='{.items[*].reason}'
case "$(get pod big -o jsonpath='{.spec.nodeName}')" in
  "" | auto-1) ;;
  *) fail "big was bound before a node with 2 GPUs existed" ;;
esac

# (e) unknown command
wait_for "pod bad did not fail with UnknownCommand" \
  is Failed=UnknownCommand get pod bad -o jsonpath='{.status.phase}{"="}{.status.reason}'
get pod bad -o jsonpath='{.status.message}' | grep -q hydra-no-such-binary || fail "bad: message does not name the command"

# (a) two web servers on port 8000, each in its own netns.
kubectl wait --for=condition=Ready pod/web-1 pod/web-2 --timeout=30s >/dev/null || fail "web pods not Ready"
IP1="$(get pod web-1 -o jsonpath='{.status.podIP}')"
IP2="$(get pod web-2 -o jsonpath='{.status.podIP}')"
[ -n "$IP1" ] && [ -n "$IP2" ] && [ "$IP1" != "$IP2" ] || fail "pod IPs: '$IP1' '$IP2'"
[ "$(get pod web-1 -o jsonpath='{.status.phase}')" = Running ] || fail "web-1 not Running"
[ "$(curl -fsS --max-time 5 "http://$IP1:8000/")" = "hello from web-1" ] || fail "curl web-1 at $IP1"
[ "$(curl -fsS --max-time 5 "http://$IP2:8000/")" = "hello from web-2" ] || fail "curl web-2 at $IP2"
grep -q 'GET / ' "$WORK/logs/default_web-1_web.log" || fail "web-1's log has no request"
echo "ok: web-1 at $IP1 and web-2 at $IP2 both serve port 8000"

# (b) continued
wait_for "pod big did not run on an autoscaled node" \
  get pod big -o jsonpath='{.status.containerStatuses[0].state.running.startedAt}'
[ "$(get pod big -o jsonpath='{.spec.nodeName}')" = auto-1 ] || fail "big is not on auto-1"
[ "$(get node auto-1 -o jsonpath='{.status.allocatable.nvidia\.com/gpu}')" = 2 ] || fail "auto-1 has not 2 GPUs"
BIGPID="$(get pod big -o jsonpath='{.status.containerStatuses[0].containerID}')"
BIGPID="${BIGPID#test://}"
kill -0 "$BIGPID" 2>/dev/null || fail "big's process $BIGPID does not run"
echo "ok: big was Unschedulable, auto-1 (2 GPUs) was added, big runs there (pid $BIGPID)"

# (c) graceful deletion
wait_for "trap did not set its signal handler" grep -s 'trap set' "$WORK/logs/default_trap_main.log"
kubectl delete pod trap --wait=false >/dev/null
kubectl wait --for=delete pod/trap --timeout=20s >/dev/null 2>&1 || fail "pod trap was not deleted"
[ "$(cat "$WORK/trap.marker" 2>/dev/null)" = SIGTERM ] || fail "trap did not get SIGTERM"
echo "ok: kubectl delete pod: SIGTERM, pod gone"

# (f) a Secret volume, seen only by its pod
mkdir -p "$WORK/secret-mount"
kubectl create secret generic pod-secret --from-literal=token=s3cr3t >/dev/null
kubectl apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: reads-secret}
spec:
  restartPolicy: Never
  containers:
  - name: main
    image: python:3
    command: [python3, -c, "import os; p='$WORK/secret-mount/token'; print(open(p).read(), oct(os.stat(p).st_mode & 0o777)); open(p, 'a')"]
    volumeMounts: [{name: s, mountPath: $WORK/secret-mount}]
  volumes: [{name: s, secret: {secretName: pod-secret, defaultMode: 0440}}]
YAML
wait_for "reads-secret did not end" get pod reads-secret -o jsonpath='{.status.containerStatuses[0].state.terminated.exitCode}'
grep -q "s3cr3t 0o440" "$WORK/logs/default_reads-secret_main.log" || fail "reads-secret did not read the Secret: $(cat "$WORK/logs/default_reads-secret_main.log")"
grep -q "Read-only file system" "$WORK/logs/default_reads-secret_main.log" || fail "the Secret's mount is writable"
[ -z "$(ls -A "$WORK/secret-mount")" ] || fail "the Secret leaked into the host's directory"
echo "ok: a Secret volume, read-only, at its mount path in the pod only"

# restarts, and a completed pod
wait_for "crash was not restarted" \
  is 3 get pod crash -o jsonpath='{.status.containerStatuses[0].lastState.terminated.exitCode}'
wait_for "done did not succeed" is Succeeded get pod done -o jsonpath='{.status.phase}'

# (d) spot reclaim
kubectl delete node auto-1 --wait=false >/dev/null
wait_for "big was not deleted after auto-1 was" get pod big -o jsonpath='{.metadata.deletionTimestamp}'
[ "$(get pod big -o jsonpath='{.status.phase}')" = Failed ] || fail "big is not Failed"
[ "$(get pod big -o jsonpath='{.status.conditions[?(@.type=="DisruptionTarget")].reason}')" = DeletionByPodGC ] ||
  fail "big has no DisruptionTarget/DeletionByPodGC condition"
! kill -0 "$BIGPID" 2>/dev/null || fail "big's process $BIGPID still runs"
kubectl patch pod big --type=json -p '[{"op":"remove","path":"/metadata/finalizers"}]' >/dev/null
kubectl wait --for=delete pod/big --timeout=10s >/dev/null 2>&1 || fail "big was not deleted"
echo "ok: node auto-1 deleted: big killed, Failed with DisruptionTarget, deleted"

# Everything deleted: no netns of the kubelet is left; it stops cleanly.
kubectl delete pod --all --wait=false >/dev/null
kubectl wait --for=delete pod --all --timeout=20s >/dev/null 2>&1 || fail "pods were not deleted"
[ -z "$(ip netns list | grep "^hk-$KPID-" || true)" ] || fail "netns left: $(ip netns list | grep "^hk-$KPID-")"
# A gone pod's address is refused on this machine, not sent out through the default route.
route="$(ip route get "$IP1" 2>&1 || true)"
grep -qE "unreachable|No route to host" <<<"$route" || fail "$IP1 (web-1, gone) is routed: $route"
curl -sS --max-time 5 "http://$IP1:8000/" >/dev/null 2>&1 && fail "web-1's old address $IP1 answers"
echo "ok: a gone pod's address is unreachable here"
kill -TERM "$KPID"
rc=0; wait "$KPID" || rc=$?
[ "$rc" = 0 ] || fail "the kubelet exited with $rc at SIGTERM"
[ -z "$(ip netns list | grep "^hk-$KPID-" || true)" ] || fail "netns left after the kubelet stopped"
[ -z "$(ip -o link show | grep -o "hk${KPID}v[0-9]*" || true)" ] || fail "veths left after the kubelet stopped"
[ -z "$(ip route show type unreachable | grep "metric $KPID\b" || true)" ] || fail "the pod CIDR's unreachable route is left"
echo "PASS: test kubelet: pods run in their own netns, Ready by probes, autoscaled, deleted," \
  "reclaimed with their node; unknown commands fail ($((SECONDS - START)) s after the control plane was up)"
