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
	"github.com/twill-net/twill/subnet"
)

const netConfVXLAN = `{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan"}}`

// routerCounter reads the packet count of an iptables rule in the router.
func routerCounter(t *testing.T, c *cluster, comment string) int {
	out, err := topology.Exec(c.topo.Router, "iptables", "-L", "FORWARD", "-v", "-n", "-x")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, comment) {
			var n int
			fmt.Sscan(strings.Fields(l)[0], &n)
			return n
		}
	}
	t.Fatalf("no router rule %q:\n%s", comment, out)
	return 0
}

// TestEtcdVXLANRouted: four nodes on two segments joined by a router that
// forwards only etcd and VXLAN; pods on every pair of nodes talk TCP.
func TestEtcdVXLANRouted(t *testing.T) {
	beside(t)
	c := newClusterWith(t, topology.Options{Nodes: 4, Underlay: netip.MustParsePrefix("10.99.0.0/24"), Routed: true})
	// The router drops everything but etcd and the VXLAN port: pod traffic
	// can only cross encapsulated.
	for _, rule := range [][]string{
		{"-P", "FORWARD", "DROP"},
		{"-A", "FORWARD", "-p", "tcp", "--dport", "2379", "-j", "ACCEPT"},
		{"-A", "FORWARD", "-p", "tcp", "--sport", "2379", "-j", "ACCEPT"},
		{"-A", "FORWARD", "-p", "udp", "--dport", "8472", "-m", "comment", "--comment", "vxlan", "-j", "ACCEPT"},
		{"-A", "FORWARD", "-m", "comment", "--comment", "dropped", "-j", "DROP"},
	} {
		if _, err := topology.Exec(c.topo.Router, "iptables", rule...); err != nil {
			t.Fatal(err)
		}
	}
	c.put("/twill.io/network/config", netConfVXLAN)
	for i := range c.topo.Nodes {
		c.startDaemon(i)
	}
	envs := make([]subnet.Env, 4)
	for i := range envs {
		envs[i] = c.env(i)
		if envs[i].MTU != 1450 || envs[i].Backend != "vxlan" {
			t.Fatalf("node%d subnet.env %+v: want vxlan, MTU 1450", i+1, envs[i])
		}
	}
	overlayReady := func() bool {
		for i := range 4 {
			for j := range 4 {
				if i != j && !strings.Contains(c.routes(i), fmt.Sprintf("%s via %s dev twill.1 proto 167", envs[j].Subnet, envs[j].Subnet.Addr())) {
					return false
				}
			}
		}
		return true
	}
	waitFor(t, 5*time.Second, "overlay routes on every node", overlayReady)

	pods := make([]string, 4)
	ips := make([]netip.Addr, 4)
	for i := range 4 {
		pods[i], ips[i] = c.addPod(i, fmt.Sprintf("p%d", i+1))
	}
	vxlanBefore := routerCounter(t, c, "vxlan")
	t.Run("TCP between pods on every pair of nodes", func(t *testing.T) {
		for i := range 4 {
			for j := range 4 {
				if i != j {
					c.tcp(pods[j], ips[j], pods[i])
				}
			}
		}
	})
	if routerCounter(t, c, "vxlan") == vxlanBefore {
		t.Fatal("no VXLAN packet crossed the router")
	}
	if n := routerCounter(t, c, "dropped"); n != 0 {
		t.Fatalf("the router dropped %d non-VXLAN packets: something bypassed the overlay", n)
	}

	t.Run("1400-byte payloads cross without fragmentation", func(t *testing.T) {
		// DF set: a 1400-byte ICMP payload (1428-byte packet) fits the pod
		// MTU of 1450 and the underlay after encapsulation.
		if out, err := exec.Command("ip", "netns", "exec", pods[0], "ping", "-c", "3", "-M", "do", "-s", "1400", "-W", "2", ips[1].String()).CombinedOutput(); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		before := reassemblies(t, c.topo.Nodes[1].NS)
		out := c.tcp(pods[1], ips[1], pods[0], "-l", "1400", "-n", "4M")
		if !strings.Contains(out, "receiver") {
			t.Fatalf("iperf3: %s", out)
		}
		if after := reassemblies(t, c.topo.Nodes[1].NS); after != before {
			t.Fatalf("the receiving node reassembled %d fragmented packets", after-before)
		}
	})

	t.Run("deleted VTEP comes back within 5s with the same MAC", func(t *testing.T) {
		n0 := c.topo.Nodes[0].NS
		mac := linkMAC(t, n0, "twill.1")
		if err := topology.IP(n0, "link", "del", "twill.1"); err != nil {
			t.Fatal(err)
		}
		took := waitFor(t, 5*time.Second, "twill.1 re-created with every peer", func() bool {
			routes := c.routes(0)
			for j := 1; j < 4; j++ {
				if !strings.Contains(routes, envs[j].Subnet.String()+" via") {
					return false
				}
			}
			fdb, _ := exec.Command("bridge", "-n", n0, "fdb", "show", "dev", "twill.1").CombinedOutput()
			neigh, _ := exec.Command("ip", "-n", n0, "neigh", "show", "dev", "twill.1").CombinedOutput()
			return strings.Count(string(fdb), "permanent") == 3 && strings.Count(string(neigh), "PERMANENT") == 3
		})
		t.Logf("recovered in %s", took.Round(time.Millisecond))
		if got := linkMAC(t, n0, "twill.1"); got != mac {
			t.Fatalf("MAC changed from %s to %s", mac, got)
		}
		c.tcp(pods[2], ips[2], pods[0])
	})

	t.Run("a neighbour and an FDB entry deleted by hand come back within 5s", func(t *testing.T) {
		// Alone (no route touched): without them node1's packets to node2's
		// pods go nowhere until something else makes twilld look.
		n0 := c.topo.Nodes[0].NS
		neigh := envs[1].Subnet.Addr().String()
		var mac string
		for _, l := range strings.Split(bridgeFDB(t, n0), "\n") {
			if strings.Contains(l, "dst "+c.topo.Nodes[1].Addr.Addr().String()+" ") {
				mac = strings.Fields(l)[0]
			}
		}
		if mac == "" {
			t.Fatalf("no FDB entry to node2:\n%s", bridgeFDB(t, n0))
		}
		for _, cmd := range [][]string{
			{"ip", "-n", n0, "neigh", "del", neigh, "dev", "twill.1"},
			{"bridge", "-n", n0, "fdb", "del", mac, "dev", "twill.1", "dst", c.topo.Nodes[1].Addr.Addr().String()},
		} {
			if out, err := exec.Command(cmd[0], cmd[1:]...).CombinedOutput(); err != nil {
				t.Fatalf("%v: %v: %s", cmd, err, out)
			}
		}
		took := waitFor(t, 5*time.Second, "node2's neighbour and FDB entry back on node1", func() bool {
			n, _ := exec.Command("ip", "-n", n0, "neigh", "show", "dev", "twill.1", neigh).CombinedOutput()
			return strings.Contains(string(n), "PERMANENT") && strings.Contains(bridgeFDB(t, n0), mac)
		})
		t.Logf("repaired in %s", took.Round(time.Millisecond))
		c.tcp(pods[1], ips[1], pods[0])
	})

	t.Run("a changed VTEP MAC leaves exactly one FDB entry", func(t *testing.T) {
		// Node 4 is rebuilt: its VTEP gets a new MAC (its state is wiped
		// and its NIC MAC changes), and it restarts.
		n3 := c.topo.Nodes[3]
		oldMAC := linkMAC(t, n3.NS, "twill.1")
		c.daemons[3].Stop(t)
		if err := os.RemoveAll(c.dir + "/" + n3.Name + "/vxlan-1.mac"); err != nil {
			t.Fatal(err)
		}
		for _, args := range [][]string{{"link", "del", "twill.1"}, {"link", "set", "eth0", "address", "02:aa:bb:cc:dd:04"}} {
			if err := topology.IP(n3.NS, args...); err != nil {
				t.Fatal(err)
			}
		}
		c.startDaemon(3)
		var newMAC string
		waitFor(t, 10*time.Second, "node4's new VTEP", func() bool {
			newMAC = linkMAC(t, n3.NS, "twill.1")
			return newMAC != "" && newMAC != oldMAC
		})
		pub := n3.Addr.Addr().String()
		waitFor(t, 5*time.Second, "peers learning node4's new MAC", func() bool {
			for i := range 3 {
				fdb, _ := exec.Command("bridge", "-n", c.topo.Nodes[i].NS, "fdb", "show", "dev", "twill.1").CombinedOutput()
				s := string(fdb)
				if strings.Count(s, "dst "+pub+" ") != 1 || !strings.Contains(s, newMAC) || strings.Contains(s, oldMAC) {
					return false
				}
			}
			return true
		})
		c.tcp(pods[3], ips[3], pods[0])
	})
}

