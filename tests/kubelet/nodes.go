package main

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/retry"
)

const gpuResource = v1.ResourceName("nvidia.com/gpu")

// managedNode is a node whose pods this kubelet runs.
type managedNode struct {
	name      string
	gpus      int
	auto      bool
	uid       types.UID
	created   time.Time
	idleSince time.Time
}

func (k *kubelet) nodeLabels(name string) map[string]string {
	l := map[string]string{"kubernetes.io/hostname": name}
	for key, v := range k.cfg.nodeLabels {
		l[key] = v
	}
	return l
}

func (k *kubelet) capacity(gpus int) v1.ResourceList {
	return v1.ResourceList{
		v1.ResourceCPU:    k.cfg.nodeCPU,
		v1.ResourceMemory: k.cfg.nodeMemory,
		v1.ResourcePods:   resource.MustParse("110"),
		gpuResource:       *resource.NewQuantity(int64(gpus), resource.DecimalSI),
	}
}

// nodeStatus sets what a kubelet reports of its node, heartbeat times now.
func (k *kubelet) nodeStatus(st *v1.NodeStatus, name string, gpus int) {
	st.Capacity, st.Allocatable = k.capacity(gpus), k.capacity(gpus)
	st.Addresses = []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: hostIP}, {Type: v1.NodeHostName, Address: name}}
	st.NodeInfo.KubeletVersion = "v1.34.4-test"
	st.NodeInfo.OperatingSystem, st.NodeInfo.Architecture = "linux", "amd64"
	st.NodeInfo.ContainerRuntimeVersion = "test://1"
	heartbeat(st)
}

// heartbeat sets the node's conditions (Ready, no pressure) with the heartbeat time now.
func heartbeat(st *v1.NodeStatus) {
	now := metav1.Now()
	want := []v1.NodeCondition{
		{Type: v1.NodeMemoryPressure, Status: v1.ConditionFalse, Reason: "KubeletHasSufficientMemory", Message: "kubelet has sufficient memory available"},
		{Type: v1.NodeDiskPressure, Status: v1.ConditionFalse, Reason: "KubeletHasNoDiskPressure", Message: "kubelet has no disk pressure"},
		{Type: v1.NodePIDPressure, Status: v1.ConditionFalse, Reason: "KubeletHasSufficientPID", Message: "kubelet has sufficient PID available"},
		{Type: v1.NodeReady, Status: v1.ConditionTrue, Reason: "KubeletReady", Message: "test-kubelet is posting ready status"},
	}
	for _, c := range want {
		c.LastHeartbeatTime, c.LastTransitionTime = now, now
		found := false
		for i := range st.Conditions {
			if old := &st.Conditions[i]; old.Type == c.Type {
				if old.Status == c.Status {
					c.LastTransitionTime = old.LastTransitionTime
				}
				*old, found = c, true
			}
		}
		if !found {
			st.Conditions = append(st.Conditions, c)
		}
	}
}

