package e2e

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/twill-net/twill/lab/topology"
)

// TestEtcdHostGWDualStack: with EnableIPv6, every node gets an IPv4 and an
// IPv6 subnet, routes to both of each peer's, and pods wired by the plugin
// get an address of each family and reach each other over both.
func TestEtcdHostGWDualStack(t *testing.T) {
	beside(t)
	c := newClusterWith(t, topology.Options{Nodes: 2, Underlay: netip.MustParsePrefix("10.99.0.0/24"), UnderlayV6: netip.MustParsePrefix("fd99::/64")})
	c.put("/twill.io/network/config", `{"Network":"10.244.0.0/16","EnableIPv6":true,"IPv6Network":"fd00:10::/56","Backend":{"Type":"host-gw"}}`)
	for i := range c.topo.Nodes {
		c.startDaemon(i)
	}
	envs := []string{}
	for i := range 2 {
		e := c.env(i)
		if !e.IPv6Subnet.IsValid() || !netip.MustParsePrefix("fd00:10::/56").Contains(e.IPv6Subnet.Addr()) || e.IPv6Subnet.Bits() != 64 {
			t.Fatalf("node%d subnet.env has no IPv6 subnet in fd00:10::/56: %+v", i+1, e)
		}
		envs = append(envs, e.IPv6Subnet.String())
	}
	v6routes := func(i int) string {
		out, _ := exec.Command("ip", "-n", c.topo.Nodes[i].NS, "-6", "route", "show", "proto", "167").CombinedOutput()
		return string(out)
	}
	waitFor(t, 5*time.Second, "IPv6 routes to each peer", func() bool {
		return strings.Contains(v6routes(0), envs[1]+" via fd99::2 dev eth0") && strings.Contains(v6routes(1), envs[0]+" via fd99::1 dev eth0")
	})
	p1, _ := c.addPod(0, "d1")
	p2, ip2 := c.addPod(1, "d2")
	addrs := func(ns string) (v6 netip.Addr) {
		out, err := exec.Command("ip", "-n", ns, "-6", "-o", "addr", "show", "dev", "eth0", "scope", "global").CombinedOutput()
		if err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		f := strings.Fields(string(out))
		for i, w := range f {
			if w == "inet6" && i+1 < len(f) {
				return netip.MustParsePrefix(f[i+1]).Addr()
			}
		}
		t.Fatalf("pod %s has no global IPv6 address: %s", ns, out)
		return netip.Addr{}
	}
	v6a, v6b := addrs(p1), addrs(p2)
	for i, a := range []netip.Addr{v6a, v6b} {
		if !netip.MustParsePrefix(envs[i]).Contains(a) {
			t.Fatalf("pod on node%d got %s, outside its IPv6 subnet %s", i+1, a, envs[i])
		}
	}
	if err := ping(p1, ip2); err != nil {
		t.Fatal(err)
	}
	// The pod's first IPv6 packets may wait for the node's link-local
	// address to finish duplicate address detection; allow a few tries.
	var err error
	for range 10 {
		out, e := exec.Command("ip", "netns", "exec", p1, "ping", "-6", "-c", "2", "-i", "0.2", "-W", "2", v6b.String()).CombinedOutput()
		if e == nil {
			err = nil
			break
		}
		err = fmt.Errorf("ping -6 %s from %s: %w: %s", v6b, p1, e, out)
		time.Sleep(300 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	c.tcp(p2, v6b, p1)
}

// TestEtcdHostGWLateIPv6: a dual-stack host-gw node whose IPv6 address
// comes after twilld started (SLAAC or DHCPv6 late at boot). twilld waits
// for it, alive, not ready and saying why, with nothing written; once the
// address is there it takes its lease, its peers route its IPv6 pods
// through the new address, and pods talk over IPv6.
func TestEtcdHostGWLateIPv6(t *testing.T) {
	beside(t)
	c := newClusterWith(t, topology.Options{Nodes: 2, Underlay: netip.MustParsePrefix("10.99.0.0/24"), UnderlayV6: netip.MustParsePrefix("fd99::/64")})
	c.put("/twill.io/network/config", `{"Network":"10.244.0.0/16","EnableIPv6":true,"IPv6Network":"fd00:10::/56","Backend":{"Type":"host-gw"}}`)
	node2 := c.topo.Nodes[1]
	if out, err := exec.Command("ip", "-n", node2.NS, "-6", "addr", "del", node2.AddrV6.String(), "dev", "eth0").CombinedOutput(); err != nil {
		t.Fatalf("removing node2's IPv6 address: %v: %s", err, out)
	}
	c.startDaemon(0)
	d2 := c.startDaemon(1, "--healthz-port", "10263")
	e1 := c.env(0)
	waitFor(t, 20*time.Second, "node2's twilld to say it waits for its IPv6 address", func() bool {
		return strings.Contains(d2.Output(), "waiting for the external interface's address") &&
			strings.Contains(d2.Output(), "has no IPv6 address to publish")
	})
	if exited, err := d2.Exited(); exited {
		t.Fatalf("node2's twilld exited (%v) instead of waiting:\n%s", err, d2.Output())
	}
	if code, body := nodeGet(t, node2.NS, 10263, "/readyz"); code != 503 {
		t.Errorf("node2's /readyz while it waits: %d %q, want 503", code, body)
	}
	if code, _ := nodeGet(t, node2.NS, 10263, "/healthz"); code != 200 {
		t.Errorf("node2's /healthz while it waits: %d, want 200 (alive)", code)
	}
	if _, err := os.Stat(c.subnetFile(1)); !os.IsNotExist(err) {
		t.Errorf("node2 wrote subnet.env before it has its IPv6 address (%v)", err)
	}
	if out, err := exec.Command("ip", "-n", node2.NS, "-6", "addr", "add", node2.AddrV6.String(), "dev", "eth0", "nodad").CombinedOutput(); err != nil {
		t.Fatalf("adding node2's IPv6 address: %v: %s", err, out)
	}
	e2 := c.env(1)
	v6routes := func(i int) string {
		out, _ := exec.Command("ip", "-n", c.topo.Nodes[i].NS, "-6", "route", "show", "proto", "167").CombinedOutput()
		return string(out)
	}
	want1 := fmt.Sprintf("%s via %s dev eth0", e2.IPv6Subnet, node2.AddrV6.Addr())
	want2 := fmt.Sprintf("%s via %s dev eth0", e1.IPv6Subnet, c.topo.Nodes[0].AddrV6.Addr())
	waitFor(t, 30*time.Second, "IPv6 routes to each other's pods through the nodes' IPv6 addresses", func() bool {
		return strings.Contains(v6routes(0), want1) && strings.Contains(v6routes(1), want2)
	})
	c.podsTalk(t, 1500, true, true)
}
