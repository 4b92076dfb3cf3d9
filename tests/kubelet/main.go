// Command test-kubelet is the stand-in for the nodes of a cluster in Hydra's end-to-end tests: one
// process acts as the kubelet of several Nodes of a test control plane (tests/envtest) and runs
// every pod bound to them as local processes, each pod in its own network namespace, reporting
// pod status as a kubelet does. It also stands in for a cluster autoscaler (adds nodes for
// unschedulable pods) and for the PodGC controller (a deleted Node is a spot reclaim).
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
)

const usageText = `Usage: test-kubelet [flags]

A test kubelet for Hydra's end-to-end tests. One process registers several Nodes on a test
control plane and acts as the kubelet of all of them: every pod the scheduler binds to one of
its nodes is run as local processes (the container images are ignored), each pod in its own
network namespace with its own IP, and its status is written as a kubelet writes it.

What runs: a container's command[0] (after $(VAR) expansion) is looked up in the --binary
mappings; the process is <PATH> command[1:]... args... inside the pod's network namespace
(ip netns exec), in its own process group, with the container's env plus PATH and HOME of this
process (and HOSTNAME=<pod name>), cwd workingDir or --log-dir, stdout+stderr appended to
--log-dir/<namespace>_<pod>_<container>.log. Needs root and iproute2.

Supported pod features:
  - env value, valueFrom.fieldRef (metadata.name/namespace/uid, metadata.labels['k'],
    metadata.annotations['k'], spec.nodeName, spec.serviceAccountName, status.podIP(s),
    status.hostIP(s)); $(VAR) in env values, command and args as Kubernetes expands it
  - volumes: hostPath mounted at exactly its own path; secret (all keys or items, defaultMode),
    written under --log-dir and bind-mounted read-only over the mountPath, which must be an
    existing directory of this machine, in a mount namespace of the container's own
  - init containers (run in order before the containers; sidecars, i.e. init containers with
    restartPolicy Always, are not supported)
  - readinessProbe httpGet/tcpSocket/exec (exec through --binary, in the pod netns); liveness
    and startup probes are ignored; readinessGates are honoured
  - restartPolicy Always/OnFailure/Never (restart back-off 1 s doubling to 10 s)
  - deletion: SIGTERM to each container's process group, SIGKILL after the grace period,
    terminal phase written, then the pod is deleted (grace 0, UID precondition)
Anything else that would change what runs (a command without mapping, envFrom, secretKeyRef,
configMapKeyRef, resourceFieldRef, other volume kinds, grpc probes, sidecars) makes the pod
Failed at once with a reason (UnknownCommand, BinaryNotFound, UnsupportedEnv,
UnsupportedVolume, FailedMount, UnsupportedProbe, UnsupportedInitContainer) and a message.
Resources (cpu, memory, nvidia.com/gpu) are only what the nodes advertise to the scheduler.

Networking: each pod gets a /30 of --pod-cidr: a veth pair hk<pid>v<n> (root netns, .1) and
eth0 (pod netns hk-<pid>-<n>, .2), lo up, default route via .1. The host reaches every pod IP;
pods reach the host at their .1 address (not at 127.0.0.1: that is the pod's own loopback).
Pod-to-pod traffic needs net.ipv4.ip_forward=1, which this program does not set.
status.hostIP is 127.0.0.1.

Nodes: Ready (heartbeat every 10 s), InternalIP 127.0.0.1, the API server's not-ready taint
removed. Deleting one of its Node objects (kubectl delete node X) is a spot reclaim: after
--reclaim-grace every process of its pods is killed, their netns removed, and each pod is
marked Failed with condition DisruptionTarget (reason DeletionByPodGC) and deleted, as the
PodGC controller does; the node is not re-created.

Autoscaler (--autoscale-max-nodes > 0): a pod Pending with PodScheduled=False/Unschedulable,
without schedulingGates, that would fit an empty node of --autoscale-gpus GPUs (requests and
nodeSelector) but fits no node of this kubelet now, makes it add node auto-<k> after
--autoscale-delay (at most one per delay), while fewer than the maximum nodes are managed.
With --autoscale-idle > 0 an autoscaled node without pods for that long is tainted
ToBeDeletedByClusterAutoscaler and deleted.

On SIGTERM/SIGINT: every process gets SIGTERM, SIGKILL after 3 s, every netns and veth of
this process is removed, exit 0 (Node objects are left). At start, netns and veths left by
test-kubelet processes that no longer run are removed (with any process still inside).

Flags:
`