// registerNode creates (or takes over) node name, Ready, without the not-ready taint.
func (k *kubelet) registerNode(ctx context.Context, name string, gpus int) error {
	nodes := k.cs.CoreV1().Nodes()
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: k.nodeLabels(name)}}
	k.nodeStatus(&node.Status, name, gpus)
	created, err := nodes.Create(ctx, node, metav1.CreateOptions{})
	adopted := false
	if apierrors.IsAlreadyExists(err) {
		adopted = true
		err = retry.RetryOnConflict(retry.DefaultBackoff, func() error {
			cur, err := nodes.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if cur.Labels == nil {
				cur.Labels = map[string]string{}
			}
			for key, v := range k.nodeLabels(name) {
				cur.Labels[key] = v
			}
			created, err = nodes.Update(ctx, cur, metav1.UpdateOptions{})
			return err
		})
	}
	if err != nil {
		return err
	}
	if adopted || created.Status.Capacity == nil {
		err = retry.RetryOnConflict(retry.DefaultBackoff, func() error {
			cur, err := nodes.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			k.nodeStatus(&cur.Status, name, gpus)
			created, err = nodes.UpdateStatus(ctx, cur, metav1.UpdateOptions{})
			return err
		})
		if err != nil {
			return err
		}
	}
	k.mu.Lock()
	if n := k.nodes[name]; n != nil {
		n.uid, n.created = created.UID, time.Now()
	}
	k.mu.Unlock()
	// The API server's admission adds node.kubernetes.io/not-ready:NoSchedule to a new node; the
	// node lifecycle controller removes it once the node is Ready. There is none: do it here.
	err = retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		cur, err := nodes.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		var keep []v1.Taint
		for _, t := range cur.Spec.Taints {
			if t.Key != v1.TaintNodeNotReady && t.Key != v1.TaintNodeUnreachable {
				keep = append(keep, t)
			}
		}
		if len(keep) == len(cur.Spec.Taints) {
			return nil
		}
		cur.Spec.Taints = keep
		_, err = nodes.Update(ctx, cur, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("removing the not-ready taint: %v", err)
	}
	what := "registered"
	if adopted {
		what = "taken over (it existed)"
	}
	logf("node %s %s: %d GPUs, Ready", name, what, gpus)
	return nil
}

// heartbeat refreshes the conditions of every node every 10 s.
func (k *kubelet) heartbeat(ctx context.Context) {
	t := time.NewTicker(10 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		k.mu.Lock()
		var ns []managedNode
		for _, n := range k.nodes {
			if n.uid != "" {
				ns = append(ns, *n)
			}
		}
		k.mu.Unlock()
		for _, n := range ns {
			err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
				cur, err := k.cs.CoreV1().Nodes().Get(ctx, n.name, metav1.GetOptions{})
				if err != nil {
					return err
				}
				if cur.UID != n.uid {
					return nil
				}
				heartbeat(&cur.Status)
				_, err = k.cs.CoreV1().Nodes().UpdateStatus(ctx, cur, metav1.UpdateOptions{})
				return err
			})
			if err != nil && !apierrors.IsNotFound(err) && ctx.Err() == nil {
				logf("node %s: heartbeat: %v", n.name, err)
			}
		}
	}
}

// nodeDeleted: one of its nodes was deleted, a spot reclaim. Its pods' processes are killed and
// the pods get PodGC's treatment; the node is no longer managed.
func (k *kubelet) nodeDeleted(o any) {
	if t, ok := o.(cache.DeletedFinalStateUnknown); ok {
		o = t.Obj
	}
	node, ok := o.(*v1.Node)
	if !ok {
		return
	}
	k.mu.Lock()
	n := k.nodes[node.Name]
	if n == nil || (n.uid != "" && n.uid != node.UID) {
		k.mu.Unlock()
		return
	}
	delete(k.nodes, node.Name)
	k.reclaimed[node.Name] = true
	var workers []*podWorker
	for _, w := range k.workers {
		if w.node == node.Name {
			workers = append(workers, w)
		}
	}
	var orphans []*v1.Pod
	pods, _ := k.podLister.List(labels.Everything())
	for _, p := range pods {
		if p.Spec.NodeName == node.Name && k.workers[p.UID] == nil && !k.gced[p.UID] {
			k.gced[p.UID] = true
			orphans = append(orphans, p)
		}
	}
	k.mu.Unlock()
	grace := "at once"
	if k.cfg.reclaimGrace > 0 {
		grace = "after " + k.cfg.reclaimGrace.String()
	}
	logf("node %s deleted: reclaiming %d pods (processes killed %s)", node.Name, len(workers)+len(orphans), grace)
	for _, w := range workers {
		w.nodeReclaimed()
	}
	for _, p := range orphans {
		go k.podGC(p, "node "+node.Name+" no longer exists")
	}
}

