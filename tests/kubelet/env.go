package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	v1 "k8s.io/api/core/v1"
)

// expand replaces $(VAR) in s as Kubernetes does: $$ is an escaped $, a reference to a variable
// that vars does not hold stays as written, and a $ that begins no reference is kept.
func expand(s string, vars map[string]string) string {
	var b strings.Builder
	checkpoint := 0
	for cur := 0; cur < len(s); cur++ {
		if s[cur] != '$' || cur+1 >= len(s) {
			continue
		}
		b.WriteString(s[checkpoint:cur])
		rest := s[cur+1:]
		advance := 1
		switch rest[0] {
		case '$':
			b.WriteByte('$')
		case '(':
			end := strings.IndexByte(rest, ')')
			if end < 0 {
				b.WriteString("$(")
				break
			}
			name := rest[1:end]
			if v, ok := vars[name]; ok {
				b.WriteString(v)
			} else {
				b.WriteString("$(" + name + ")")
			}
			advance = end + 1
		default:
			b.WriteString("$" + rest[:1])
		}
		cur += advance
		checkpoint = cur + 1
	}
	return b.String() + s[checkpoint:]
}

var subscripted = regexp.MustCompile(`^metadata\.(labels|annotations)\['(.+)'\]$`)

// fieldValue resolves a downward-API fieldRef path of an env var.
func fieldValue(pod *v1.Pod, path, podIP string) (string, error) {
	switch path {
	case "metadata.name":
		return pod.Name, nil
	case "metadata.namespace":
		return pod.Namespace, nil
	case "metadata.uid":
		return string(pod.UID), nil
	case "spec.nodeName":
		return pod.Spec.NodeName, nil
	case "spec.serviceAccountName":
		return pod.Spec.ServiceAccountName, nil
	case "status.podIP", "status.podIPs":
		return podIP, nil
	case "status.hostIP", "status.hostIPs":
		return hostIP, nil
	}
	if m := subscripted.FindStringSubmatch(path); m != nil {
		if m[1] == "labels" {
			return pod.Labels[m[2]], nil
		}
		return pod.Annotations[m[2]], nil
	}
	return "", fmt.Errorf("fieldRef %q is not supported by the test kubelet", path)
}

// containerEnv is the environment of a container's process ("K=V", PATH and HOME of this
// process first) and the variables its command and args may reference.
func containerEnv(pod *v1.Pod, c *v1.Container, podIP string) ([]string, map[string]string, error) {
	if len(c.EnvFrom) > 0 {
		return nil, nil, fmt.Errorf("container %q: envFrom is not supported by the test kubelet", c.Name)
	}
	vars := map[string]string{}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			vars[e.Name] = expand(e.Value, vars)
		case e.ValueFrom.FieldRef != nil:
			v, err := fieldValue(pod, e.ValueFrom.FieldRef.FieldPath, podIP)
			if err != nil {
				return nil, nil, fmt.Errorf("container %q, env %s: %v", c.Name, e.Name, err)
			}
			vars[e.Name] = v
		default:
			kind := "valueFrom"
			switch {
			case e.ValueFrom.SecretKeyRef != nil:
				kind = "secretKeyRef"
			case e.ValueFrom.ConfigMapKeyRef != nil:
				kind = "configMapKeyRef"
			case e.ValueFrom.ResourceFieldRef != nil:
				kind = "resourceFieldRef"
			}
			return nil, nil, fmt.Errorf("container %q, env %s: %s is not supported by the test kubelet", c.Name, e.Name, kind)
		}
	}
	base := map[string]string{"HOSTNAME": pod.Name}
	for _, k := range []string{"PATH", "HOME"} {
		if v, ok := os.LookupEnv(k); ok {
			base[k] = v
		}
	}
	for k, v := range vars {
		base[k] = v
	}
	env := make([]string, 0, len(base))
	for k, v := range base {
		env = append(env, k+"="+v)
	}
	sort.Strings(env)
	return env, vars, nil
}

