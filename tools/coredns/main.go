// Command coredns is CoreDNS with only the plugins the lab's cluster DNS
// uses (the kube-dns Service the e2e suite's DNS specs query) and those the
// suite's own DNS server pods name in their Corefiles (hosts, forward: the
// agnhost image runs /coredns for them): no cloud provider plugins, so it
// builds from the Go module proxy in a minute.
package main

import (
	"github.com/coredns/coredns/coremain"

	// The plugins the lab's Corefile names (lab/coredns.go), and
	// the e2e suite's (test/e2e/network/dns_common.go, dns_configmap.go).
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/hosts"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
)

func main() {
	coremain.Run()
}