func linkMAC(t *testing.T, ns, dev string) string {
	out, err := exec.Command("ip", "-n", ns, "-o", "link", "show", "dev", dev).CombinedOutput()
	if err != nil {
		return ""
	}
	f := strings.Fields(string(out))
	for i, w := range f {
		if w == "link/ether" && i+1 < len(f) {
			return f[i+1]
		}
	}
	return ""
}

// reassemblies is the namespace's IP reassembly request counter.
func reassemblies(t *testing.T, ns string) int {
	out, err := topology.Exec(ns, "cat", "/proc/net/snmp")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(out, "\n")
	for i := 0; i+1 < len(lines); i++ {
		if strings.HasPrefix(lines[i], "Ip: Forwarding") {
			names, vals := strings.Fields(lines[i]), strings.Fields(lines[i+1])
			for k, n := range names {
				if n == "ReasmReqds" && k < len(vals) {
					var v int
					fmt.Sscan(vals[k], &v)
					return v
				}
			}
		}
	}
	t.Fatal("no ReasmReqds in /proc/net/snmp")
	return 0
}

// txChecksum is the VTEP's transmit checksum offload as `ethtool -k` in
// node i shows it: "on" or "off".
func txChecksum(t *testing.T, c *cluster, i int) string {
	t.Helper()
	out, err := topology.Exec(c.topo.Nodes[i].NS, "ethtool", "-k", "twill.1")
	if err != nil {
		t.Fatalf("ethtool -k twill.1 in node%d: %v: %s", i+1, err, out)
	}
	for _, l := range strings.Split(out, "\n") {
		if f, ok := strings.CutPrefix(strings.TrimSpace(l), "tx-checksum-ip-generic: "); ok {
			return strings.Fields(f)[0]
		}
	}
	t.Fatalf("ethtool -k twill.1 in node%d has no tx-checksum-ip-generic:\n%s", i+1, out)
	return ""
}

