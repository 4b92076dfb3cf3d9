// kube-scheduler: the upstream scheduler of the pinned Kubernetes release, unchanged. The test
// control plane runs it (tests/envtest/up --with-scheduler) so that pods are bound to nodes, and
// stay Pending, Unschedulable, where no node fits, as on a real cluster.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-scheduler/app"
)

func main() {
	os.Exit(cli.Run(app.NewSchedulerCommand()))
}
