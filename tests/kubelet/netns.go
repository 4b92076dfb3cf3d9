package main

import (
	"bufio"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// podNet is the network of one pod: netns hk-<pid>-<n> holding eth0 (podIP/30), and the veth's
// host end hk<pid>v<n> (hostIP/30) in the root netns.
type podNet struct {
	ns, hostIf    string
	block         int
	hostIP, podIP net.IP
}

// netAlloc hands out /30 blocks of the pod CIDR and creates and removes pod networks.
type netAlloc struct {
	cidr *net.IPNet
	lock *os.File // flock of the default CIDR, held for the life of the process

	mu     sync.Mutex
	used   map[int]bool
	next   int
	seq    int
	blocks int
	live   map[string]*podNet // by netns name
}

var (
	nsName = regexp.MustCompile(`^hk-([0-9]+)-([0-9]+)$`)
	ifName = regexp.MustCompile(`^hk([0-9]+)v([0-9]+)$`)
)

func ip(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

func newNetAlloc(cidr string) (*netAlloc, error) {
	if _, err := exec.LookPath("ip"); err != nil {
		return nil, fmt.Errorf("iproute2's ip is needed: %v", err)
	}
	a := &netAlloc{used: map[int]bool{}, live: map[string]*podNet{}}
	if cidr != "" {
		_, n, err := net.ParseCIDR(cidr)
		if err != nil || n.IP.To4() == nil {
			return nil, fmt.Errorf("--pod-cidr %q: want an IPv4 CIDR", cidr)
		}
		a.cidr = n
	} else {
		n, f, err := pickCIDR()
		if err != nil {
			return nil, err
		}
		a.cidr, a.lock = n, f
	}
	ones, _ := a.cidr.Mask.Size()
	if ones > 30 {
		return nil, fmt.Errorf("--pod-cidr %s: too small (a /30 per pod)", a.cidr)
	}
	a.blocks = 1 << (30 - ones)
	// A packet to an address of the CIDR that no pod holds (a pod gone, its /30 route with it)
	// is refused here, never sent out through the default route.
	if err := ip("route", "replace", "unreachable", a.cidr.String(), "metric", strconv.Itoa(os.Getpid())); err != nil {
		return nil, err
	}
	return a, nil
}

// pickCIDR picks 10.X.0.0/16, X in 200..250, that no host address or route overlaps and that no
// other test-kubelet holds (an flock on /tmp/test-kubelet-cidr-10.X.lock, held until exit).
func pickCIDR() (*net.IPNet, *os.File, error) {
	used := hostNets()
	for _, x := range rand.Perm(51) {
		_, n, _ := net.ParseCIDR(fmt.Sprintf("10.%d.0.0/16", 200+x))
		clash := false
		for _, u := range used {
			if u.Contains(n.IP) || n.Contains(u.IP) {
				clash = true
				break
			}
		}
		if clash {
			continue
		}
		f, err := os.OpenFile(filepath.Join(os.TempDir(), fmt.Sprintf("test-kubelet-cidr-10.%d.lock", 200+x)), os.O_CREATE|os.O_RDWR, 0o644)
		if err != nil {
			return nil, nil, err
		}
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			f.Close()
			continue
		}
		return n, f, nil
	}
	return nil, nil, fmt.Errorf("no free /16 in 10.200-10.250.0.0 for pods: give --pod-cidr")
}

// hostNets lists the IPv4 networks of the host's addresses and routes (not the default route).
func hostNets() []*net.IPNet {
	var nets []*net.IPNet
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil {
				nets = append(nets, &net.IPNet{IP: n.IP.Mask(n.Mask), Mask: n.Mask})
			}
		}
	}
	f, err := os.Open("/proc/net/route")
	if err != nil {
		return nets
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Scan() // header
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 8 {
			continue
		}
		dst, err1 := hex.DecodeString(fields[1])
		mask, err2 := hex.DecodeString(fields[7])
		if err1 != nil || err2 != nil || len(dst) != 4 || len(mask) != 4 {
			continue
		}
		// /proc/net/route holds the addresses in host (little-endian) byte order.
		d, m := make(net.IP, 4), make(net.IPMask, 4)
		binary.BigEndian.PutUint32(d, binary.LittleEndian.Uint32(dst))
		binary.BigEndian.PutUint32(m, binary.LittleEndian.Uint32(mask))
		if ones, _ := m.Size(); ones == 0 {
			continue
		}
		nets = append(nets, &net.IPNet{IP: d, Mask: m})
	}
	return nets
}

func addIP(base net.IP, n int) net.IP {
	v := binary.BigEndian.Uint32(base.To4()) + uint32(n)
	out := make(net.IP, 4)
	binary.BigEndian.PutUint32(out, v)
	return out
}

