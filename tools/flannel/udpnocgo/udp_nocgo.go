//go:build !cgo

// Package udp is twill's, not flannel's: build.sh lays this one file into
// flannel's pkg/backend/udp (go build -overlay), so that flanneld builds
// without cgo. Its udp backend's packet proxy is C, and these are the four
// functions its cgo file would have defined. With them flanneld shares
// every compiled package with the Kubernetes binaries in the Go build
// cache (tools/modalign) instead of compiling all of them again with cgo.
//
// The tests run flanneld's vxlan and host-gw backends only; this build's
// udp backend says it cannot forward and does nothing.
package udp

import (
	"fmt"
	"net"
	"os"

	"github.com/flannel-io/flannel/pkg/ip"
)

func runCProxy(_ *os.File, _ *net.UDPConn, _ *os.File, _ ip.IP4, _ int) {
	fmt.Fprintln(os.Stderr, "udp backend: this flanneld is built without cgo (twill's tools/flannel), so it has no packet proxy; use vxlan or host-gw")
}

func setRoute(_ *os.File, _ ip.IP4Net, _ ip.IP4, _ int) {}

func removeRoute(_ *os.File, _ ip.IP4Net) {}

func stopProxy(_ *os.File) {}
