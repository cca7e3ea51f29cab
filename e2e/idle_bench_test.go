package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// BenchmarkIdleBesideFlanneld is idle CPU, twilld's beside flanneld's, in
// the same run and over the same window: one etcd holding N peer leases in
// flannel's format and prefix (twilld reads them as it does when it takes
// over a flannel cluster), flanneld on one node and twilld on the other,
// both with --ip-masq, for each backend, size and netfilter mode
// (net-conf.json's EnableNFTables, which both follow). Each daemon's CPU
// counts its threads and the children it ran (an exec'd iptables or nft).
func BenchmarkIdleBesideFlanneld(b *testing.B) {
	sizes, backends, modes := []int{1000, 5000}, []string{"host-gw", "vxlan"}, []string{"iptables", "nftables"}
	window := 15 * time.Second
	if benchSmoke() {
		sizes, backends, modes, window = sizes[:1], backends[:1], modes[:1], 3*time.Second
	}
	for _, backendType := range backends {
		for _, n := range sizes {
			for _, mode := range modes {
				b.Run(fmt.Sprintf("%s/peers=%d/%s", backendType, n, mode), func(b *testing.B) {
					for range b.N {
						idleBeside(b, backendType, n, mode, window)
					}
				})
			}
		}
	}
}

func idleBeside(b *testing.B, backendType string, n int, mode string, window time.Duration) {
	flanneld := flanneldBinary(b)
	c := newClusterOn(b, 2, netip.MustParsePrefix("192.168.0.0/16"))
	c.put(flannelPrefix+"/config", fmt.Sprintf(`{"Network":%q,"Backend":{"Type":%q},"EnableNFTables":%t}`,
		benchNetwork, backendType, mode == "nftables"))
	putFlannelLeases(b, c, backendType, n)
	fl := c.topo.Nodes[0]
	flEnv := filepath.Join(c.dir, fl.Name, "flannel-subnet.env")
	if err := os.MkdirAll(filepath.Dir(flEnv), 0o755); err != nil {
		b.Fatal(err)
	}
	f := start(b, fl.NS, filepath.Join(c.dir, fl.Name+"-flanneld.log"), flanneld,
		"--etcd-endpoints", c.etcdURL, "--etcd-prefix", flannelPrefix, "--iface", "eth0", "--subnet-file", flEnv, "--ip-masq")
	t := c.startDaemon(1, "--etcd-prefix", flannelPrefix, "--ip-masq", "--netfilter", mode)
	// Each sees the other's lease beside the n peers'.
	for i, p := range []*proc{f, t} {
		ns := c.topo.Nodes[i].NS
		waitFor(b, time.Duration(60+n/50)*time.Second, fmt.Sprintf("%d peer routes in %s", n+1, ns), func() bool {
			if done, err := p.Exited(); done {
				b.Fatalf("%s exited: %v\n%s", ns, err, tailString(p.Output(), 3000))
			}
			return peerRoutes(b, ns) >= n+1
		})
	}
	c.env(1)
	time.Sleep(2 * time.Second) // let the last events settle
	fl0, tw0 := cpuTimes(b, f.cmd.Process.Pid), cpuTimes(b, t.cmd.Process.Pid)
	time.Sleep(window)
	fl1, tw1 := cpuTimes(b, f.cmd.Process.Pid), cpuTimes(b, t.cmd.Process.Pid)
	pct := func(d time.Duration) float64 { return float64(d) / float64(window) * 100 }
	flOwn, flKids := pct(fl1.own-fl0.own), pct(fl1.children-fl0.children)
	twOwn, twKids := pct(tw1.own-tw0.own), pct(tw1.children-tw0.children)
	b.ReportMetric(twOwn+twKids, "twilld-idle-cpu-%")
	b.ReportMetric(flOwn+flKids, "flanneld-idle-cpu-%")
	b.Logf("%s, %d peers, %s mode, idle over %s: twilld %.3f%% of a core (%.3f%% its own, %.3f%% in children); flanneld %.3f%% (%.3f%% its own, %.3f%% in children)",
		backendType, n, mode, window, twOwn+twKids, twOwn, twKids, flOwn+flKids, flOwn, flKids)
}

// putFlannelLeases writes n peer leases as flanneld writes its own: under
// flannel's prefix, bound to an etcd lease (flanneld reads a lease's TTL
// and skips a key without one).
func putFlannelLeases(b testing.TB, c *cluster, backendType string, n int) {
	ctx := context.Background()
	grant, err := c.cli.Grant(ctx, 24*3600)
	if err != nil {
		b.Fatal(err)
	}
	putEach(b, c, n, func(i int) clientv3.Op {
		k, v, _ := benchLease(backendType, i)
		return clientv3.OpPut(flannelPrefix+strings.TrimPrefix(k, "/twill.io/network"), v, clientv3.WithLease(grant.ID))
	})
}

// peerRoutes counts the IPv4 routes into benchNetwork in namespace ns,
// whoever made them.
func peerRoutes(b testing.TB, ns string) int {
	out, err := exec.Command("ip", "-n", ns, "-4", "route", "show", "root", benchNetwork.String()).Output()
	if err != nil {
		b.Fatalf("ip route in %s: %v", ns, err)
	}
	return strings.Count(string(out), "\n")
}
