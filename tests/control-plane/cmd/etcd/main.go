// Command etcd is upstream's etcd server, at the version k8s.io/kubernetes
// itself requires, so the API server and its storage agree.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