// setup creates the network of a new pod.
func (a *netAlloc) setup() (*podNet, error) {
	a.mu.Lock()
	block := -1
	for i := 0; i < a.blocks; i++ {
		b := (a.next + i) % a.blocks
		if !a.used[b] {
			block = b
			break
		}
	}
	if block < 0 {
		a.mu.Unlock()
		return nil, fmt.Errorf("pod CIDR %s is exhausted", a.cidr)
	}
	a.used[block] = true
	a.next = block + 1
	a.seq++
	pid := os.Getpid()
	p := &podNet{
		ns:     fmt.Sprintf("hk-%d-%d", pid, a.seq),
		hostIf: fmt.Sprintf("hk%dv%d", pid, a.seq),
		block:  block,
		hostIP: addIP(a.cidr.IP, 4*block+1),
		podIP:  addIP(a.cidr.IP, 4*block+2),
	}
	a.live[p.ns] = p
	a.mu.Unlock()
	if len(p.hostIf) > 15 {
		a.teardown(p)
		return nil, fmt.Errorf("interface name %s is too long", p.hostIf)
	}
	steps := [][]string{
		{"netns", "add", p.ns},
		{"link", "add", p.hostIf, "type", "veth", "peer", "name", "eth0", "netns", p.ns},
		{"addr", "add", p.hostIP.String() + "/30", "dev", p.hostIf},
		{"link", "set", p.hostIf, "up"},
		{"-n", p.ns, "addr", "add", p.podIP.String() + "/30", "dev", "eth0"},
		{"-n", p.ns, "link", "set", "lo", "up"},
		{"-n", p.ns, "link", "set", "eth0", "up"},
		{"-n", p.ns, "route", "add", "default", "via", p.hostIP.String()},
	}
	for _, s := range steps {
		if err := ip(s...); err != nil {
			a.teardown(p)
			return nil, err
		}
	}
	return p, nil
}

// teardown removes a pod's network, killing any process left inside it.
func (a *netAlloc) teardown(p *podNet) {
	if p == nil {
		return
	}
	killNetnsPids(p.ns)
	_ = ip("link", "del", p.hostIf)
	_ = ip("netns", "del", p.ns)
	a.mu.Lock()
	delete(a.used, p.block)
	delete(a.live, p.ns)
	a.mu.Unlock()
}

// removeAll removes every pod network of this process (at exit).
func (a *netAlloc) removeAll() {
	a.mu.Lock()
	var ps []*podNet
	for _, p := range a.live {
		ps = append(ps, p)
	}
	a.mu.Unlock()
	for _, p := range ps {
		a.teardown(p)
	}
	// Anything with this process's prefix that the bookkeeping missed.
	removeMatching(func(pid int) bool { return pid == os.Getpid() })
	_ = ip("route", "del", "unreachable", a.cidr.String(), "metric", strconv.Itoa(os.Getpid()))
}

func killNetnsPids(ns string) {
	out, err := exec.Command("ip", "netns", "pids", ns).Output()
	if err != nil {
		return
	}
	for _, f := range strings.Fields(string(out)) {
		if pid, err := strconv.Atoi(f); err == nil && pid > 1 && pid != os.Getpid() {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// alive reports whether pid is a running test-kubelet (the program of this process).
func alive(pid int) bool {
	self, err1 := os.ReadFile("/proc/self/comm")
	comm, err2 := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	return err1 == nil && err2 == nil && string(self) == string(comm)
}

// removeLeftovers removes the netns and veths of test-kubelets that no longer run.
func removeLeftovers() {
	n := removeMatching(func(pid int) bool { return pid != os.Getpid() && !alive(pid) })
	if n > 0 {
		logf("removed %d network namespaces/interfaces left by test-kubelets that no longer run", n)
	}
}

// removeMatching removes the hk-<pid>-<n> netns and hk<pid>v<n> links whose pid matches.
func removeMatching(match func(pid int) bool) int {
	removed := 0
	if out, err := exec.Command("ip", "netns", "list").Output(); err == nil {
		for _, line := range strings.Split(string(out), "\n") {
			f := strings.Fields(line)
			if len(f) == 0 {
				continue
			}
			if m := nsName.FindStringSubmatch(f[0]); m != nil {
				if pid, _ := strconv.Atoi(m[1]); match(pid) {
					killNetnsPids(f[0])
					if ip("netns", "del", f[0]) == nil {
						removed++
					}
				}
			}
		}
	}
	removed += removeUnreachableRoutes(match)
	if ifs, err := net.Interfaces(); err == nil {
		for _, i := range ifs {
			if m := ifName.FindStringSubmatch(i.Name); m != nil {
				if pid, _ := strconv.Atoi(m[1]); match(pid) {
					if ip("link", "del", i.Name) == nil {
						removed++
					}
				}
			}
		}
	}
	return removed
}

// removeUnreachableRoutes removes the pod CIDRs' unreachable routes (metric: the pid of the
// test-kubelet that added it) whose pid matches.
func removeUnreachableRoutes(match func(pid int) bool) int {
	out, err := exec.Command("ip", "route", "show", "type", "unreachable").Output()
	if err != nil {
		return 0
	}
	removed := 0
	for _, line := range strings.Split(string(out), "\n") {
		// "unreachable 10.231.0.0/16 metric 1234"
		f := strings.Fields(line)
		if len(f) < 4 || f[0] != "unreachable" || f[2] != "metric" {
			continue
		}
		if pid, err := strconv.Atoi(f[3]); err == nil && match(pid) {
			if ip("route", "del", "unreachable", f[1], "metric", f[3]) == nil {
				removed++
			}
		}
	}
	return removed
}
