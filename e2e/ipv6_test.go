package e2e

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/twill-net/twill/lab/topology"
)

// IPv6 across nodes: vxlan dual-stack over an IPv4 underlay, vxlan and
// host-gw IPv6-only over an IPv6 underlay. Each asserts TCP between pods
// on different nodes in every family the cluster has, and a ping with DF
// set at the pod MTU in each.

const (
	netConfVXLANDual   = `{"Network":"10.244.0.0/16","EnableIPv6":true,"IPv6Network":"fd00:10::/56","Backend":{"Type":"vxlan"}}`
	netConfVXLANV6Only = `{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"fd00:10::/56","Backend":{"Type":"vxlan"}}`
	netConfHostGWV6    = `{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"fd00:10::/56","Backend":{"Type":"host-gw"}}`
)

// addPodIPs wires pod name on node i and returns its namespace and its
// address of each family (invalid where it has none).
func (c *cluster) addPodIPs(i int, name string) (ns string, v4, v6 netip.Addr) {
	c.t.Helper()
	// On a node whose twilld has written subnet.env, as kubelet adds pods
	// once the node's network is ready: host-gw's routes to its peers come
	// before it, and a test that waited for those alone once added its pod
	// a few milliseconds too early (TestExternalInterfaceFlap, fresh
	// machine, 2026-11-29).
	c.env(i)
	podNS := fmt.Sprintf("%s-%s", c.topo.Nodes[i].NS, name)
	if out, err := exec.Command("ip", "netns", "add", podNS).CombinedOutput(); err != nil {
		c.t.Fatalf("ip netns add %s: %v: %s", podNS, err, out)
	}
	c.t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", podNS).Run() })
	out := c.cni(i, "add", name, podNS)
	if out.Error != "" {
		c.t.Fatalf("cni add %s on node%d: %s", name, i+1, out.Error)
	}
	var res struct {
		IPs []struct{ Address string } `json:"ips"`
	}
	if err := json.Unmarshal(out.Result, &res); err != nil || len(res.IPs) == 0 {
		c.t.Fatalf("cni add %s: result %s", name, out.Result)
	}
	for _, ip := range res.IPs {
		p, err := netip.ParsePrefix(ip.Address)
		if err != nil {
			c.t.Fatal(err)
		}
		if p.Addr().Is4() {
			v4 = p.Addr()
		} else {
			v6 = p.Addr()
		}
	}
	return podNS, v4, v6
}

// dfPing pings dst from ns with packets of exactly mtu bytes and DF set:
// they must cross without fragmentation. IPv6 may wait a moment for
// neighbour discovery, so it retries for a few seconds.
func dfPing(t *testing.T, ns string, dst netip.Addr, mtu int) {
	t.Helper()
	args := []string{"netns", "exec", ns, "ping", "-c", "2", "-i", "0.2", "-W", "2", "-M", "do", "-s", fmt.Sprint(mtu - 28), dst.String()}
	if dst.Is6() {
		args = []string{"netns", "exec", ns, "ping", "-6", "-c", "2", "-i", "0.2", "-W", "2", "-M", "do", "-s", fmt.Sprint(mtu - 48), dst.String()}
	}
	var out []byte
	var err error
	for range 10 {
		if out, err = exec.Command("ip", args...).CombinedOutput(); err == nil {
			return
		}
		time.Sleep(300 * time.Millisecond)
	}
	t.Fatalf("ping with DF at MTU %d from %s to %s: %v\n%s", mtu, ns, dst, err, out)
}

func (c *cluster) routes6(i int) string {
	out, err := exec.Command("ip", "-n", c.topo.Nodes[i].NS, "-6", "route", "show").CombinedOutput()
	if err != nil {
		c.t.Fatalf("ip -6 route in node%d: %v: %s", i+1, err, out)
	}
	return string(out)
}

func bridgeFDB(t *testing.T, ns string) string {
	out, err := exec.Command("bridge", "-n", ns, "fdb", "show", "dev", "twill.1").CombinedOutput()
	if err != nil {
		t.Fatalf("bridge fdb in %s: %v: %s", ns, err, out)
	}
	return string(out)
}

// podsTalk checks TCP both ways and a DF ping at the MTU between a pod on
// node1 and one on node2, in every family they have.
func (c *cluster) podsTalk(t *testing.T, mtu int, wantV4, wantV6 bool) {
	p1, a4, a6 := c.addPodIPs(0, "p1")
	p2, b4, b6 := c.addPodIPs(1, "p2")
	if a4.IsValid() != wantV4 || a6.IsValid() != wantV6 || b4.IsValid() != wantV4 || b6.IsValid() != wantV6 {
		t.Fatalf("pod addresses %v %v and %v %v: want IPv4 %v, IPv6 %v", a4, a6, b4, b6, wantV4, wantV6)
	}
	for _, pair := range [][2]netip.Addr{{a4, b4}, {a6, b6}} {
		if !pair[0].IsValid() {
			continue
		}
		family := "IPv6"
		if pair[0].Is4() {
			family = "IPv4"
		}
		t.Run(fmt.Sprintf("TCP and DF ping at MTU %d, %s", mtu, family), func(t *testing.T) {
			dfPing(t, p1, pair[1], mtu)
			dfPing(t, p2, pair[0], mtu)
			c.tcp(p2, pair[1], p1)
			c.tcp(p1, pair[0], p2)
		})
	}
}