// podRequests is what the scheduler counts for a pod: the larger of its containers' sum and
// each init container, plus the overhead.
func podRequests(pod *v1.Pod) v1.ResourceList {
	sum := v1.ResourceList{}
	for _, c := range pod.Spec.Containers {
		for name, q := range c.Resources.Requests {
			cur := sum[name]
			cur.Add(q)
			sum[name] = cur
		}
	}
	for _, c := range pod.Spec.InitContainers {
		for name, q := range c.Resources.Requests {
			if cur, ok := sum[name]; !ok || q.Cmp(cur) > 0 {
				sum[name] = q.DeepCopy()
			}
		}
	}
	for name, q := range pod.Spec.Overhead {
		cur := sum[name]
		cur.Add(q)
		sum[name] = cur
	}
	return sum
}

// fits reports whether requests fit in free, taking one pod slot.
func fits(requests, free v1.ResourceList) bool {
	if p, ok := free[v1.ResourcePods]; ok && p.Value() < 1 {
		return false
	}
	for name, q := range requests {
		if q.IsZero() {
			continue
		}
		f, ok := free[name]
		if !ok || q.Cmp(f) > 0 {
			return false
		}
	}
	return true
}

func take(free v1.ResourceList, requests v1.ResourceList) {
	for name, q := range requests {
		if f, ok := free[name]; ok {
			f.Sub(q)
			free[name] = f
		}
	}
	if p, ok := free[v1.ResourcePods]; ok {
		p.Sub(resource.MustParse("1"))
		free[v1.ResourcePods] = p
	}
}

func selectorMatches(pod *v1.Pod, nodeLabels map[string]string) bool {
	for key, v := range pod.Spec.NodeSelector {
		if nodeLabels[key] != v {
			return false
		}
	}
	return true
}

func terminal(p *v1.Pod) bool {
	return p.Status.Phase == v1.PodSucceeded || p.Status.Phase == v1.PodFailed
}

func unschedulable(p *v1.Pod) bool {
	if p.Spec.NodeName != "" || p.DeletionTimestamp != nil || len(p.Spec.SchedulingGates) > 0 || p.Status.Phase != v1.PodPending {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == v1.PodScheduled && c.Status == v1.ConditionFalse && c.Reason == v1.PodReasonUnschedulable {
			return true
		}
	}
	return false
}

// autoscale is the stand-in for a cluster autoscaler.
func (k *kubelet) autoscale(ctx context.Context) {
	tick := k.cfg.autoscaleDelay / 4
	if tick < 50*time.Millisecond {
		tick = 50 * time.Millisecond
	}
	if tick > time.Second {
		tick = time.Second
	}
	t := time.NewTicker(tick)
	defer t.Stop()
	var needSince, lastAdd time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := time.Now()
		need, nodeCount, idle := k.autoscaleState(now)
		if need == nil {
			needSince = time.Time{}
		} else if needSince.IsZero() {
			needSince = now
		}
		if need != nil && nodeCount < k.cfg.autoscaleMax && now.Sub(needSince) >= k.cfg.autoscaleDelay && now.Sub(lastAdd) >= k.cfg.autoscaleDelay {
			lastAdd, needSince = now, time.Time{}
			name := k.nextAutoName()
			k.mu.Lock()
			k.nodes[name] = &managedNode{name: name, gpus: k.cfg.autoscaleGPUs, auto: true, created: now}
			k.mu.Unlock()
			logf("autoscaler: pod %s/%s is unschedulable: adding node %s (%d GPUs, %d of at most %d nodes)", need.Namespace, need.Name, name, k.cfg.autoscaleGPUs, nodeCount+1, k.cfg.autoscaleMax)
			if err := k.registerNode(ctx, name, k.cfg.autoscaleGPUs); err != nil && ctx.Err() == nil {
				logf("autoscaler: adding node %s: %v", name, err)
				k.mu.Lock()
				delete(k.nodes, name)
				k.mu.Unlock()
			}
		}
		for _, name := range idle {
			k.scaleDown(ctx, name)
		}
	}
}

