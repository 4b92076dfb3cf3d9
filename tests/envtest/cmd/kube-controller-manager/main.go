// kube-controller-manager: the upstream controller manager of the pinned Kubernetes release,
// unchanged. The test control plane runs it (tests/envtest/up --with-controller-manager) with
// only the garbage collector, as a cluster does: objects whose owner is gone are deleted (a
// deleted pod's Kueue Workload, a deleted job's pods).
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-controller-manager/app"
)

func main() {
	os.Exit(cli.Run(app.NewControllerManagerCommand()))
}