// TestEtcdVXLANDualStack: vxlan carries IPv4 and IPv6 pods over an IPv4
// routed underlay (the nodes have no IPv6 address at all) on one VTEP.
func TestEtcdVXLANDualStack(t *testing.T) {
	beside(t)
	c := newClusterWith(t, topology.Options{Nodes: 2, Underlay: netip.MustParsePrefix("10.99.0.0/24"), Routed: true})
	c.put("/twill.io/network/config", netConfVXLANDual)
	c.startDaemon(0)
	c.startDaemon(1)
	e1, e2 := c.env(0), c.env(1)
	if e1.MTU != 1450 || !e1.IPv6Subnet.IsValid() || !e2.IPv6Subnet.IsValid() {
		t.Fatalf("subnet.env %+v: want MTU 1450 (IPv4 underlay) and an IPv6 subnet", e1)
	}
	want6 := fmt.Sprintf("%s via %s dev twill.1 proto 167 ", e2.IPv6Subnet, e2.IPv6Subnet.Addr())
	waitFor(t, 10*time.Second, "node2's IPv6 route on node1", func() bool { return strings.Contains(c.routes6(0), want6) })
	if fdb := bridgeFDB(t, c.topo.Nodes[0].NS); strings.Count(fdb, "dst ") != 1 || !strings.Contains(fdb, "dst "+c.topo.Nodes[1].Addr.Addr().String()) {
		t.Errorf("node1's FDB: want one entry, to node2's IPv4 address, for both families:\n%s", fdb)
	}
	c.podsTalk(t, 1450, true, true)
}

// TestEtcdVXLANIPv6Only: an IPv6-only cluster (EnableIPv4 false) over an
// IPv6-only routed underlay: pods talk, the v6 objects are repaired and
// reported like v4's, and a peer that leaves takes its objects with it.
func TestEtcdVXLANIPv6Only(t *testing.T) {
	beside(t)
	c := newClusterWith(t, topology.Options{Nodes: 2, UnderlayV6: netip.MustParsePrefix("fd99:0:0:1::/64"), Routed: true})
	c.put("/twill.io/network/config", netConfVXLANV6Only)
	d1 := c.startDaemon(0, "--resync", "2s")
	c.startDaemon(1)
	e1, e2 := c.env(0), c.env(1)
	if e1.MTU != 1430 || e1.Subnet.IsValid() || !e1.IPv6Subnet.IsValid() {
		t.Fatalf("subnet.env %+v: want MTU 1430 (IPv6 underlay) and an IPv6 subnet alone", e1)
	}
	ns1 := c.topo.Nodes[0].NS
	node2 := c.topo.Nodes[1].AddrV6.Addr().String()
	route := fmt.Sprintf("%s via %s dev twill.1 proto 167 ", e2.IPv6Subnet, e2.IPv6Subnet.Addr())
	fdbDst := "dst " + node2
	waitFor(t, 10*time.Second, "node2's IPv6 route on node1", func() bool { return strings.Contains(c.routes6(0), route) })
	if fdb := bridgeFDB(t, ns1); !strings.Contains(fdb, fdbDst) {
		t.Fatalf("node1's FDB has no entry to node2's IPv6 address:\n%s", fdb)
	}
	c.podsTalk(t, 1430, false, true)

	status := func() (string, error) {
		out, err := exec.Command("ip", "netns", "exec", ns1, c.bin+"/twillctl", "status", "--etcd-endpoints", c.etcdURL, "--iface", "eth0",
			"--subnet-file", c.subnetFile(0), "--state-dir", filepath.Dir(c.subnetFile(0))).CombinedOutput()
		return string(out), err
	}
	t.Run("a v6 route and FDB entry deleted by hand are reported, then repaired", func(t *testing.T) {
		if out, err := status(); err != nil || !strings.Contains(out, "in sync") {
			t.Fatalf("status before: %v\n%s", err, out)
		}
		pid := d1.cmd.Process.Pid
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		defer syscall.Kill(pid, syscall.SIGCONT)
		fdbLine := ""
		for _, l := range strings.Split(bridgeFDB(t, ns1), "\n") {
			if strings.Contains(l, fdbDst) {
				fdbLine = l
			}
		}
		mac := strings.Fields(fdbLine)[0]
		for _, cmd := range [][]string{
			{"ip", "-n", ns1, "-6", "route", "del", e2.IPv6Subnet.String()},
			{"bridge", "-n", ns1, "fdb", "del", mac, "dev", "twill.1", "dst", node2},
		} {
			if out, err := exec.Command(cmd[0], cmd[1:]...).CombinedOutput(); err != nil {
				t.Fatalf("%v: %v: %s", cmd, err, out)
			}
		}
		out, err := status()
		if err == nil || !strings.Contains(out, "missing  route "+e2.IPv6Subnet.String()) || !strings.Contains(out, "missing  fdb "+node2) {
			t.Fatalf("status with the v6 route and FDB entry deleted: %v\n%s", err, out)
		}
		if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 10*time.Second, "the v6 route and FDB entry back", func() bool {
			return strings.Contains(c.routes6(0), route) && strings.Contains(bridgeFDB(t, ns1), fdbDst)
		})
		waitFor(t, 5*time.Second, "status clean again", func() bool {
			out, err := status()
			return err == nil && strings.Contains(out, "in sync")
		})
	})
	t.Run("a peer that leaves takes its v6 route, neighbour and FDB entry", func(t *testing.T) {
		c.daemons[1].Stop(t)
		r, err := c.cli.Get(t.Context(), "/twill.io/network/subnets/", clientv3.WithPrefix())
		if err != nil {
			t.Fatal(err)
		}
		for _, kv := range r.Kvs {
			if strings.Contains(string(kv.Key), strings.ReplaceAll(e2.IPv6Subnet.String(), "/", "-")) {
				c.del(string(kv.Key))
			}
		}
		waitFor(t, 10*time.Second, "node2's objects gone from node1", func() bool {
			neigh, _ := exec.Command("ip", "-n", ns1, "-6", "neigh", "show", "dev", "twill.1").CombinedOutput()
			return !strings.Contains(c.routes6(0), e2.IPv6Subnet.String()) && !strings.Contains(bridgeFDB(t, ns1), fdbDst) &&
				!strings.Contains(string(neigh), e2.IPv6Subnet.Addr().String()+" ")
		})
	})
}

