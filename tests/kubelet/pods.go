package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
)

const hostIP = "127.0.0.1"

// container is one container of a pod and its current process.
type container struct {
	spec      *v1.Container
	init      bool
	gen       int // incremented at each start
	pid       int
	running   bool
	ever      bool // started at least once
	done      bool // finished for good: not to be restarted
	ready     bool
	startedAt time.Time
	restarts  int32
	exitCode  int32
	backoff   time.Duration
	restartAt time.Time // a pending restart
	state     v1.ContainerState
	last      v1.ContainerState
	stopProbe context.CancelFunc
}

type exitEvent struct {
	c        *container
	gen      int
	code     int32
	reason   string // set when the process could not be started
	message  string
	finished time.Time
}

type probeEvent struct {
	c     *container
	gen   int
	ready bool
}

// podWorker runs one pod: its network, its containers' processes and its status.
type podWorker struct {
	k                  *kubelet
	uid                types.UID
	key                string // namespace/name
	namespace, name    string
	node               string
	mu                 sync.Mutex
	latest             *v1.Pod
	kick               chan struct{} // the pod object changed
	gone               chan struct{} // closed when the pod object is gone
	goneOnce           sync.Once
	reclaim            chan struct{} // closed when the pod's node is deleted
	reclaimOnce        sync.Once
	exits              chan exitEvent
	probes             chan probeEvent
	net                *podNet
	inits, mains       []*container
	phase              v1.PodPhase
	reason, message    string
	startTime          metav1.Time
	deleteSent, failed bool
}

func newPodWorker(k *kubelet, pod *v1.Pod) *podWorker {
	w := &podWorker{
		k: k, uid: pod.UID, key: pod.Namespace + "/" + pod.Name,
		namespace: pod.Namespace, name: pod.Name, node: pod.Spec.NodeName,
		latest:  pod,
		kick:    make(chan struct{}, 1),
		gone:    make(chan struct{}),
		reclaim: make(chan struct{}),
		phase:   v1.PodPending,
	}
	for i := range pod.Spec.InitContainers {
		w.inits = append(w.inits, &container{spec: &pod.Spec.InitContainers[i], init: true})
	}
	for i := range pod.Spec.Containers {
		w.mains = append(w.mains, &container{spec: &pod.Spec.Containers[i]})
	}
	for _, c := range w.all() {
		reason := "ContainerCreating"
		if !c.init && len(w.inits) > 0 {
			reason = "PodInitializing"
		}
		c.state = v1.ContainerState{Waiting: &v1.ContainerStateWaiting{Reason: reason}}
	}
	w.adopt(pod)
	// One pending exit per container at most: sends never block.
	w.exits = make(chan exitEvent, len(w.inits)+len(w.mains)+1)
	w.probes = make(chan probeEvent, len(w.mains)+1)
	return w
}

// adopt takes over what an earlier kubelet (an earlier run of this program) reported of the
// pod: restart counts go on, and the containers that finished for good stay so (the API server
// refuses to see them run again), as when a kubelet restarts on a rebooted node.
func (w *podWorker) adopt(pod *v1.Pod) {
	policy := pod.Spec.RestartPolicy
	prior := func(statuses []v1.ContainerStatus, cs []*container) {
		for _, s := range statuses {
			for _, c := range cs {
				if c.spec.Name != s.Name || (s.State.Running == nil && s.State.Terminated == nil && s.LastTerminationState.Terminated == nil) {
					continue
				}
				// Started again at once, as a restart.
				c.ever, c.restarts, c.last, c.restartAt = true, s.RestartCount, s.LastTerminationState, time.Now()
				t := s.State.Terminated
				if t == nil {
					continue
				}
				if (c.init && t.ExitCode == 0) || (!c.init && (policy == v1.RestartPolicyNever || (policy == v1.RestartPolicyOnFailure && t.ExitCode == 0))) {
					c.done, c.exitCode, c.state, c.restartAt = true, t.ExitCode, s.State, time.Time{}
				} else {
					c.last = s.State
				}
			}
		}
	}
	prior(pod.Status.InitContainerStatuses, w.inits)
	prior(pod.Status.ContainerStatuses, w.mains)
}