// TestEtcdVXLANChecksumOffload: Backend.TXChecksumOffload "off", the
// workaround for kernels whose NAT corrupts offloaded vxlan checksums
// (flannel #1279), turns the offload off on every node's VTEP, pods still
// talk TCP and UDP across it with twilld masquerading, and when an operator turns
// it back on by hand twilld turns it off again. The default ("auto") on
// this machine's kernel (5.7 or later) leaves it on.
func TestEtcdVXLANChecksumOffload(t *testing.T) {
	beside(t)
	c := newCluster(t, 2)
	c.put("/twill.io/network/config", `{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan","TXChecksumOffload":"off"}}`)
	for i := range 2 {
		c.startDaemon(i, "--ip-masq")
	}
	envs := []subnet.Env{c.env(0), c.env(1)}
	waitFor(t, 10*time.Second, "overlay routes on both nodes", func() bool {
		return strings.Contains(c.routes(0), envs[1].Subnet.String()+" via") && strings.Contains(c.routes(1), envs[0].Subnet.String()+" via")
	})
	for i := range 2 {
		if got := txChecksum(t, c, i); got != "off" {
			t.Fatalf("node%d twill.1 tx-checksum-ip-generic %s, want off", i+1, got)
		}
	}
	p0, ip0 := c.addPod(0, "p1")
	p1, ip1 := c.addPod(1, "p2")
	c.tcp(p1, ip1, p0)
	c.tcp(p0, ip0, p1)
	c.udp(p1, ip1, p0)

	n0 := c.topo.Nodes[0].NS
	if out, err := topology.Exec(n0, "ethtool", "-K", "twill.1", "tx-checksum-ip-generic", "on"); err != nil {
		t.Fatalf("ethtool -K: %v: %s", err, out)
	}
	took := waitFor(t, 10*time.Second, "twilld turning node1's offload off again", func() bool { return txChecksum(t, c, 0) == "off" })
	t.Logf("set back in %s", took.Round(time.Millisecond))
	c.tcp(p1, ip1, p0)

	t.Run("auto leaves it on from kernel 5.7", func(t *testing.T) {
		c.put("/twill.io/network/config", netConfVXLAN)
		for i := range 2 {
			c.daemons[i].Stop(t)
			c.startDaemon(i, "--ip-masq")
		}
		waitFor(t, 10*time.Second, "twilld turning the offload back on", func() bool {
			return txChecksum(t, c, 0) == "on" && txChecksum(t, c, 1) == "on"
		})
		c.tcp(p1, ip1, p0)
	})
}