type nodeSpec struct {
	name string
	gpus int
}

type config struct {
	kubeconfig     string
	nodes          []nodeSpec
	nodeLabels     map[string]string
	nodeCPU        resource.Quantity
	nodeMemory     resource.Quantity
	binaries       map[string]string
	logDir         string
	podCIDR        string
	autoscaleMax   int
	autoscaleGPUs  int
	autoscaleDelay time.Duration
	autoscaleIdle  time.Duration
	reclaimGrace   time.Duration
}

type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, " ") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

func parseFlags(args []string) (*config, error) {
	fs := flag.NewFlagSet("test-kubelet", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usageText)
		fs.PrintDefaults()
	}
	var nodes, binaries listFlag
	cfg := &config{}
	fs.StringVar(&cfg.kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "`PATH` of the kubeconfig of the API server (default $KUBECONFIG)")
	fs.Var(&nodes, "node", "a node `NAME=GPUS` registered at start, with GPUS nvidia.com/gpu (repeatable)")
	labels := fs.String("node-labels", "", "labels `k=v,...` of every node (besides kubernetes.io/hostname=NAME)")
	cpu := fs.String("node-cpu", "16", "cpu `QUANTITY` of every node")
	mem := fs.String("node-memory", "64Gi", "memory `QUANTITY` of every node")
	fs.Var(&binaries, "binary", "`NAME=PATH`: run PATH for a container whose command[0] is NAME (repeatable)")
	fs.StringVar(&cfg.logDir, "log-dir", "", "`DIR` of the containers' logs (default: a new /tmp/test-kubelet-<pid>)")
	fs.StringVar(&cfg.podCIDR, "pod-cidr", "", "IPv4 `CIDR` of pod addresses, a /30 per pod (default: a /16 of 10.200-10.250.0.0 that no host address or route uses and no other test-kubelet holds)")
	fs.IntVar(&cfg.autoscaleMax, "autoscale-max-nodes", 0, "autoscaler: most nodes this kubelet manages (0: no autoscaling)")
	fs.IntVar(&cfg.autoscaleGPUs, "autoscale-gpus", 1, "autoscaler: nvidia.com/gpu of a node it adds")
	fs.DurationVar(&cfg.autoscaleDelay, "autoscale-delay", time.Second, "autoscaler: how long a pod stays unschedulable before a node is added, and the least time between two additions")
	fs.DurationVar(&cfg.autoscaleIdle, "autoscale-idle", 0, "autoscaler: delete an autoscaled node without pods for this long (0: never)")
	fs.DurationVar(&cfg.reclaimGrace, "reclaim-grace", 0, "a deleted node's processes get SIGTERM and this long before SIGKILL (0: SIGKILL at once)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if cfg.kubeconfig == "" {
		return nil, fmt.Errorf("no --kubeconfig and no $KUBECONFIG")
	}
	seen := map[string]bool{}
	for _, n := range nodes {
		name, g, ok := strings.Cut(n, "=")
		gpus, err := strconv.Atoi(g)
		if !ok || err != nil || gpus < 0 {
			return nil, fmt.Errorf("--node %q: want NAME=GPUS", n)
		}
		if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
			return nil, fmt.Errorf("--node %q: %s", n, strings.Join(errs, "; "))
		}
		if seen[name] {
			return nil, fmt.Errorf("--node %q given twice", name)
		}
		seen[name] = true
		cfg.nodes = append(cfg.nodes, nodeSpec{name, gpus})
	}
	cfg.nodeLabels = map[string]string{}
	if *labels != "" {
		for _, kv := range strings.Split(*labels, ",") {
			k, v, ok := strings.Cut(kv, "=")
			if !ok || k == "" {
				return nil, fmt.Errorf("--node-labels: %q is not k=v", kv)
			}
			cfg.nodeLabels[k] = v
		}
	}
	var err error
	if cfg.nodeCPU, err = resource.ParseQuantity(*cpu); err != nil {
		return nil, fmt.Errorf("--node-cpu: %v", err)
	}
	if cfg.nodeMemory, err = resource.ParseQuantity(*mem); err != nil {
		return nil, fmt.Errorf("--node-memory: %v", err)
	}
	cfg.binaries = map[string]string{}
	for _, b := range binaries {
		name, path, ok := strings.Cut(b, "=")
		if !ok || name == "" || path == "" {
			return nil, fmt.Errorf("--binary %q: want NAME=PATH", b)
		}
		if abs, err := filepath.Abs(path); err == nil {
			path = abs
		}
		cfg.binaries[name] = path
	}
	if cfg.autoscaleMax < 0 || cfg.autoscaleGPUs < 0 {
		return nil, fmt.Errorf("--autoscale-max-nodes and --autoscale-gpus must not be negative")
	}
	if len(cfg.nodes) == 0 && cfg.autoscaleMax == 0 {
		return nil, fmt.Errorf("no --node and no --autoscale-max-nodes: nothing to do")
	}
	return cfg, nil
}