func (w *podWorker) all() []*container { return append(append([]*container{}, w.inits...), w.mains...) }

func (w *podWorker) pod() *v1.Pod {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.latest
}

func (w *podWorker) update(pod *v1.Pod) {
	w.mu.Lock()
	w.latest = pod
	w.mu.Unlock()
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

func (w *podWorker) vanished()      { w.goneOnce.Do(func() { close(w.gone) }) }
func (w *podWorker) nodeReclaimed() { w.reclaimOnce.Do(func() { close(w.reclaim) }) }

func (w *podWorker) isGone() bool {
	select {
	case <-w.gone:
		return true
	default:
		return false
	}
}

// run is the life of the pod on this kubelet.
func (w *podWorker) run(ctx context.Context) {
	defer func() { w.k.net.teardown(w.net); w.net = nil }()
	pod := w.pod()
	w.startTime = metav1.Now()
	if pod.DeletionTimestamp != nil {
		w.deleted(ctx)
		return
	}
	if pe := w.k.validate(pod); pe != nil {
		w.fail(pe)
		w.idle(ctx)
		return
	}
	if pe := w.writeSecretVolumes(ctx, pod); pe != nil {
		w.fail(pe)
		w.idle(ctx)
		return
	}
	defer w.removeVolumes()
	net, err := w.k.net.setup()
	if err != nil {
		w.fail(&podError{"NetworkSetupFailed", err.Error()})
		w.idle(ctx)
		return
	}
	w.net = net
	logf("pod %s bound to %s: network %s, IP %s", w.key, w.node, net.ns, net.podIP)
	dirty := true
	for {
		w.step()
		if w.phase == v1.PodSucceeded || w.phase == v1.PodFailed {
			w.terminate(ctx, 0, false)
			w.k.net.teardown(w.net)
			w.net = nil
			w.writeStatus()
			logf("pod %s: %s", w.key, w.phase)
			w.idle(ctx)
			return
		}
		if dirty {
			w.writeStatus()
			dirty = false
		}
		var timer <-chan time.Time
		var t *time.Timer
		if at := w.nextRestart(); !at.IsZero() {
			t = time.NewTimer(time.Until(at))
			timer = t.C
		}
		stopTimer := func() {
			if t != nil {
				t.Stop()
			}
		}
		select {
		case <-ctx.Done():
			w.terminate(ctx, 3*time.Second, false)
			return
		case <-w.gone:
			logf("pod %s vanished: stopping its containers", w.key)
			w.terminate(ctx, 2*time.Second, false)
			return
		case <-w.reclaim:
			w.reclaimed(ctx)
			return
		case <-w.kick:
			if w.pod().DeletionTimestamp != nil {
				w.deleted(ctx)
				return
			}
		case ev := <-w.exits:
			w.onExit(ev, true)
			dirty = true
		case ev := <-w.probes:
			if ev.gen == ev.c.gen && ev.c.running && ev.c.ready != ev.ready {
				ev.c.ready = ev.ready
				logf("pod %s: container %s ready=%v", w.key, ev.c.spec.Name, ev.ready)
				dirty = true
			}
		case <-timer:
			dirty = true
		}
		stopTimer()
	}
}

// step starts what should run now: the next init container, else every main container not
// running and not waiting for a restart.
func (w *podWorker) step() {
	now := time.Now()
	for _, c := range w.inits {
		if c.done {
			if c.exitCode != 0 {
				w.phase = v1.PodFailed
				return
			}
			continue
		}
		if c.running {
			return
		}
		if !c.ever || (!c.restartAt.IsZero() && !now.Before(c.restartAt)) {
			w.start(c)
		}
		return
	}
	started := false
	for _, c := range w.mains {
		if c.running || c.done {
			started = started || c.ever
			continue
		}
		if !c.ever || (!c.restartAt.IsZero() && !now.Before(c.restartAt)) {
			w.start(c)
		}
		started = true
	}
	if started && w.phase == v1.PodPending {
		w.phase = v1.PodRunning
	}
	allDone, allZero := true, true
	for _, c := range w.mains {
		allDone = allDone && c.done
		allZero = allZero && c.exitCode == 0
	}
	if allDone {
		w.phase = v1.PodFailed
		if allZero {
			w.phase = v1.PodSucceeded
		}
	}
}

func (w *podWorker) nextRestart() time.Time {
	var at time.Time
	for _, c := range w.all() {
		if !c.running && !c.done && !c.restartAt.IsZero() && (at.IsZero() || c.restartAt.Before(at)) {
			at = c.restartAt
		}
	}
	return at
}

// start starts a container's process in the pod's netns.
func (w *podWorker) start(c *container) {
	pod := w.pod()
	now := time.Now()
	if c.ever {
		c.restarts++
	}
	c.ever, c.running, c.ready = true, true, false
	c.gen++
	c.restartAt = time.Time{}
	c.startedAt = now
	gen := c.gen
	fail := func(err error) {
		c.pid = 0
		w.exits <- exitEvent{c: c, gen: gen, code: 128, reason: "StartError", message: err.Error(), finished: time.Now()}
	}
	env, vars, err := containerEnv(pod, c.spec, w.net.podIP.String())
	if err != nil {
		fail(err)
		return
	}
	args := argv(c.spec, vars)
	bin, ok := w.k.cfg.binaries[args[0]]
	if !ok {
		fail(fmt.Errorf("no --binary mapping for %q", args[0]))
		return
	}
	logPath := filepath.Join(w.k.cfg.logDir, fmt.Sprintf("%s_%s_%s.log", pod.Namespace, pod.Name, c.spec.Name))
	out, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		fail(err)
		return
	}
	defer out.Close()
	cmd := exec.Command("ip", append([]string{"netns", "exec", w.net.ns, bin}, args[1:]...)...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = out, out
	cmd.Dir = c.spec.WorkingDir
	if cmd.Dir == "" {
		cmd.Dir = w.k.cfg.logDir
	}
	// Own process group (to signal all of it); SIGKILL should this program die unexpectedly
	// (Pdeathsig follows the forking OS thread: this program locks none, so Go never ends them).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := withMounts(cmd, w.secretMounts(pod, c.spec)); err != nil {
		fail(err)
		return
	}
	if err := cmd.Start(); err != nil {
		fail(err)
		return
	}
	c.pid = cmd.Process.Pid
	c.state = v1.ContainerState{Running: &v1.ContainerStateRunning{StartedAt: metav1.NewTime(now)}}
	c.ready = c.spec.ReadinessProbe == nil
	go func() {
		_ = cmd.Wait()
		code := int32(cmd.ProcessState.ExitCode())
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			code = 128 + int32(ws.Signal())
		}
		w.exits <- exitEvent{c: c, gen: gen, code: code, finished: time.Now()}
	}()
	if c.spec.ReadinessProbe != nil {
		pctx, cancel := context.WithCancel(context.Background())
		c.stopProbe = cancel
		go w.probeLoop(pctx, c, gen, w.net.podIP.String(), w.net.ns, env)
	}
	what := "started"
	if c.restarts > 0 {
		what = fmt.Sprintf("restarted (%d)", c.restarts)
	}
	kind := "container"
	if c.init {
		kind = "init container"
	}
	logf("pod %s bound to %s: %s %s %s: pid %d at %s (%s)", w.key, w.node, kind, c.spec.Name, what, c.pid, w.net.podIP, shellWords(args))
}

