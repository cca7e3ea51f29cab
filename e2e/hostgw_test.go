package e2e

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twill-net/twill/lab/topology"
	"github.com/twill-net/twill/nl"
	"github.com/twill-net/twill/subnet"
)

// TestEtcdHostGW is the foundation's end-to-end check: three nodes on one
// bridge, a real etcd, the built twilld in each node.
func TestEtcdHostGW(t *testing.T) {
	beside(t)
	c := newCluster(t, 3)
	c.put("/twill.io/network/config", netConfHostGW)
	a, b := c.topo.Nodes[0], c.topo.Nodes[1]
	// Someone else's route in the same table; twill must never touch it.
	const foreign = "172.30.0.0/16 via 10.99.0.3 dev eth0 proto static"
	if err := topology.IP(a.NS, "route", "add", "172.30.0.0/16", "via", "10.99.0.3", "proto", "static"); err != nil {
		t.Fatal(err)
	}

	started := time.Now()
	for i := range c.topo.Nodes {
		c.startDaemon(i)
	}
	subnets := make([]netip.Prefix, 3)
	for i := range subnets {
		subnets[i] = c.env(i).Subnet
	}
	allRoutes := func() bool {
		for i := range c.topo.Nodes {
			table := c.routes(i)
			for j := range c.topo.Nodes {
				if i != j && !strings.Contains(table, c.hostgwRoute(j, subnets[j])) {
					return false
				}
			}
		}
		return true
	}
	waitFor(t, 5*time.Second, "every node routing to every peer subnet", allRoutes)
	t.Logf("all routes in place %s after starting the daemons", time.Since(started).Round(time.Millisecond))

	// A pod behind A, wired by the twill plugin, reaches one behind C,
	// and back.
	podANS, podAAddr := c.addPod(0, "pa")
	podCNS, podCAddr := c.addPod(2, "pc")
	if err := ping(podANS, podCAddr); err != nil {
		t.Fatal(err)
	}
	if err := ping(podCNS, podAAddr); err != nil {
		t.Fatal(err)
	}

	t.Run("route deleted by hand is repaired within 5s", func(t *testing.T) {
		if err := topology.IP(a.NS, "route", "del", subnets[1].String()); err != nil {
			t.Fatal(err)
		}
		took := waitFor(t, 5*time.Second, "repair of the deleted route", func() bool {
			return strings.Contains(c.routes(0), c.hostgwRoute(1, subnets[1]))
		})
		t.Logf("repaired in %s", took.Round(time.Millisecond))
	})

	t.Run("restart keeps subnet and routes", func(t *testing.T) {
		h, err := nl.Open(b.NS)
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close()
		// Sample B's twill routes throughout the restart: none may vanish.
		var minSeen atomic.Int64
		minSeen.Store(1 << 30)
		stop := make(chan struct{})
		sampled := make(chan int)
		go func() {
			n := 0
			for {
				select {
				case <-stop:
					sampled <- n
					return
				default:
				}
				rs, err := h.Routes(nl.FamilyV4, nl.RouteFilter{Protocol: nl.RouteProtocol})
				if err == nil {
					minSeen.Store(min(minSeen.Load(), int64(len(rs))))
					n++
				}
				time.Sleep(2 * time.Millisecond)
			}
		}()
		before := c.env(1)
		c.daemons[1].Stop(t)
		if done, err := c.daemons[1].Exited(); !done || err != nil {
			t.Fatalf("twilld did not exit cleanly on SIGTERM: %v", err)
		}
		if err := os.Remove(c.subnetFile(1)); err != nil { // prove the subnet comes from etcd, not the file
			t.Fatal(err)
		}
		c.startDaemon(1)
		after := c.env(1)
		waitFor(t, 5*time.Second, "B logging ready after restart", func() bool { return strings.Contains(c.daemons[1].OwnOutput(), "msg=ready") })
		close(stop)
		n := <-sampled
		if after.Subnet != before.Subnet {
			t.Fatalf("B's subnet changed across a restart: %s -> %s", before.Subnet, after.Subnet)
		}
		if got := minSeen.Load(); got < 2 {
			t.Fatalf("B had only %d twill routes at some point of its restart (of %d samples); want 2 throughout", got, n)
		}
		if !strings.Contains(c.routes(0), c.hostgwRoute(1, subnets[1])) {
			t.Fatal("A lost its route to B during B's restart")
		}
		if err := ping(podANS, podCAddr); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("deleting a lease removes its routes within 2s", func(t *testing.T) {
		key := "/twill.io/network/subnets/" + strings.Replace(subnets[2].String(), "/", "-", 1)
		c.del(key)
		took := waitFor(t, 2*time.Second, "A and B dropping C's route", func() bool {
			return !strings.Contains(c.routes(0), subnets[2].String()) && !strings.Contains(c.routes(1), subnets[2].String())
		})
		t.Logf("removed in %s", took.Round(time.Millisecond))
		// C's daemon stops: it must not go on using a subnet it lost.
		waitFor(t, 5*time.Second, "C's twilld exiting", func() bool { done, _ := c.daemons[2].Exited(); return done })
		if out := c.daemons[2].Output(); !strings.Contains(out, "lease was deleted") {
			t.Errorf("C's log does not say why it stopped:\n%s", out)
		}
	})

	if !strings.Contains(c.routes(0), foreign) {
		t.Fatalf("the foreign route changed; A's table:\n%s", c.routes(0))
	}
}

// TestEtcdBadInput feeds the daemon bad leases and configuration.
func TestEtcdBadInput(t *testing.T) {
	beside(t)
	c := newCluster(t, 2)
	c.put("/twill.io/network/config", `{"Network":"10.244.0.0/16","SubnetMin":"10.244.1.0","SubnetMax":"10.244.100.0","Backend":{"Type":"host-gw"}}`)
	c.startDaemon(0)
	local := c.env(0).Subnet
	bad := map[string]string{
		"10.250.1.0-24":   `{"PublicIP":"10.99.0.9","BackendType":"host-gw"}`, // outside Network
		"10.244.200.0-24": `{"PublicIP":"10.99.0.9"`,                          // does not parse
		strings.Replace(local.Masked().String(), "/24", "-25", 1): `{"PublicIP":"10.99.0.9","BackendType":"host-gw"}`, // overlaps local
		"10.244.201.0-24": `{"PublicIP":"10.99.0.9","BackendType":"vxlan","BackendData":{"VNI":1}}`, // other backend
	}
	for k, v := range bad {
		c.put("/twill.io/network/subnets/"+k, v)
	}
	c.put("/twill.io/network/subnets/10.244.202.0-24", `{"PublicIP":"10.99.0.9","BackendType":"host-gw"}`) // a good one, as a witness
	waitFor(t, 5*time.Second, "the good lease's route", func() bool { return strings.Contains(c.routes(0), "10.244.202.0/24 via 10.99.0.9") })
	waitFor(t, 5*time.Second, "a refusal logged for each bad lease", func() bool {
		return strings.Count(c.daemons[0].Output(), "refusing lease") >= len(bad)
	})
	table := c.routes(0)
	for _, s := range []string{"10.250.1.0", "10.244.200.0", "10.244.201.0", "/25"} {
		if strings.Contains(table, s) {
			t.Errorf("a route was programmed from a bad lease (%s):\n%s", s, table)
		}
	}
	log := c.daemons[0].Output()
	for _, want := range []string{"not a /24 inside Network 10.244.0.0/16", "decoding", "backend type \\\"vxlan\\\""} {
		if !strings.Contains(log, want) {
			t.Errorf("log lacks %q:\n%s", want, log)
		}
	}

	t.Run("exhausted range", func(t *testing.T) {
		c.put("/twill.io/network/config", `{"Network":"10.244.0.0/16","SubnetMin":"10.244.1.0","SubnetMax":"10.244.1.0","Backend":{"Type":"host-gw"}}`)
		c.put("/twill.io/network/subnets/10.244.1.0-24", `{"PublicIP":"10.99.0.77","BackendType":"host-gw"}`) // reserved for someone else
		p := c.startDaemon(1)
		waitFor(t, 10*time.Second, "twilld giving up", func() bool { done, _ := p.Exited(); return done })
		if _, err := p.Exited(); err == nil || !contains(p.Output(), "subnet range exhausted", "10.244.0.0/16") {
			t.Fatalf("exit %v; log:\n%s", err, p.Output())
		}
		if _, err := os.Stat(c.subnetFile(1)); err == nil {
			t.Fatal("subnet.env written without a lease")
		}
	})
	t.Run("malformed net-conf.json", func(t *testing.T) {
		for _, conf := range []struct{ json, want string }{
			{`{"Network":"10.244.0.0/16","Backend":{"Type":"host-gw"},"SubnetLenn":24}`, `unknown key "SubnetLenn"`},
			{`{"Network":"10.244.0.0/16","Backend":{"Type":"host-gw","VNI":1}}`, `unknown key "VNI"`},
			{`{"Network":"10.244.0.0/33"}`, `Network "10.244.0.0/33"`},
			{`{"Network":"10.244.0.0/16","Backend":{"Type":"nosuch"}}`, `Backend.Type "nosuch"`},
		} {
			c.put("/twill.io/network/config", conf.json)
			p := c.startDaemon(1)
			waitFor(t, 10*time.Second, "twilld refusing "+conf.json, func() bool { done, _ := p.Exited(); return done })
			if _, err := p.Exited(); err == nil || !strings.Contains(p.Output(), conf.want) {
				t.Errorf("config %s: exit %v; want an error containing %q; log:\n%s", conf.json, err, conf.want, p.Output())
			}
			_ = os.Truncate(p.Log, 0)
		}
		if strings.Contains(c.routes(1), "proto 167") {
			t.Fatalf("routes programmed from a refused configuration:\n%s", c.routes(1))
		}
	})
}

// TestCleanup checks that `twilld cleanup` leaves no trace of twill.
func TestCleanup(t *testing.T) {
	beside(t)
	c := newCluster(t, 2)
	c.put("/twill.io/network/config", netConfHostGW)
	c.startDaemon(0, "--ip-masq", "--netfilter", "iptables") // TestNetfilterModes cleans up nftables
	c.startDaemon(1)
	peer := c.env(1).Subnet
	c.env(0)
	waitFor(t, 5*time.Second, "route to the peer", func() bool { return strings.Contains(c.routes(0), peer.String()) })
	ns := c.topo.Nodes[0].NS
	rules, err := topology.Exec(ns, "iptables-save")
	if err != nil || !contains(rules, nl.ChainMasquerade, nl.ChainForward, "MASQUERADE") {
		t.Fatalf("twill's chains are not in place before cleanup (%v):\n%s", err, rules)
	}
	// cleanup waits for the node's twilld to stop (one still running
	// would put everything back): with a short --wait it gives up, saying
	// so and removing nothing; with the default one, started while twilld
	// runs, it goes on once twilld has stopped.
	cleanupArgs := []string{"cleanup", "--subnet-file", c.subnetFile(0), "--state-dir", filepath.Dir(c.subnetFile(0))}
	if out, err := topology.Exec(ns, c.bin+"/twilld", append(cleanupArgs, "--wait", "300ms")...); err == nil || !strings.Contains(out, "twilld still runs on this node") {
		t.Errorf("cleanup beside a running twilld, --wait 300ms: %v\n%s\nwant it to fail, saying twilld still runs", err, out)
	}
	if !strings.Contains(c.routes(0), peer.String()) || !strings.Contains(c.routes(0), "proto 167") {
		t.Fatalf("a cleanup that gave up removed routes:\n%s", c.routes(0))
	}
	type result struct {
		out string
		err error
	}
	cleaned := make(chan result, 1)
	go func() {
		out, err := topology.Exec(ns, c.bin+"/twilld", cleanupArgs...)
		cleaned <- result{out, err}
	}()
	time.Sleep(time.Second) // cleanup is waiting meanwhile: nothing may be gone
	select {
	case r := <-cleaned:
		t.Fatalf("cleanup ran while twilld did: %v\n%s", r.err, r.out)
	default:
	}
	c.daemons[0].Stop(t)
	select {
	case r := <-cleaned:
		if r.err != nil {
			t.Fatalf("cleanup: %v\n%s", r.err, r.out)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("cleanup still waiting 30 s after twilld stopped")
	}
	if strings.Contains(c.routes(0), "proto 167") {
		t.Errorf("twill routes left after cleanup:\n%s", c.routes(0))
	}
	rules, _ = topology.Exec(ns, "iptables-save")
	if strings.Contains(rules, "TWILL") {
		t.Errorf("twill iptables rules left after cleanup:\n%s", rules)
	}
	if _, err := os.Stat(c.subnetFile(0)); !os.IsNotExist(err) {
		t.Errorf("subnet.env left after cleanup (%v)", err)
	}

	// Taken out for good: cleanup --release-lease gives node2's subnet back,
	// and node1 drops its route to node2 at once, not when the lease expires.
	ns2 := c.topo.Nodes[1].NS
	c.daemons[1].Stop(t)
	if err := os.WriteFile(filepath.Join(c.dir, "node2", "vxlan-1.mac"), []byte("stale\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := topology.Exec(ns2, c.bin+"/twilld", "cleanup", "--release-lease", "--etcd-endpoints", c.etcdURL,
		"--subnet-file", c.subnetFile(1), "--state-dir", filepath.Join(c.dir, "node2")); err != nil {
		t.Fatalf("cleanup --release-lease: %v\n%s", err, out)
	}
	resp, err := c.cli.Get(context.Background(), "/twill.io/network/subnets/"+subnet.SubnetKey(peer, netip.Prefix{}))
	if err != nil || len(resp.Kvs) != 0 {
		t.Errorf("node2's lease still in etcd after cleanup --release-lease (%v)", err)
	}
	if _, err := os.Stat(filepath.Join(c.dir, "node2", "vxlan-1.mac")); !os.IsNotExist(err) {
		t.Errorf("the state file left after cleanup (%v)", err)
	}
	// node1's twilld, started again, must not route to the released node.
	d := c.startDaemon(0)
	waitFor(t, 20*time.Second, "node1's twilld ready again", func() bool { return strings.Contains(d.OwnOutput(), "msg=ready") })
	if strings.Contains(c.routes(0), peer.String()) {
		t.Errorf("node1 routes to the node that released its lease:\n%s", c.routes(0))
	}
}