// kubelet is the state of the whole process.
type kubelet struct {
	cfg        *config
	cs         kubernetes.Interface
	podLister  corelisters.PodLister
	nodeLister corelisters.NodeLister
	net        *netAlloc
	ctx        context.Context // cancelled at SIGTERM/SIGINT

	mu        sync.Mutex
	nodes     map[string]*managedNode // the nodes this kubelet manages
	reclaimed map[string]bool         // its nodes that were deleted
	workers   map[types.UID]*podWorker
	gced      map[types.UID]bool // pods given the PodGC treatment
	autoSeq   int
	wg        sync.WaitGroup // pod workers
}

func logf(format string, args ...any) { log.Printf(format, args...) }

func main() {
	log.SetFlags(log.Ltime | log.Lmicroseconds)
	log.SetPrefix("test-kubelet: ")
	if len(os.Args) > 1 && os.Args[1] == mountFlag {
		err := mountThenExec(os.Args[2:])
		fmt.Fprintf(os.Stderr, "test-kubelet: %v\n", err)
		os.Exit(127)
	}
	cfg, err := parseFlags(os.Args[1:])
	if err == flag.ErrHelp {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "test-kubelet: %v (see --help)\n", err)
		os.Exit(2)
	}
	if err := run(cfg); err != nil {
		log.Printf("%v", err)
		os.Exit(1)
	}
}

