// Command etcd is etcd's own server entry point, wrapped so it builds from a module download.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
