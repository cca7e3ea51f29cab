package e2e

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/twill-net/twill/lab/topology"
	"github.com/twill-net/twill/testsupport/forge"
)

// TestEtcdForgedSources attacks as a pod with CAP_NET_RAW would: from
// inside an attacker pod's namespace, a raw socket sends UDP to a server
// pod with another pod's address as its source. For each backend, on two
// dual-stack nodes, in each family, with the attacker on the server's node
// and on the other, posing as a pod of either node: 0 of the forged
// datagrams reach the server (counted there), while the attacker's own
// (the same socket, its own address) and each posed-as pod's own do.
func TestEtcdForgedSources(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{"host-gw", "vxlan", "wireguard"} {
		t.Run(backend, func(t *testing.T) {
			beside(t)
			c := newClusterWith(t, topology.Options{Nodes: 2, Underlay: netip.MustParsePrefix("10.99.0.0/24"), UnderlayV6: netip.MustParsePrefix("fd99::/64")})
			if backend == "wireguard" {
				t.Cleanup(c.stopWireGuardDevices)
			}
			c.put("/twill.io/network/config", fmt.Sprintf(`{"Network":"10.244.0.0/16","EnableIPv6":true,"IPv6Network":"fd00:10::/56","Backend":{"Type":%q}}`, backend))
			for i := range c.topo.Nodes {
				c.startDaemon(i)
			}
			type pod struct {
				ns     string
				v4, v6 netip.Addr
			}
			add := func(node int, name string) pod {
				p := pod{}
				p.ns, p.v4, p.v6 = c.addPodIPs(node, name)
				if !p.v4.IsValid() || !p.v6.IsValid() {
					t.Fatalf("pod %s: addresses %v, %v: want one of each family", name, p.v4, p.v6)
				}
				return p
			}
			server := add(0, "srv")
			posed := []pod{add(0, "ok1"), add(1, "ok2")}
			attackers := []pod{add(0, "bad1"), add(1, "bad2")}
			const port = 8081
			got := countUDP(t, "/var/run/netns/"+server.ns, port)
			for _, f := range []struct {
				name string
				addr func(pod) netip.Addr
			}{{"IPv4", func(p pod) netip.Addr { return p.v4 }}, {"IPv6", func(p pod) netip.Addr { return p.v6 }}} {
				dst := netip.AddrPortFrom(f.addr(server), port)
				waitFor(t, 20*time.Second, f.name+": the attackers' own datagrams reaching the server", func() bool {
					for _, a := range attackers {
						if _, err := forge.UDP("/var/run/netns/"+a.ns, netip.AddrPortFrom(f.addr(a), 40000), dst, []byte("own"), 1); err != nil {
							t.Fatal(err)
						}
					}
					time.Sleep(100 * time.Millisecond)
					return got.Count(f.addr(attackers[0])) > 0 && got.Count(f.addr(attackers[1])) > 0
				})
				const each = 100
				for ai, a := range attackers {
					for pi, p := range posed {
						src := f.addr(p)
						before := got.Count(src)
						sendPaced(t, a.ns, netip.AddrPortFrom(src, 40001), dst, each)
						time.Sleep(300 * time.Millisecond)
						if n := got.Count(src) - before; n != 0 {
							t.Errorf("%s: %d of %d datagrams the attacker on node%d forged as the pod on node%d (%s) reached the server on node1", f.name, n, each, ai+1, pi+1, src)
						}
					}
				}
				// The controls: the same socket's datagrams from its own
				// address, and each posed-as pod's from its own.
				for _, p := range slices.Concat(attackers, posed) {
					before := got.Count(f.addr(p))
					sendPaced(t, p.ns, netip.AddrPortFrom(f.addr(p), 40002), dst, each)
					time.Sleep(300 * time.Millisecond)
					if n := got.Count(f.addr(p)) - before; n < each*9/10 {
						t.Errorf("%s: only %d of %d datagrams from %s's own address reached the server", f.name, n, each, f.addr(p))
					}
				}
			}
		})
	}
}

// sendPaced sends n datagrams from src to dst out of the pod namespace
// podNS through a raw socket, in bursts of 10 a millisecond apart: as fast
// as the userspace WireGuard device takes them without losing any.
func sendPaced(t *testing.T, podNS string, src, dst netip.AddrPort, n int) {
	t.Helper()
	for sent := 0; sent < n; sent += 10 {
		if _, err := forge.UDP("/var/run/netns/"+podNS, src, dst, []byte("datagram"), min(10, n-sent)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Millisecond)
	}
}

// countUDP counts what the pod at nsPath receives on port, over both
// families, until the test ends.
func countUDP(t *testing.T, nsPath string, port int) *forge.Counter {
	t.Helper()
	c, err := forge.Listen(nsPath, port)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}