// argv is a container's command and args, expanded.
func argv(c *v1.Container, vars map[string]string) []string {
	var out []string
	for _, s := range c.Command {
		out = append(out, expand(s, vars))
	}
	for _, s := range c.Args {
		out = append(out, expand(s, vars))
	}
	return out
}

// podError is why a pod cannot run here: its status reason and message.
type podError struct{ reason, message string }

func (e *podError) Error() string { return e.reason + ": " + e.message }

// validate checks that the test kubelet can run the pod as it asks.
func (k *kubelet) validate(pod *v1.Pod) *podError {
	volumes := map[string]*v1.Volume{}
	for i := range pod.Spec.Volumes {
		vol := &pod.Spec.Volumes[i]
		volumes[vol.Name] = vol
		if vol.HostPath == nil && vol.Secret == nil {
			return &podError{"UnsupportedVolume", fmt.Sprintf("volume %q is a %s volume: the test kubelet supports only hostPath volumes mounted at their own path and secret volumes", vol.Name, volumeKind(vol))}
		}
	}
	for _, c := range pod.Spec.InitContainers {
		if c.RestartPolicy != nil {
			return &podError{"UnsupportedInitContainer", fmt.Sprintf("init container %q has restartPolicy %s (a sidecar): not supported by the test kubelet", c.Name, *c.RestartPolicy)}
		}
	}
	for _, c := range allContainers(pod) {
		_, vars, err := containerEnv(pod, c, "0.0.0.0")
		if err != nil {
			return &podError{"UnsupportedEnv", err.Error()}
		}
		if len(c.Command) == 0 {
			return &podError{"UnknownCommand", fmt.Sprintf("container %q has no command: the test kubelet runs command[0] through a --binary mapping and cannot run the image's entrypoint", c.Name)}
		}
		if pe := k.checkBinary(c.Name, expand(c.Command[0], vars)); pe != nil {
			return pe
		}
		for _, m := range c.VolumeMounts {
			vol := volumes[m.Name]
			if vol == nil {
				return &podError{"UnsupportedVolume", fmt.Sprintf("container %q mounts volume %q, which the pod does not declare", c.Name, m.Name)}
			}
			if m.SubPath != "" || m.SubPathExpr != "" {
				return &podError{"UnsupportedVolume", fmt.Sprintf("container %q mounts volume %q with a subPath: not supported by the test kubelet", c.Name, m.Name)}
			}
			if vol.Secret != nil {
				if pe := checkSecretMount(c.Name, m); pe != nil {
					return pe
				}
				continue
			}
			if filepath.Clean(m.MountPath) != filepath.Clean(vol.HostPath.Path) {
				return &podError{"UnsupportedVolume", fmt.Sprintf("container %q mounts hostPath volume %q (%s) at %s: the test kubelet has no mount namespace and supports a hostPath only at its own path", c.Name, m.Name, vol.HostPath.Path, m.MountPath)}
			}
		}
		if len(c.VolumeDevices) > 0 {
			return &podError{"UnsupportedVolume", fmt.Sprintf("container %q has volumeDevices: not supported by the test kubelet", c.Name)}
		}
		if p := c.ReadinessProbe; p != nil {
			switch {
			case p.GRPC != nil:
				return &podError{"UnsupportedProbe", fmt.Sprintf("container %q: grpc readiness probes are not supported by the test kubelet", c.Name)}
			case p.Exec != nil:
				if len(p.Exec.Command) == 0 {
					return &podError{"UnsupportedProbe", fmt.Sprintf("container %q: exec readiness probe without a command", c.Name)}
				}
				if pe := k.checkBinary(c.Name+" (readiness probe)", p.Exec.Command[0]); pe != nil {
					return pe
				}
			case p.HTTPGet != nil:
				if _, err := probePort(c, p.HTTPGet.Port); err != nil {
					return &podError{"UnsupportedProbe", fmt.Sprintf("container %q: readiness probe: %v", c.Name, err)}
				}
			case p.TCPSocket != nil:
				if _, err := probePort(c, p.TCPSocket.Port); err != nil {
					return &podError{"UnsupportedProbe", fmt.Sprintf("container %q: readiness probe: %v", c.Name, err)}
				}
			}
		}
	}
	for _, vol := range pod.Spec.Volumes {
		if vol.HostPath == nil {
			continue
		}
		if err := prepareHostPath(vol.HostPath); err != nil {
			return &podError{"FailedMount", fmt.Sprintf("volume %q: %v", vol.Name, err)}
		}
	}
	return nil
}

