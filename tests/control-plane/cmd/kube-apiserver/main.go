// Command kube-apiserver is upstream's cmd/kube-apiserver, built from the
// published k8s.io/kubernetes module so tests can run a real API server.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() { os.Exit(cli.Run(app.NewAPIServerCommand())) }