// onExit records a container's exit; with mayRestart, schedules its restart as the pod's
// restartPolicy says.
func (w *podWorker) onExit(ev exitEvent, mayRestart bool) {
	c := ev.c
	if ev.gen != c.gen || !c.running {
		return
	}
	c.running, c.ready = false, false
	if c.stopProbe != nil {
		c.stopProbe()
		c.stopProbe = nil
	}
	if c.pid > 0 {
		_ = syscall.Kill(-c.pid, syscall.SIGKILL) // what the container left behind
	}
	reason := ev.reason
	if reason == "" {
		reason = "Error"
		if ev.code == 0 {
			reason = "Completed"
		}
	}
	term := &v1.ContainerStateTerminated{
		ExitCode: ev.code, Reason: reason, Message: ev.message,
		StartedAt: metav1.NewTime(c.startedAt), FinishedAt: metav1.NewTime(ev.finished),
		ContainerID: containerID(c),
	}
	c.exitCode = ev.code
	policy := w.pod().Spec.RestartPolicy
	restart := policy == v1.RestartPolicyAlways || (policy == v1.RestartPolicyOnFailure && ev.code != 0)
	if c.init {
		restart = ev.code != 0 && policy != v1.RestartPolicyNever
	}
	msg := ""
	if ev.message != "" {
		msg = ": " + ev.message
	}
	if !mayRestart || !restart {
		c.done = true
		c.state = v1.ContainerState{Terminated: term}
		logf("pod %s: container %s (pid %d) exited with %d%s", w.key, c.spec.Name, c.pid, ev.code, msg)
		return
	}
	if ev.finished.Sub(c.startedAt) > time.Minute {
		c.backoff = 0
	}
	if c.backoff == 0 {
		c.backoff = time.Second
	} else if c.backoff *= 2; c.backoff > 10*time.Second {
		c.backoff = 10 * time.Second
	}
	c.restartAt = time.Now().Add(c.backoff)
	c.last = v1.ContainerState{Terminated: term}
	c.state = v1.ContainerState{Waiting: &v1.ContainerStateWaiting{
		Reason:  "CrashLoopBackOff",
		Message: fmt.Sprintf("back-off %s restarting failed container=%s pod=%s_%s(%s)", c.backoff, c.spec.Name, w.name, w.namespace, w.uid),
	}}
	logf("pod %s: container %s (pid %d) exited with %d%s; restarting in %s", w.key, c.spec.Name, c.pid, ev.code, msg, c.backoff)
}