// TestEtcdHostGWIPv6Only: host-gw in an IPv6-only cluster on an IPv6-only
// flat underlay.
func TestEtcdHostGWIPv6Only(t *testing.T) {
	beside(t)
	c := newClusterWith(t, topology.Options{Nodes: 2, UnderlayV6: netip.MustParsePrefix("fd99::/64")})
	c.put("/twill.io/network/config", netConfHostGWV6)
	c.startDaemon(0)
	c.startDaemon(1)
	e1, e2 := c.env(0), c.env(1)
	if e1.MTU != 1500 || e1.Subnet.IsValid() || !e1.IPv6Subnet.IsValid() {
		t.Fatalf("subnet.env %+v: want MTU 1500 and an IPv6 subnet alone", e1)
	}
	want := fmt.Sprintf("%s via %s dev eth0 proto 167", e2.IPv6Subnet, c.topo.Nodes[1].AddrV6.Addr())
	waitFor(t, 10*time.Second, "node2's route on node1", func() bool { return strings.Contains(c.routes6(0), want) })
	c.podsTalk(t, 1500, false, true)
}

// TestNetfilterModesIPv6: in an IPv6-only cluster with --ip-masq, in each
// netfilter mode, a pod reaching a host outside the cluster network (the
// router, which has no route to pods) arrives with its node's IPv6
// address, and pod to pod keeps the pod's.
func TestNetfilterModesIPv6(t *testing.T) {
	beside(t)
	for _, mode := range []string{"iptables", "nftables"} {
		t.Run(mode, func(t *testing.T) {
			c := newClusterWith(t, topology.Options{Nodes: 2, UnderlayV6: netip.MustParsePrefix("fd99:0:0:1::/64"), Routed: true})
			c.put("/twill.io/network/config", netConfVXLANV6Only)
			for i := range 2 {
				c.startDaemon(i, "--ip-masq", "--netfilter", mode)
			}
			c.env(0)
			peer := c.env(1).IPv6Subnet
			waitFor(t, 10*time.Second, "the route to node2's pods", func() bool { return strings.Contains(c.routes6(0), peer.String()) })
			p1, _, ip1 := c.addPodIPs(0, "p1")
			p2, _, ip2 := c.addPodIPs(1, "p2")
			node1 := c.topo.Nodes[0].AddrV6.Addr()
			outside := netip.MustParseAddr("fd99:0:0:1::fd") // the router, on node1's segment
			var got netip.Addr
			for i := range 5 { // the pod's first packets wait for its gateway's address (DAD)
				var err error
				if got, err = sourceSeenTry(p1, c.topo.Router, outside, 8080+i, 2*time.Second); err == nil {
					break
				}
				t.Log(err)
			}
			if got != node1 {
				t.Errorf("pod %s → outside host %s arrived from %v, want node1's %s (masqueraded)", ip1, outside, got, node1)
			}
			if got := sourceSeen(t, p1, p2, ip2, 9081); got != ip1 {
				t.Errorf("pod %s → pod %s arrived from %s, want the pod's own address", ip1, ip2, got)
			}
			ipt, nft := nodeRules(t, c.topo.Nodes[0].NS)
			if mode == "iptables" && !contains(ipt, "-A TWILL-POSTRTG -s fd00:10::/56") {
				t.Errorf("iptables mode: no IPv6 masquerade rule:\n%s", ipt)
			}
			if mode == "nftables" && !contains(nft, "ip6 saddr fd00:10::/56", `comment "twill: from pods (ipv6)"`) {
				t.Errorf("nftables mode: no IPv6 rules:\n%s", nft)
			}
		})
	}
}
