package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Secret volumes. The kubelet writes a Secret's keys into a directory of the pod
// (<log dir>/<namespace>_<pod>_volumes/<volume>) and each container that mounts it runs in a
// mount namespace of its own, where that directory is bind-mounted read-only over the
// mountPath. The mountPath must be an existing directory on this machine (the mount point);
// every pod sees its own Secret there, as in a cluster.

// mountFlag is the argument by which the kubelet re-executes itself as the step between the
// new mount namespace and the container's process: test-kubelet --mount-then-exec
// SRC=DST... -- PROGRAM ARGS...
const mountFlag = "--mount-then-exec"

// checkSecretMount is validate's rule for one mount of a Secret volume.
func checkSecretMount(container string, m v1.VolumeMount) *podError {
	st, err := os.Stat(m.MountPath)
	if err != nil || !st.IsDir() {
		return &podError{"UnsupportedVolume", fmt.Sprintf("container %q mounts secret volume %q at %s: the test kubelet bind-mounts it over an existing directory of this machine, and %s is not one", container, m.Name, m.MountPath, m.MountPath)}
	}
	return nil
}

// volumeDir is where the pod's volume `name` is written.
func (w *podWorker) volumeDir(name string) string {
	return filepath.Join(w.k.cfg.logDir, fmt.Sprintf("%s_%s_volumes", w.namespace, w.name), name)
}

// writeSecretVolumes writes every Secret volume of the pod (all keys, or the items named) with
// the volume's mode; a Secret that does not exist is FailedMount (a real kubelet would wait).
func (w *podWorker) writeSecretVolumes(ctx context.Context, pod *v1.Pod) *podError {
	for _, vol := range pod.Spec.Volumes {
		if vol.Secret == nil {
			continue
		}
		secret, err := w.k.cs.CoreV1().Secrets(pod.Namespace).Get(ctx, vol.Secret.SecretName, metav1.GetOptions{})
		if err != nil {
			return &podError{"FailedMount", fmt.Sprintf("volume %q: secret %s: %v", vol.Name, vol.Secret.SecretName, err)}
		}
		mode := os.FileMode(0o644)
		if vol.Secret.DefaultMode != nil {
			mode = os.FileMode(*vol.Secret.DefaultMode)
		}
		files := map[string][]byte{}
		if len(vol.Secret.Items) == 0 {
			for k, v := range secret.Data {
				files[k] = v
			}
		}
		for _, it := range vol.Secret.Items {
			v, ok := secret.Data[it.Key]
			if !ok {
				return &podError{"FailedMount", fmt.Sprintf("volume %q: secret %s has no key %s", vol.Name, secret.Name, it.Key)}
			}
			files[it.Path] = v
		}
		dir := w.volumeDir(vol.Name)
		if err := os.RemoveAll(dir); err != nil {
			return &podError{"FailedMount", err.Error()}
		}
		for path, data := range files {
			p := filepath.Join(dir, filepath.Clean("/"+path))
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				return &podError{"FailedMount", err.Error()}
			}
			if err := os.WriteFile(p, data, mode); err != nil {
				return &podError{"FailedMount", err.Error()}
			}
		}
	}
	return nil
}

// removeVolumes deletes what writeSecretVolumes wrote.
func (w *podWorker) removeVolumes() {
	_ = os.RemoveAll(filepath.Dir(w.volumeDir("x")))
}

// secretMounts are the SRC=DST pairs of a container's Secret mounts.
func (w *podWorker) secretMounts(pod *v1.Pod, c *v1.Container) []string {
	secret := map[string]bool{}
	for _, vol := range pod.Spec.Volumes {
		secret[vol.Name] = vol.Secret != nil
	}
	var out []string
	for _, m := range c.VolumeMounts {
		if secret[m.Name] {
			out = append(out, w.volumeDir(m.Name)+"="+m.MountPath)
		}
	}
	return out
}

// withMounts makes cmd run in a new mount namespace with `mounts` bind-mounted first: the
// kubelet's own binary (--mount-then-exec) runs there, mounts, and execs the real command.
func withMounts(cmd *exec.Cmd, mounts []string) error {
	if len(mounts) == 0 {
		return nil
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	args := append([]string{self, mountFlag}, mounts...)
	args = append(append(args, "--", cmd.Path), cmd.Args[1:]...)
	cmd.Path, cmd.Args = self, args
	// Go makes the new namespace's mounts private, so nothing here reaches the host's.
	cmd.SysProcAttr.Unshareflags |= syscall.CLONE_NEWNS
	return nil
}

// mountThenExec is the --mount-then-exec step: bind-mount each SRC=DST read-only, then exec
// the program after "--". Only returns on an error.
func mountThenExec(args []string) error {
	i := 0
	for ; i < len(args) && args[i] != "--"; i++ {
		src, dst, ok := strings.Cut(args[i], "=")
		if !ok {
			return fmt.Errorf("%s: %q is not SRC=DST", mountFlag, args[i])
		}
		if err := syscall.Mount(src, dst, "", syscall.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind-mounting %s on %s: %v", src, dst, err)
		}
		flags := uintptr(syscall.MS_BIND | syscall.MS_REMOUNT | syscall.MS_RDONLY)
		if err := syscall.Mount("", dst, "", flags, ""); err != nil {
			return fmt.Errorf("making %s read-only: %v", dst, err)
		}
	}
	if i+1 >= len(args) {
		return fmt.Errorf("%s: no program after --", mountFlag)
	}
	path, err := exec.LookPath(args[i+1])
	if err != nil {
		return err
	}
	return syscall.Exec(path, args[i+1:], os.Environ())
}