func containerID(c *container) string {
	if c.pid <= 0 {
		return ""
	}
	return fmt.Sprintf("test://%d", c.pid)
}

// terminate stops every running container: SIGTERM to its process group, SIGKILL after grace
// (at once when grace is 0); no restarts. With followDeletion, a shorter deletion grace period
// given meanwhile (a second kubectl delete) shortens the wait.
func (w *podWorker) terminate(ctx context.Context, grace time.Duration, followDeletion bool) {
	for _, c := range w.all() {
		if !c.running && !c.done {
			c.done = true
			c.restartAt = time.Time{}
			if c.last.Terminated != nil && c.state.Waiting != nil {
				c.state, c.exitCode = c.last, c.last.Terminated.ExitCode
			}
		}
	}
	signal := func(sig syscall.Signal) int {
		n := 0
		for _, c := range w.all() {
			if c.running && c.pid > 0 {
				_ = syscall.Kill(-c.pid, sig)
				n++
			}
		}
		return n
	}
	sig := syscall.SIGTERM
	if grace <= 0 {
		sig = syscall.SIGKILL
	}
	if signal(sig) == 0 {
		// Only processes that never started (start errors) may be left: collect their events.
		w.drainExits()
		return
	}
	for _, c := range w.all() {
		if c.stopProbe != nil {
			c.stopProbe()
			c.stopProbe = nil
		}
	}
	killed := sig == syscall.SIGKILL
	deadline := time.Now().Add(grace)
	if killed {
		deadline = time.Now().Add(5 * time.Second) // then give up waiting
	}
	done, gone, kick := ctx.Done(), w.gone, w.kick
	if !followDeletion {
		kick = nil
	}
	for w.anyRunning() {
		t := time.NewTimer(time.Until(deadline))
		select {
		case ev := <-w.exits:
			w.onExit(ev, false)
		case <-t.C:
			if killed {
				logf("pod %s: processes did not exit 5 s after SIGKILL; giving up on them", w.key)
				for _, c := range w.all() {
					if c.running {
						w.onExit(exitEvent{c: c, gen: c.gen, code: 137, finished: time.Now()}, false)
					}
				}
			} else {
				if n := signal(syscall.SIGKILL); n > 0 {
					logf("pod %s: %d containers still running after %s: SIGKILL", w.key, n, grace)
				}
				killed = true
				deadline = time.Now().Add(5 * time.Second)
			}
		case <-done:
			done = nil
			if d := time.Now().Add(3 * time.Second); !killed && d.Before(deadline) {
				deadline = d
			}
		case <-gone:
			gone = nil
		case <-kick:
			if g := deletionGrace(w.pod()); !killed && time.Now().Add(g).Before(deadline) {
				deadline = time.Now().Add(g)
			}
		case <-w.probes:
		}
		t.Stop()
	}
}