func run(cfg *config) error {
	for name, path := range cfg.binaries {
		if st, err := os.Stat(path); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
			logf("warning: --binary %s=%s is not an executable file (yet)", name, path)
		}
	}
	if cfg.logDir == "" {
		cfg.logDir = fmt.Sprintf("/tmp/test-kubelet-%d", os.Getpid())
	}
	if err := os.MkdirAll(cfg.logDir, 0o755); err != nil {
		return fmt.Errorf("--log-dir: %v", err)
	}
	if abs, err := filepath.Abs(cfg.logDir); err == nil {
		cfg.logDir = abs
	}
	removeLeftovers()
	na, err := newNetAlloc(cfg.podCIDR)
	if err != nil {
		return err
	}
	rest, err := clientcmd.BuildConfigFromFlags("", cfg.kubeconfig)
	if err != nil {
		return fmt.Errorf("kubeconfig %s: %v", cfg.kubeconfig, err)
	}
	rest.QPS, rest.Burst, rest.UserAgent = 100, 200, "test-kubelet"
	cs, err := kubernetes.NewForConfig(rest)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	k := &kubelet{
		cfg: cfg, cs: cs, net: na, ctx: ctx,
		nodes:     map[string]*managedNode{},
		reclaimed: map[string]bool{},
		workers:   map[types.UID]*podWorker{},
		gced:      map[types.UID]bool{},
	}
	for _, n := range cfg.nodes {
		k.nodes[n.name] = &managedNode{name: n.name, gpus: n.gpus}
	}
	logf("pid %d, pod CIDR %s, logs in %s, binaries %s", os.Getpid(), na.cidr, cfg.logDir, binaryList(cfg.binaries))

	factory := informers.NewSharedInformerFactory(cs, 0)
	podInf := factory.Core().V1().Pods()
	nodeInf := factory.Core().V1().Nodes()
	k.podLister, k.nodeLister = podInf.Lister(), nodeInf.Lister()
	_, _ = podInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { k.podChanged(o) },
		UpdateFunc: func(_, o any) { k.podChanged(o) },
		DeleteFunc: func(o any) { k.podDeleted(o) },
	})
	_, _ = nodeInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		DeleteFunc: func(o any) { k.nodeDeleted(o) },
	})
	informerStop := make(chan struct{})
	factory.Start(informerStop)
	syncCtx, cancel := context.WithTimeout(ctx, 60*time.Second)
	ok := cache.WaitForCacheSync(syncCtx.Done(), podInf.Informer().HasSynced, nodeInf.Informer().HasSynced)
	cancel()
	if !ok {
		close(informerStop)
		k.shutdown()
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("could not list pods and nodes from the API server")
	}
	for _, n := range cfg.nodes {
		if err := k.registerNode(ctx, n.name, n.gpus); err != nil {
			if ctx.Err() != nil {
				break
			}
			close(informerStop)
			k.shutdown()
			return fmt.Errorf("node %s: %v", n.name, err)
		}
	}
	go k.heartbeat(ctx)
	if cfg.autoscaleMax > 0 {
		go k.autoscale(ctx)
	}
	<-ctx.Done()
	logf("stopping: terminating all pods")
	close(informerStop)
	k.shutdown()
	logf("stopped")
	return nil
}

// shutdown stops every pod's processes and removes every netns of this process.
func (k *kubelet) shutdown() {
	done := make(chan struct{})
	go func() { k.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(4500 * time.Millisecond):
		logf("some pods did not stop in time")
	}
	k.net.removeAll()
}

func binaryList(m map[string]string) string {
	var s []string
	for k, v := range m {
		s = append(s, k+"="+v)
	}
	sort.Strings(s)
	if len(s) == 0 {
		return "(none)"
	}
	return strings.Join(s, " ")
}

// managed reports whether this kubelet runs the pods of node name.
func (k *kubelet) managed(name string) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.nodes[name] != nil
}

func (k *kubelet) podChanged(o any) {
	pod, ok := o.(*v1.Pod)
	if !ok || pod.Spec.NodeName == "" {
		return
	}
	k.mu.Lock()
	if k.reclaimed[pod.Spec.NodeName] && k.workers[pod.UID] == nil {
		// Bound to a node that no longer exists: what PodGC does.
		first := !k.gced[pod.UID]
		k.gced[pod.UID] = true
		k.mu.Unlock()
		if first {
			go k.podGC(pod, "pod bound to a deleted node")
		}
		return
	}
	if k.nodes[pod.Spec.NodeName] == nil {
		k.mu.Unlock()
		return
	}
	if w := k.workers[pod.UID]; w != nil {
		k.mu.Unlock()
		w.update(pod)
		return
	}
	if k.ctx.Err() != nil || pod.Status.Phase == v1.PodSucceeded || pod.Status.Phase == v1.PodFailed {
		k.mu.Unlock()
		return
	}
	w := newPodWorker(k, pod)
	k.workers[pod.UID] = w
	k.wg.Add(1)
	k.mu.Unlock()
	go func() {
		defer k.wg.Done()
		w.run(k.ctx)
	}()
}

func (k *kubelet) podDeleted(o any) {
	if t, ok := o.(cache.DeletedFinalStateUnknown); ok {
		o = t.Obj
	}
	pod, ok := o.(*v1.Pod)
	if !ok {
		return
	}
	k.mu.Lock()
	w := k.workers[pod.UID]
	delete(k.workers, pod.UID)
	delete(k.gced, pod.UID)
	k.mu.Unlock()
	if w != nil {
		w.vanished()
	}
}