func (k *kubelet) checkBinary(container, cmd string) *podError {
	path, ok := k.cfg.binaries[cmd]
	if !ok {
		var known []string
		for name := range k.cfg.binaries {
			known = append(known, name)
		}
		sort.Strings(known)
		return &podError{"UnknownCommand", fmt.Sprintf("container %s: command %q has no --binary mapping on this test kubelet (mapped: %s)", quoteName(container), cmd, strings.Join(known, ", "))}
	}
	if st, err := os.Stat(path); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
		return &podError{"BinaryNotFound", fmt.Sprintf("container %s: command %q maps to %s, which is not an executable file", quoteName(container), cmd, path)}
	}
	return nil
}

func quoteName(s string) string {
	if name, rest, ok := strings.Cut(s, " "); ok {
		return fmt.Sprintf("%q %s", name, rest)
	}
	return fmt.Sprintf("%q", s)
}

// prepareHostPath does what the kubelet does for a hostPath's type.
func prepareHostPath(h *v1.HostPathVolumeSource) error {
	t := v1.HostPathUnset
	if h.Type != nil {
		t = *h.Type
	}
	st, err := os.Stat(h.Path)
	switch t {
	case v1.HostPathUnset:
		return nil
	case v1.HostPathDirectoryOrCreate:
		if err != nil {
			return os.MkdirAll(h.Path, 0o755)
		}
		if !st.IsDir() {
			return fmt.Errorf("%s is not a directory", h.Path)
		}
		return nil
	case v1.HostPathFileOrCreate:
		if err != nil {
			if err := os.MkdirAll(filepath.Dir(h.Path), 0o755); err != nil {
				return err
			}
			f, err := os.OpenFile(h.Path, os.O_CREATE|os.O_WRONLY, 0o644)
			if err != nil {
				return err
			}
			return f.Close()
		}
		if st.IsDir() {
			return fmt.Errorf("%s is a directory", h.Path)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("hostPath type %s: %v", t, err)
	}
	ok := true
	switch t {
	case v1.HostPathDirectory:
		ok = st.IsDir()
	case v1.HostPathFile:
		ok = st.Mode().IsRegular()
	case v1.HostPathSocket:
		ok = st.Mode()&os.ModeSocket != 0
	case v1.HostPathCharDev:
		ok = st.Mode()&os.ModeCharDevice != 0
	case v1.HostPathBlockDev:
		ok = st.Mode()&os.ModeDevice != 0 && st.Mode()&os.ModeCharDevice == 0
	}
	if !ok {
		return fmt.Errorf("%s is not of hostPath type %s", h.Path, t)
	}
	return nil
}

func volumeKind(vol *v1.Volume) string {
	s := vol.VolumeSource
	switch {
	case s.EmptyDir != nil:
		return "emptyDir"
	case s.Secret != nil:
		return "secret"
	case s.ConfigMap != nil:
		return "configMap"
	case s.Projected != nil:
		return "projected"
	case s.PersistentVolumeClaim != nil:
		return "persistentVolumeClaim"
	case s.DownwardAPI != nil:
		return "downwardAPI"
	case s.Ephemeral != nil:
		return "ephemeral"
	case s.CSI != nil:
		return "csi"
	case s.Image != nil:
		return "image"
	case s.NFS != nil:
		return "nfs"
	}
	return "non-hostPath"
}

func allContainers(pod *v1.Pod) []*v1.Container {
	var out []*v1.Container
	for i := range pod.Spec.InitContainers {
		out = append(out, &pod.Spec.InitContainers[i])
	}
	for i := range pod.Spec.Containers {
		out = append(out, &pod.Spec.Containers[i])
	}
	return out
}