func (w *podWorker) drainExits() {
	for {
		select {
		case ev := <-w.exits:
			w.onExit(ev, false)
		default:
			return
		}
	}
}

func (w *podWorker) anyRunning() bool {
	for _, c := range w.all() {
		if c.running {
			return true
		}
	}
	return false
}

func deletionGrace(pod *v1.Pod) time.Duration {
	if s := pod.DeletionGracePeriodSeconds; s != nil {
		return time.Duration(*s) * time.Second
	}
	if s := pod.Spec.TerminationGracePeriodSeconds; s != nil {
		return time.Duration(*s) * time.Second
	}
	return 30 * time.Second
}

// deleted handles a pod being deleted: stop its containers, write its terminal phase, remove
// its network, and delete the object (grace 0), as a kubelet does.
func (w *podWorker) deleted(ctx context.Context) {
	grace := deletionGrace(w.pod())
	n := 0
	for _, c := range w.all() {
		if c.running {
			n++
		}
	}
	logf("pod %s deleted: stopping %d containers (grace %s)", w.key, n, grace)
	w.terminate(ctx, grace, true)
	w.k.net.teardown(w.net)
	w.net = nil
	if ctx.Err() != nil || w.isGone() {
		return
	}
	if w.phase != v1.PodSucceeded && w.phase != v1.PodFailed {
		w.phase = v1.PodSucceeded
		for _, c := range w.mains {
			if !c.ever || c.exitCode != 0 {
				w.phase = v1.PodFailed
			}
		}
	}
	w.writeStatus()
	w.deletePod()
}

func (w *podWorker) deletePod() {
	if w.deleteSent {
		return
	}
	w.deleteSent = true
	if err := w.k.deletePod(w.namespace, w.name, w.uid); err != nil {
		logf("pod %s: delete: %v", w.key, err)
		return
	}
	logf("pod %s: %s, deleted", w.key, w.phase)
}

// reclaimed handles the deletion of the pod's node: the machine is gone. Its processes are
// killed after --reclaim-grace, its network removed, then PodGC's treatment.
func (w *podWorker) reclaimed(ctx context.Context) {
	w.terminate(ctx, w.k.cfg.reclaimGrace, false)
	w.k.net.teardown(w.net)
	w.net = nil
	if ctx.Err() != nil || w.isGone() {
		return
	}
	w.k.podGC(w.pod(), "node "+w.node+" no longer exists")
}

// fail makes the pod Failed before anything ran: it cannot run here.
func (w *podWorker) fail(pe *podError) {
	w.failed = true
	w.phase, w.reason, w.message = v1.PodFailed, pe.reason, pe.message
	now := metav1.Now()
	for _, c := range w.all() {
		c.done = true
		c.exitCode = 128
		c.state = v1.ContainerState{Terminated: &v1.ContainerStateTerminated{
			ExitCode: 128, Reason: pe.reason, Message: pe.message, StartedAt: now, FinishedAt: now,
		}}
	}
	logf("pod %s bound to %s: Failed, %s: %s", w.key, w.node, pe.reason, pe.message)
	w.writeStatus()
}

