package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os/exec"
	"strconv"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// probePort resolves a probe's port: a number, or the name of one of the container's ports.
func probePort(c *v1.Container, p intstr.IntOrString) (int, error) {
	if p.Type == intstr.Int {
		if p.IntVal <= 0 || p.IntVal > 65535 {
			return 0, fmt.Errorf("port %d is out of range", p.IntVal)
		}
		return int(p.IntVal), nil
	}
	for _, cp := range c.Ports {
		if cp.Name == p.StrVal {
			return int(cp.ContainerPort), nil
		}
	}
	if n, err := strconv.Atoi(p.StrVal); err == nil && n > 0 && n <= 65535 {
		return n, nil
	}
	return 0, fmt.Errorf("port %q is not a port number nor the name of a port of the container", p.StrVal)
}

var probeTransport = &http.Transport{
	Proxy:             nil, // never through $http_proxy: pod IPs are local
	DisableKeepAlives: true,
	TLSClientConfig:   &tls.Config{InsecureSkipVerify: true},
}

// probeOnce runs one readiness probe; it returns whether it passed and, if not, why.
func (w *podWorker) probeOnce(ctx context.Context, c *v1.Container, p *v1.Probe, podIP, netns string, env []string) (bool, string) {
	timeout := time.Duration(p.TimeoutSeconds) * time.Second
	if timeout <= 0 {
		timeout = time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	switch {
	case p.HTTPGet != nil:
		g := p.HTTPGet
		port, err := probePort(c, g.Port)
		if err != nil {
			return false, err.Error()
		}
		host := g.Host
		if host == "" {
			host = podIP
		}
		scheme := "http"
		if g.Scheme == v1.URISchemeHTTPS {
			scheme = "https"
		}
		u := &url.URL{Scheme: scheme, Host: net.JoinHostPort(host, strconv.Itoa(port))}
		path := g.Path
		if path == "" {
			path = "/"
		}
		ref, err := url.Parse(path)
		if err != nil {
			return false, err.Error()
		}
		u = u.ResolveReference(ref)
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
		if err != nil {
			return false, err.Error()
		}
		req.Header.Set("User-Agent", "kube-probe/1.34")
		for _, h := range g.HTTPHeaders {
			req.Header.Add(h.Name, h.Value)
		}
		resp, err := (&http.Client{Transport: probeTransport, Timeout: timeout}).Do(req)
		if err != nil {
			return false, err.Error()
		}
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 10240))
		resp.Body.Close()
		if resp.StatusCode < 200 || resp.StatusCode >= 400 {
			return false, fmt.Sprintf("GET %s: HTTP %d", u, resp.StatusCode)
		}
		return true, ""
	case p.TCPSocket != nil:
		port, err := probePort(c, p.TCPSocket.Port)
		if err != nil {
			return false, err.Error()
		}
		host := p.TCPSocket.Host
		if host == "" {
			host = podIP
		}
		conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", net.JoinHostPort(host, strconv.Itoa(port)))
		if err != nil {
			return false, err.Error()
		}
		conn.Close()
		return true, ""
	case p.Exec != nil:
		bin, ok := w.k.cfg.binaries[p.Exec.Command[0]]
		if !ok {
			return false, "no --binary mapping for " + p.Exec.Command[0]
		}
		args := append([]string{"netns", "exec", netns, bin}, p.Exec.Command[1:]...)
		cmd := exec.CommandContext(ctx, "ip", args...)
		cmd.Env = env
		if out, err := cmd.CombinedOutput(); err != nil {
			return false, fmt.Sprintf("%v: %s", err, out)
		}
		return true, ""
	}
	return true, ""
}

// probeLoop runs a container's readiness probe until ctx ends and reports each change of its
// readiness on w.probes.
func (w *podWorker) probeLoop(ctx context.Context, c *container, gen int, podIP, netns string, env []string) {
	p := c.spec.ReadinessProbe
	period := time.Duration(p.PeriodSeconds) * time.Second
	if period <= 0 {
		period = 10 * time.Second
	}
	succ, fail := int(p.SuccessThreshold), int(p.FailureThreshold)
	if succ <= 0 {
		succ = 1
	}
	if fail <= 0 {
		fail = 3
	}
	sleep := func(d time.Duration) bool {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
			return true
		}
	}
	if !sleep(time.Duration(p.InitialDelaySeconds) * time.Second) {
		return
	}
	ready, oks, bad := false, 0, 0
	for {
		ok, why := w.probeOnce(ctx, c.spec, p, podIP, netns, env)
		if ctx.Err() != nil {
			return
		}
		changed := false
		if ok {
			oks, bad = oks+1, 0
			if !ready && oks >= succ {
				ready, changed = true, true
			}
		} else {
			oks, bad = 0, bad+1
			if ready && bad >= fail {
				ready, changed = false, true
				logf("pod %s: container %s readiness probe failed %d times: %s", w.key, c.spec.Name, bad, why)
			}
		}
		if changed {
			select {
			case w.probes <- probeEvent{c: c, gen: gen, ready: ready}:
			case <-ctx.Done():
				return
			}
		}
		if !sleep(period) {
			return
		}
	}
}