// autoscaleState returns a pod that needs a new node (nil if none), the number of nodes
// managed, and the autoscaled nodes idle for longer than --autoscale-idle.
func (k *kubelet) autoscaleState(now time.Time) (*v1.Pod, int, []string) {
	pods, _ := k.podLister.List(labels.Everything())
	k.mu.Lock()
	defer k.mu.Unlock()
	free := map[string]v1.ResourceList{}
	used := map[string]bool{}
	for name, n := range k.nodes {
		free[name] = k.capacity(n.gpus)
	}
	for _, p := range pods {
		if f := free[p.Spec.NodeName]; f != nil && !terminal(p) {
			take(f, podRequests(p))
			used[p.Spec.NodeName] = true
		}
	}
	var pending []*v1.Pod
	for _, p := range pods {
		if unschedulable(p) {
			pending = append(pending, p)
		}
	}
	sort.Slice(pending, func(i, j int) bool {
		return pending[i].CreationTimestamp.Before(&pending[j].CreationTimestamp)
	})
	names := make([]string, 0, len(k.nodes))
	for name := range k.nodes {
		names = append(names, name)
	}
	sort.Strings(names)
	var need *v1.Pod
	template := k.nodeLabels(fmt.Sprintf("auto-%d", k.autoSeq+1))
	for _, p := range pending {
		req := podRequests(p)
		placed := false
		// Pods that fit a node already there (or just added) wait for the scheduler.
		for _, name := range names {
			if selectorMatches(p, k.nodeLabels(name)) && fits(req, free[name]) {
				take(free[name], req)
				placed = true
				break
			}
		}
		if !placed && need == nil && selectorMatches(p, template) && fits(req, k.capacity(k.cfg.autoscaleGPUs)) {
			need = p
		}
	}
	var idle []string
	for name, n := range k.nodes {
		if !n.auto || k.cfg.autoscaleIdle <= 0 || n.uid == "" {
			continue
		}
		if used[name] {
			n.idleSince = time.Time{}
			continue
		}
		if n.idleSince.IsZero() {
			n.idleSince = now
		}
		if now.Sub(n.idleSince) >= k.cfg.autoscaleIdle {
			idle = append(idle, name)
		}
	}
	return need, len(k.nodes), idle
}

func (k *kubelet) nextAutoName() string {
	k.mu.Lock()
	defer k.mu.Unlock()
	for {
		k.autoSeq++
		name := "auto-" + strconv.Itoa(k.autoSeq)
		if _, err := k.nodeLister.Get(name); apierrors.IsNotFound(err) && k.nodes[name] == nil {
			return name
		}
	}
}

// scaleDown deletes an idle autoscaled node as a cluster autoscaler does: tainted
// ToBeDeletedByClusterAutoscaler first, so that nothing is scheduled there meanwhile.
func (k *kubelet) scaleDown(ctx context.Context, name string) {
	k.mu.Lock()
	n := k.nodes[name]
	if n == nil {
		k.mu.Unlock()
		return
	}
	uid, idleFor := n.uid, time.Since(n.idleSince).Round(time.Second)
	n.idleSince = time.Now() // not again at the next tick should this fail
	k.mu.Unlock()
	nodes := k.cs.CoreV1().Nodes()
	err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		cur, err := nodes.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, t := range cur.Spec.Taints {
			if t.Key == "ToBeDeletedByClusterAutoscaler" {
				return nil
			}
		}
		cur.Spec.Taints = append(cur.Spec.Taints, v1.Taint{
			Key: "ToBeDeletedByClusterAutoscaler", Value: strconv.FormatInt(time.Now().Unix(), 10), Effect: v1.TaintEffectNoSchedule,
		})
		_, err = nodes.Update(ctx, cur, metav1.UpdateOptions{})
		return err
	})
	if err == nil {
		err = nodes.Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
	}
	if err != nil && !apierrors.IsNotFound(err) {
		logf("autoscaler: scale-down of %s: %v", name, err)
		return
	}
	logf("autoscaler: node %s idle for %s: deleted", name, idleFor)
}