// idle waits, once the pod is terminal, for its deletion (then deletes it with grace 0), its
// node's deletion (PodGC) or the end.
func (w *podWorker) idle(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.gone:
			return
		case <-w.reclaim:
			w.k.podGC(w.pod(), "node "+w.node+" no longer exists")
			return
		case <-w.kick:
			if w.pod().DeletionTimestamp != nil {
				w.deletePod()
				return
			}
		case ev := <-w.exits:
			w.onExit(ev, false)
		case <-w.probes:
		}
	}
}

// writeStatus writes the pod's status (the status subresource, retried on conflicts).
func (w *podWorker) writeStatus() {
	if w.isGone() {
		return
	}
	err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		pods := w.k.cs.CoreV1().Pods(w.namespace)
		cur, err := pods.Get(ctx, w.name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if cur.UID != w.uid {
			return errPodReplaced
		}
		cur.Status = w.status(cur)
		_, err = pods.UpdateStatus(ctx, cur, metav1.UpdateOptions{})
		return err
	})
	if err != nil && !apierrors.IsNotFound(err) && !errors.Is(err, errPodReplaced) {
		logf("pod %s: status update: %v", w.key, err)
	}
}

var errPodReplaced = errors.New("pod replaced by another of the same name")

// status is the pod's status as a kubelet reports it, over the current one (other writers'
// conditions and fields are kept).
func (w *podWorker) status(cur *v1.Pod) v1.PodStatus {
	st := *cur.Status.DeepCopy()
	st.Phase, st.Reason, st.Message = w.phase, w.reason, w.message
	st.HostIP, st.HostIPs = hostIP, []v1.HostIP{{IP: hostIP}}
	if w.net != nil {
		st.PodIP, st.PodIPs = w.net.podIP.String(), []v1.PodIP{{IP: w.net.podIP.String()}}
	}
	if st.StartTime == nil {
		t := w.startTime
		st.StartTime = &t
	}
	terminal := w.phase == v1.PodSucceeded || w.phase == v1.PodFailed
	statuses := func(cs []*container) []v1.ContainerStatus {
		var out []v1.ContainerStatus
		for _, c := range cs {
			state := c.state
			if terminal && state.Terminated == nil {
				state = v1.ContainerState{Terminated: &v1.ContainerStateTerminated{
					ExitCode: 137, Reason: "ContainerStatusUnknown",
					Message: "The container could not be located when the pod was terminated",
				}}
			}
			started := c.running
			out = append(out, v1.ContainerStatus{
				Name: c.spec.Name, Image: c.spec.Image, ImageID: "test://" + c.spec.Image,
				ContainerID: containerID(c), State: state, LastTerminationState: c.last,
				Ready: c.running && c.ready, RestartCount: c.restarts, Started: &started,
			})
		}
		return out
	}
	st.InitContainerStatuses = statuses(w.inits)
	st.ContainerStatuses = statuses(w.mains)

	initialized := true
	for _, c := range w.inits {
		initialized = initialized && c.done && c.exitCode == 0
	}
	var unready []string
	for _, c := range w.mains {
		if !(c.running && c.ready) {
			unready = append(unready, c.spec.Name)
		}
	}
	cond := func(t v1.PodConditionType, ok bool, reason, message string) {
		s := v1.ConditionFalse
		if ok {
			s, reason, message = v1.ConditionTrue, "", ""
		}
		setCondition(&st, v1.PodCondition{Type: t, Status: s, Reason: reason, Message: message})
	}
	cond(v1.PodScheduled, true, "", "")
	cond("PodReadyToStartContainers", w.net != nil, "", "")
	if len(w.inits) > 0 {
		var pending []string
		for _, c := range w.inits {
			if !(c.done && c.exitCode == 0) {
				pending = append(pending, c.spec.Name)
			}
		}
		reason := "ContainersNotInitialized"
		if terminal {
			reason = "PodCompleted"
		}
		cond(v1.PodInitialized, initialized, reason, fmt.Sprintf("containers with incomplete status: [%s]", strings.Join(pending, " ")))
	} else {
		cond(v1.PodInitialized, true, "", "")
	}
	notReady := fmt.Sprintf("containers with unready status: [%s]", strings.Join(unready, " "))
	reason := "ContainersNotReady"
	if terminal {
		reason = "PodCompleted"
	}
	cond(v1.ContainersReady, len(unready) == 0, reason, notReady)
	ready := len(unready) == 0
	readyMsg := notReady
	if ready {
		var gates []string
		for _, g := range cur.Spec.ReadinessGates {
			if c := findCondition(&st, g.ConditionType); c == nil || c.Status != v1.ConditionTrue {
				gates = append(gates, string(g.ConditionType))
			}
		}
		if len(gates) > 0 {
			ready, reason, readyMsg = false, "ReadinessGatesNotReady", fmt.Sprintf("corresponding condition of pod readiness gate %q does not exist or is not True", strings.Join(gates, ", "))
		}
	}
	cond(v1.PodReady, ready, reason, readyMsg)
	return st
}

func findCondition(st *v1.PodStatus, t v1.PodConditionType) *v1.PodCondition {
	for i := range st.Conditions {
		if st.Conditions[i].Type == t {
			return &st.Conditions[i]
		}
	}
	return nil
}

// setCondition sets a condition, keeping its lastTransitionTime unless its status changes.
func setCondition(st *v1.PodStatus, c v1.PodCondition) {
	if old := findCondition(st, c.Type); old != nil {
		if old.Status == c.Status {
			c.LastTransitionTime = old.LastTransitionTime
		} else {
			c.LastTransitionTime = metav1.Now()
		}
		c.LastProbeTime = old.LastProbeTime
		*old = c
		return
	}
	c.LastTransitionTime = metav1.Now()
	st.Conditions = append(st.Conditions, c)
}

// deletePod deletes a pod at once (grace 0), if it is still the one with uid.
func (k *kubelet) deletePod(namespace, name string, uid types.UID) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	zero := int64(0)
	err := k.cs.CoreV1().Pods(namespace).Delete(ctx, name, metav1.DeleteOptions{
		GracePeriodSeconds: &zero,
		Preconditions:      &metav1.Preconditions{UID: &uid},
	})
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil
	}
	return err
}

// podGC does what the PodGC controller does with a pod bound to a node that no longer exists:
// phase Failed with condition DisruptionTarget (reason DeletionByPodGC) unless already terminal,
// then deletion with grace 0.
func (k *kubelet) podGC(pod *v1.Pod, why string) {
	err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		pods := k.cs.CoreV1().Pods(pod.Namespace)
		cur, err := pods.Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if cur.UID != pod.UID {
			return errPodReplaced
		}
		if cur.Status.Phase == v1.PodSucceeded || cur.Status.Phase == v1.PodFailed {
			return nil
		}
		cur.Status.Phase = v1.PodFailed
		setCondition(&cur.Status, v1.PodCondition{
			Type: v1.DisruptionTarget, Status: v1.ConditionTrue,
			Reason: "DeletionByPodGC", Message: "PodGC: node no longer exists",
		})
		_, err = pods.UpdateStatus(ctx, cur, metav1.UpdateOptions{})
		return err
	})
	if apierrors.IsNotFound(err) || errors.Is(err, errPodReplaced) {
		return
	}
	if err != nil {
		logf("pod %s/%s: PodGC status: %v", pod.Namespace, pod.Name, err)
	}
	if err := k.deletePod(pod.Namespace, pod.Name, pod.UID); err != nil {
		logf("pod %s/%s: PodGC delete: %v", pod.Namespace, pod.Name, err)
		return
	}
	logf("pod %s/%s: Failed (DisruptionTarget, DeletionByPodGC: %s), deleted", pod.Namespace, pod.Name, why)
}

// shellWords renders argv on one line, quoting the words that need it.
func shellWords(args []string) string {
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = a
		if a == "" || strings.ContainsAny(a, " \t\n\"'\\$`;|&<>()*?[]{}#~") {
			out[i] = strconv.Quote(a)
		}
	}
	return strings.Join(out, " ")
}
