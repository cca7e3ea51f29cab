package e2e

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/twill-net/twill/subnet"
	etcdsm "github.com/twill-net/twill/subnet/etcd"
)

// healthPort is where the fault tests' daemons serve /metrics and /readyz.
const healthPort = 10267

// TestRoguePublicIPs: leases whose PublicIP is loopback, multicast,
// broadcast or link-local are refused by every vxlan node, named in the
// log, counted in twill_leases_refused and by twillctl status, and never
// become a route, a neighbour or an FDB entry. With eight more leases the
// backend refuses (wrong VNI) and one claiming node2's address, all 13 are
// named, each with its reason, in the log and in twillctl status.
func TestRoguePublicIPs(t *testing.T) {
	beside(t)
	c := newCluster(t, 2)
	// The nodes take subnets below 10.244.200.0: the test's leases above
	// it never land on a node's own key (a random pick did, now and then).
	c.put("/twill.io/network/config", `{"Network":"10.244.0.0/16","SubnetMin":"10.244.1.0","SubnetMax":"10.244.199.0","Backend":{"Type":"vxlan"}}`)
	d := c.startDaemon(0, "--healthz-ip", "127.0.0.1", "--healthz-port", fmt.Sprint(healthPort))
	c.startDaemon(1)
	local := c.env(0)
	peer := c.env(1)
	rogue := map[string]string{
		"10.244.250.0": "127.0.0.1",
		"10.244.251.0": "224.0.0.1",
		"10.244.252.0": "255.255.255.255",
		"10.244.253.0": "169.254.10.10",
	}
	for sub, ip := range rogue {
		c.put("/twill.io/network/subnets/"+sub+"-24",
			`{"PublicIP":"`+ip+`","BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"0a:bb:00:00:00:01"}}`)
	}
	// Refused by the vxlan backend (another VNI), and one claiming node2's
	// address once node2 holds it.
	for i := range 8 {
		c.put(fmt.Sprintf("/twill.io/network/subnets/10.244.%d.0-24", 240+i),
			fmt.Sprintf(`{"PublicIP":"10.99.0.%d","BackendType":"vxlan","BackendData":{"VNI":7,"VtepMAC":"0a:bb:00:00:01:%02x"}}`, 60+i, i))
	}
	// Once failed, what each node saw: node2's route on node1 failed to
	// appear once in CI, with node1 never logging node2's lease.
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		var leases []string
		if r, err := c.cli.Get(context.Background(), "/twill.io/network/subnets/", clientv3.WithPrefix()); err == nil {
			for _, kv := range r.Kvs {
				leases = append(leases, fmt.Sprintf("%s (rev %d)", kv.Key, kv.ModRevision))
			}
		}
		t.Logf("node1's log:\n%s\nnode2's log:\n%s\nnode1's routes:\n%s\nleases in etcd: %v", d.Output(), c.daemons[1].Output(), c.routes(0), leases)
	})
	// A good peer arriving after them: once it is routed, the rogue ones
	// have been considered too.
	waitFor(t, 10*time.Second, "node2's route on node1", func() bool { return strings.Contains(c.routes(0), peer.Subnet.String()+" via") })
	c.put("/twill.io/network/subnets/10.244.254.0-24",
		`{"PublicIP":"10.99.0.50","BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"0a:bb:00:00:00:02"}}`)
	waitFor(t, 10*time.Second, "the witness lease's route", func() bool { return strings.Contains(c.routes(0), "10.244.254.0/24") })
	c.put("/twill.io/network/subnets/10.244.249.0-24",
		`{"PublicIP":"`+c.topo.Nodes[1].Addr.Addr().String()+`","BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"0a:bb:00:00:00:03"}}`)
	waitFor(t, 10*time.Second, "the lease on node2's address refused", func() bool {
		return strings.Contains(d.Output(), "public IP "+c.topo.Nodes[1].Addr.Addr().String()+" is held by")
	})

	ns := c.topo.Nodes[0].NS
	fdb, _ := exec.Command("bridge", "-n", ns, "fdb", "show", "dev", "twill.1").CombinedOutput()
	neigh, _ := exec.Command("ip", "-n", ns, "neigh", "show", "dev", "twill.1").CombinedOutput()
	routes := c.routes(0)
	for sub, ip := range rogue {
		if strings.Contains(routes, sub) {
			t.Errorf("route to the rogue lease %s (PublicIP %s):\n%s", sub, ip, routes)
		}
		if strings.Contains(string(fdb), "dst "+ip+" ") {
			t.Errorf("FDB entry towards %s:\n%s", ip, fdb)
		}
		if strings.Contains(string(neigh), sub+" ") {
			t.Errorf("neighbour for %s:\n%s", sub, neigh)
		}
	}
	log := d.Output()
	for _, want := range []string{"127.0.0.1 is a loopback address", "224.0.0.1 is a multicast address",
		"255.255.255.255 is the broadcast address", "169.254.10.10 is a link-local address"} {
		if strings.Count(log, want) != 1 {
			t.Errorf("node1's log names %q %d times, want once:\n%s", want, strings.Count(log, want), log)
		}
	}
	if got := metricIn(t, ns, healthPort, "twill_leases_refused"); got != "5" {
		t.Errorf("twill_leases_refused = %s, want 5 (4 rogue addresses, 1 on node2's)", got)
	}
	if got := metricIn(t, ns, healthPort, "twill_lease_conflicts_total"); got != "1" {
		t.Errorf("twill_lease_conflicts_total = %s, want 1", got)
	}
	out, _ := exec.Command("ip", "netns", "exec", ns, c.bin+"/twillctl", "status", "--etcd-endpoints", c.etcdURL,
		"--subnet-file", c.subnetFile(0), "--iface", "eth0").CombinedOutput()
	if !strings.Contains(string(out), "2 valid, 13 refused") || !strings.Contains(string(out), "224.0.0.1 is a multicast address") {
		t.Errorf("twillctl status on node1 (local %s):\n%s", local.Subnet, out)
	}
	// Every one of the 13, by subnet, in the log and in the status.
	for i := 240; i <= 253; i++ {
		if i == 248 {
			continue // no lease there
		}
		sub := fmt.Sprintf("10.244.%d.0/24", i)
		if !strings.Contains(log, sub) {
			t.Errorf("node1's log never names the refused lease %s", sub)
		}
		if !strings.Contains(string(out), sub) {
			t.Errorf("twillctl status does not name the refused lease %s", sub)
		}
	}
}

// TestSubnetEnvRewritten: subnet.env deleted or altered while twilld runs
// is written again, so new pods on the node do not fail until a restart.
func TestSubnetEnvRewritten(t *testing.T) {
	beside(t)
	c := newCluster(t, 1)
	c.put("/twill.io/network/config", netConfHostGW)
	c.startDaemon(0)
	c.env(0)
	want, err := os.ReadFile(c.subnetFile(0))
	if err != nil {
		t.Fatal(err)
	}
	same := func() bool {
		got, err := os.ReadFile(c.subnetFile(0))
		return err == nil && string(got) == string(want)
	}
	if err := os.Remove(c.subnetFile(0)); err != nil {
		t.Fatal(err)
	}
	took := waitFor(t, 20*time.Second, "subnet.env written again after it was deleted", same)
	t.Logf("deleted subnet.env back after %s", took.Round(time.Millisecond))
	if err := os.WriteFile(c.subnetFile(0), []byte("TWILL_MTU=9000\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	took = waitFor(t, 20*time.Second, "subnet.env written again after it was altered", same)
	t.Logf("altered subnet.env back after %s", took.Round(time.Millisecond))
	// And a pod can be wired again.
	c.addPod(0, "after")
}

// TestExternalInterfaceFlap: the node's underlay interface goes down and
// up (the kernel flushes the routes through it, announcing nothing), then
// is deleted and re-created with the same name (a new index); both times
// twilld reprograms everything and pods talk across nodes again.
func TestExternalInterfaceFlap(t *testing.T) {
	beside(t)
	for _, conf := range []struct{ name, netConf, route string }{
		{"host-gw", netConfHostGW, "via 10.99.0.2 dev eth0"},
		{"vxlan", netConfVXLAN, "dev twill.1"},
	} {
		t.Run(conf.name, func(t *testing.T) {
			c := newCluster(t, 2)
			c.put("/twill.io/network/config", conf.netConf)
			d := c.startDaemon(0)
			c.startDaemon(1)
			peer := c.env(1).Subnet
			routed := func() bool {
				for _, line := range strings.Split(c.routes(0), "\n") {
					if strings.HasPrefix(line, peer.String()+" ") && strings.Contains(line, conf.route) {
						return true
					}
				}
				return false
			}
			waitFor(t, 10*time.Second, "node1's route to node2", routed)
			podA, _ := c.addPod(0, "a")
			_, ipB := c.addPod(1, "b")
			if err := ping(podA, ipB); err != nil {
				t.Fatal(err)
			}
			ns := c.topo.Nodes[0].NS

			ipIn := func(nsName string, args ...string) {
				t.Helper()
				if out, err := exec.Command("ip", append([]string{"-n", nsName}, args...)...).CombinedOutput(); err != nil {
					t.Fatalf("ip -n %s %v: %v: %s", nsName, args, err, out)
				}
			}
			ipIn(ns, "link", "set", "eth0", "down")
			time.Sleep(500 * time.Millisecond)
			ipIn(ns, "link", "set", "eth0", "up")
			took := waitFor(t, 30*time.Second, "node1's routes back after eth0 went down and up", routed)
			t.Logf("routes back %s after eth0 came up", took.Round(time.Millisecond))
			waitFor(t, 30*time.Second, "pod traffic across nodes after the flap", func() bool { return ping(podA, ipB) == nil })

			// Its address removed and added back: the kernel drops the
			// routes through it; an address event that changes nothing
			// (as one ends up looking) must still bring them back.
			addr := c.topo.Nodes[0].Addr.String()
			ipIn(ns, "addr", "del", addr, "dev", "eth0")
			if conf.name == "host-gw" { // vxlan's routes go through twill.1, which stays
				waitFor(t, 10*time.Second, "node1's routes gone with its address", func() bool { return !routed() })
			}
			ipIn(ns, "addr", "add", addr, "dev", "eth0")
			took = waitFor(t, 30*time.Second, "node1's routes back after its address came back", routed)
			t.Logf("routes back %s after eth0's address came back", took.Round(time.Millisecond))
			waitFor(t, 30*time.Second, "pod traffic across nodes after the address came back", func() bool { return ping(podA, ipB) == nil })

			// Deleted and re-created with the same name and address: a
			// new index, the VTEP (if any) gone with it.
			ipIn(ns, "link", "del", "eth0")
			ipIn(ns, "link", "add", "eth0", "type", "veth", "peer", "name", "n1", "netns", c.topo.Underlay)
			ipIn(c.topo.Underlay, "link", "set", "n1", "master", "br0")
			ipIn(c.topo.Underlay, "link", "set", "n1", "up")
			ipIn(ns, "addr", "add", c.topo.Nodes[0].Addr.String(), "dev", "eth0")
			ipIn(ns, "link", "set", "eth0", "up")
			took = waitFor(t, 30*time.Second, "node1's routes back after eth0 was re-created", routed)
			t.Logf("routes back %s after eth0 was re-created", took.Round(time.Millisecond))
			waitFor(t, 30*time.Second, "pod traffic across nodes after eth0 was re-created", func() bool { return ping(podA, ipB) == nil })
			if done, err := d.Exited(); done {
				t.Fatalf("twilld exited: %v\n%s", err, d.Output())
			}
		})
	}
}

// TestEtcdOutage: etcd goes away for 30 s and comes back. Every twilld says
// once that it lost etcd and once that it has it again, /readyz and
// twill_subnet_manager_connected say so meanwhile, and a lease written the
// moment etcd is back reaches the other nodes' kernels within seconds (the
// target is 2 s; before, gRPC's default reconnect backoff made it 9-15 s).
func TestEtcdOutage(t *testing.T) {
	beside(t)
	c := newCluster(t, 2)
	// The nodes' subnets stay away from the test's own lease (10.244.77.0).
	c.put("/twill.io/network/config", `{"Network":"10.244.0.0/16","SubnetMin":"10.244.100.0","SubnetMax":"10.244.199.0","Backend":{"Type":"host-gw"}}`)
	d := c.startDaemon(0, "--healthz-ip", "127.0.0.1", "--healthz-port", fmt.Sprint(healthPort))
	c.startDaemon(1)
	peer := c.env(1).Subnet
	waitFor(t, 10*time.Second, "node1's route to node2", func() bool { return strings.Contains(c.routes(0), peer.String()) })
	ns := c.topo.Nodes[0].NS
	// Ready follows the routes once the iptables rules and subnet.env are
	// in place too.
	waitFor(t, 10*time.Second, "/readyz 200 before the outage", func() bool {
		code, _ := nodeGet(t, ns, healthPort, "/readyz")
		return code == 200
	})

	c.etcd.Stop(t)
	waitFor(t, 20*time.Second, "node1 to notice etcd is gone", func() bool {
		code, body := nodeGet(t, ns, healthPort, "/readyz")
		return code == 503 && strings.Contains(body, "etcd")
	})
	if got := metricIn(t, ns, healthPort, "twill_subnet_manager_connected"); got != "0" {
		t.Errorf("twill_subnet_manager_connected = %s during the outage, want 0", got)
	}
	time.Sleep(30 * time.Second)

	c.etcd = c.etcdRun()
	cli := newEtcdClient(t, c)
	back := time.Now()
	newLease := netip.MustParsePrefix("10.244.77.0/24")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, "/twill.io/network/subnets/10.244.77.0-24", `{"PublicIP":"10.99.0.77","BackendType":"host-gw"}`); err != nil {
		t.Fatal(err)
	}
	wrote := time.Since(back)
	// The bound is generous (a loaded machine); the log line gives the figure.
	routed := func() bool { return strings.Contains(c.routes(0), newLease.String()+" via 10.99.0.77") }
	deadline := time.Now().Add(8 * time.Second)
	for !routed() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if !routed() {
		t.Fatalf("the new lease was not routed on node1 within 8 s of etcd coming back (written %s after); node1's log:\n%s",
			wrote.Round(time.Millisecond), d.Output())
	}
	took := time.Since(back) - wrote
	t.Logf("lease written %s after etcd came back, routed on node1 %s later", wrote.Round(time.Millisecond), took.Round(time.Millisecond))
	waitFor(t, 10*time.Second, "/readyz ready again", func() bool { code, _ := nodeGet(t, ns, healthPort, "/readyz"); return code == 200 })
	log := d.Output()
	for _, want := range []string{"lost etcd", "reached etcd again"} {
		if n := strings.Count(log, want); n != 1 {
			t.Errorf("node1's log says %q %d times, want once:\n%s", want, n, log)
		}
	}
}

// newEtcdClient is a fresh client of the cluster's etcd (one made before an
// outage would reconnect on its own schedule).
func newEtcdClient(t *testing.T, c *cluster) *clientv3.Client {
	t.Helper()
	cli, err := etcdsm.NewClient(etcdsm.ClientOptions{Endpoints: []string{"unix://" + filepath.Join(c.dir, "etcd.sock")}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// TestLeakedAddressesReclaimed: a node's pool fills up; its pods' network
// namespaces then vanish without a CNI DEL (as a reboot or a runtime crash
// leaves them, and containerd 1.6 never calls GC). The next ADD succeeds at
// once: the plugin releases the allocations whose veth is gone. twilld
// does the same on its own, periodically.
func TestLeakedAddressesReclaimed(t *testing.T) {
	beside(t)
	c := newCluster(t, 1)
	c.put("/twill.io/network/config", `{"Network":"10.244.0.0/16","SubnetLen":28,"Backend":{"Type":"host-gw"}}`)
	store := filepath.Join(c.dir, c.topo.Nodes[0].Name, "networks", "pods")
	c.startDaemon(0, "--cni-network", "pods", "--cni-data-dir", filepath.Dir(store), "--reclaim-every", "1s",
		"--healthz-ip", "127.0.0.1", "--healthz-port", fmt.Sprint(healthPort))
	c.env(0)
	// A /28 holds 13 pod addresses (the first is the gateway's).
	fill := func(round string, n int) []string {
		var pods []string
		for i := range n {
			ns, _ := c.addPod(0, fmt.Sprintf("%s%d", round, i))
			pods = append(pods, ns)
		}
		return pods
	}
	// Pod namespaces gone without DEL, and their allocations aged past the
	// grace period (what a reboot leaves).
	veths := func() int {
		out, err := exec.Command("ip", "-n", c.topo.Nodes[0].NS, "-o", "link", "show", "type", "veth").CombinedOutput()
		if err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		return strings.Count(string(out), "\n")
	}
	vanish := func(pods []string) {
		before := veths()
		for _, ns := range pods {
			if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
				t.Fatalf("%v: %s", err, out)
			}
		}
		// The kernel tears a deleted namespace down later, in a work
		// queue: the pods are gone once their host veths are.
		waitFor(t, 30*time.Second, "the vanished pods' host veths to go", func() bool { return veths() <= before-len(pods) })
		old := time.Now().Add(-time.Minute)
		ents, _ := os.ReadDir(store)
		for _, e := range ents {
			_ = os.Chtimes(filepath.Join(store, e.Name()), old, old)
		}
	}
	countRecords := func() int {
		ents, _ := os.ReadDir(store)
		n := 0
		for _, e := range ents {
			if _, err := netip.ParseAddr(e.Name()); err == nil {
				n++
			}
		}
		return n
	}

	// The plugin, when the pool runs short. twilld's own pass must not do
	// it first: stop it while the pool is full.
	d := c.daemons[0]
	if err := d.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	pods := fill("a", 13)
	podNS := c.topo.Nodes[0].NS + "-full"
	if out, err := exec.Command("ip", "netns", "add", podNS).CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", podNS).Run() })
	if out := c.cni(0, "add", "full", podNS); !strings.Contains(out.Error, "no IP addresses available") {
		t.Fatalf("ADD with the pool full: %q, want no IP addresses available", out.Error)
	}
	vanish(pods)
	if out := c.cni(0, "add", "full", podNS); out.Error != "" {
		t.Fatalf("ADD after the pods vanished without DEL: %s", out.Error)
	}
	if n := countRecords(); n != 1 {
		t.Errorf("%d allocations after the reclaim, want 1 (the new pod's)", n)
	}
	if err := d.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}

	// twilld, periodically.
	pods = fill("b", 12) // the 13th address is the "full" pod's
	vanish(pods)
	waitFor(t, 30*time.Second, "twilld to release the vanished pods' addresses", func() bool { return countRecords() == 1 })
	if got := metricIn(t, c.topo.Nodes[0].NS, healthPort, "twill_addresses_reclaimed_total"); got != "12" {
		t.Errorf("twill_addresses_reclaimed_total = %s, want 12", got)
	}
	if !strings.Contains(d.Output(), "released addresses whose pods are gone") {
		t.Errorf("twilld did not log the release:\n%s", d.Output())
	}
}

// vtepMAC is the MAC of a node's VTEP device ("" while it has none).
func vtepMAC(t *testing.T, c *cluster, i int) string {
	t.Helper()
	out, err := exec.Command("ip", "-n", c.topo.Nodes[i].NS, "-o", "link", "show", "twill.1").CombinedOutput()
	if err != nil {
		return ""
	}
	f := strings.Fields(string(out))
	for j, w := range f {
		if w == "link/ether" {
			return f[j+1]
		}
	}
	return ""
}

// TestClonedVTEPMAC: nodes started from one machine image (the state
// directory, with the stored VTEP MAC, copied to every node) each use a MAC
// of their own. When another lease publishes a node's MAC all the same,
// the older lease keeps it: a younger copy is refused by every node, and a
// node whose lease is the younger takes a new MAC, publishes it, and pods
// talk across nodes again.
func TestClonedVTEPMAC(t *testing.T) {
	beside(t)
	c := newCluster(t, 3)
	// The nodes take subnets below 10.244.200.0: the test's leases above
	// it never land on a node's own key (node3 once held 10.244.250.0/24
	// and wrote its lease back over the test's).
	c.put("/twill.io/network/config", `{"Network":"10.244.0.0/16","SubnetMin":"10.244.1.0","SubnetMax":"10.244.199.0","Backend":{"Type":"vxlan"}}`)
	d1 := c.startDaemon(0)
	c.env(0)
	stored, err := os.ReadFile(filepath.Join(c.dir, "node1", "vxlan-1.mac"))
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"node2", "node3"} {
		if err := os.MkdirAll(filepath.Join(c.dir, n), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(c.dir, n, "vxlan-1.mac"), stored, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	c.startDaemon(1)
	c.startDaemon(2)
	for i := range 3 {
		c.env(i)
	}
	macs := map[string]int{}
	for i := range 3 {
		macs[vtepMAC(t, c, i)]++
	}
	if len(macs) != 3 {
		t.Fatalf("VTEP MACs with a copied state directory: %v; want three different", macs)
	}
	var ns []string
	var ips []netip.Addr
	for i := range 3 {
		p, ip := c.addPod(i, fmt.Sprintf("p%d", i))
		ns, ips = append(ns, p), append(ips, ip)
	}
	connected := func() bool {
		for i := range 3 {
			for j := range 3 {
				if i != j && ping(ns[i], ips[j]) != nil {
					return false
				}
			}
		}
		return true
	}
	waitFor(t, 20*time.Second, "pods on every pair of nodes talking", connected)

	// A lease written later, with a lower subnet than any node's, copies
	// node1's MAC: it is the younger (subnet.ClaimOrder), so every node
	// refuses it and node1 keeps its MAC. Of two more leases sharing a
	// MAC, the older keeps it.
	old := vtepMAC(t, c, 0)
	lease := func(sub, ip, mac string) {
		c.put("/twill.io/network/subnets/"+sub+"-24", fmt.Sprintf(`{"PublicIP":%q,"BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":%q}}`, ip, mac))
	}
	lease("10.244.0.0", "10.99.0.200", old)
	lease("10.244.250.0", "10.99.0.201", "0a:cc:00:00:00:01")
	lease("10.244.251.0", "10.99.0.202", "0a:cc:00:00:00:01")
	for i := range 3 {
		waitFor(t, 20*time.Second, fmt.Sprintf("node%d refusing the copies", i+1), func() bool {
			out := c.daemons[i].Output()
			return logNames(out, "10.244.0.0/24", "VTEP MAC "+old) && logNames(out, "10.244.251.0/24", "is 10.244.250.0/24's too")
		})
	}
	if got := vtepMAC(t, c, 0); got != old {
		t.Errorf("node1 changed its VTEP MAC from %s to %s for a younger copy", old, got)
	}
	for i := 1; i < 3; i++ {
		fdb, _ := exec.Command("bridge", "-n", c.topo.Nodes[i].NS, "fdb", "show", "dev", "twill.1").CombinedOutput()
		if !strings.Contains(string(fdb), old+" dst "+c.topo.Nodes[0].Addr.Addr().String()) || strings.Contains(string(fdb), "dst 10.99.0.200") {
			t.Errorf("node%d's FDB does not send node1's MAC to node1 alone:\n%s", i+1, fdb)
		}
		if !strings.Contains(string(fdb), "0a:cc:00:00:00:01 dst 10.99.0.201") || strings.Contains(string(fdb), "dst 10.99.0.202") {
			t.Errorf("node%d's FDB: want the older of two leases sharing a MAC, alone:\n%s", i+1, fdb)
		}
	}
	waitFor(t, 20*time.Second, "pods talking with the copies in etcd", connected)

	// node1's lease is created again (deleted while its twilld was down):
	// younger now than the copy of its MAC, node1 takes a new MAC,
	// publishes it, and its peers follow.
	c.daemons[0].Stop(t)
	c.del("/twill.io/network/subnets/" + subnet.SubnetKey(c.env(0).Subnet, netip.Prefix{}))
	d1 = c.startDaemon(0)
	waitFor(t, 20*time.Second, "node1 to take a new VTEP MAC", func() bool { m := vtepMAC(t, c, 0); return m != "" && m != old })
	renewed := vtepMAC(t, c, 0)
	if !strings.Contains(d1.Output(), "published by another node too") {
		t.Errorf("node1 did not say why it changed its MAC:\n%s", d1.Output())
	}
	waitFor(t, 20*time.Second, "node2 to follow node1's new MAC", func() bool {
		fdb, _ := exec.Command("bridge", "-n", c.topo.Nodes[1].NS, "fdb", "show", "dev", "twill.1").CombinedOutput()
		return strings.Contains(string(fdb), renewed+" dst "+c.topo.Nodes[0].Addr.Addr().String())
	})
	waitFor(t, 20*time.Second, "pods talking again after node1's new MAC", connected)
	// The new MAC is node1's from now on: a restart keeps it.
	c.daemons[0].Stop(t)
	c.startDaemon(0)
	waitFor(t, 20*time.Second, "node1 back", connected)
	if got := vtepMAC(t, c, 0); got != renewed {
		t.Errorf("node1's VTEP MAC after a restart %s, want %s (the one it chose)", got, renewed)
	}
}

// TestOversizedLeasesIgnored: a client with a node's etcd credentials
// writes 100 lease records of 1 MB each. twilld refuses them unparsed: its
// routes and FDB stay as they were, pods keep talking, the heap its last
// GC kept comes back within 16 MB of what it was (it keeps none of the
// 100 MB), also after a restart that reads them all in one listing; its
// log names 20 of them and counts the rest.
func TestOversizedLeasesIgnored(t *testing.T) {
	beside(t)
	c := newCluster(t, 2)
	c.put("/twill.io/network/config", `{"Network":"10.244.0.0/16","SubnetMin":"10.244.1.0","SubnetMax":"10.244.99.0","Backend":{"Type":"vxlan"}}`)
	d := c.startDaemon(0, "--healthz-ip", "127.0.0.1", "--healthz-port", fmt.Sprint(healthPort))
	c.startDaemon(1)
	ns := c.topo.Nodes[0].NS
	podA, _ := c.addPod(0, "oa")
	_, addrB := c.addPod(1, "ob")
	waitFor(t, 20*time.Second, "a pod on node1 reaching one on node2", func() bool { return ping(podA, addrB) == nil })
	fdb := func() string {
		out, _ := exec.Command("bridge", "-n", ns, "fdb", "show", "dev", "twill.1").CombinedOutput()
		return string(out)
	}
	routes, fdbBefore := c.routes(0), fdb()
	live := func() float64 {
		v, err := strconv.ParseFloat(metricIn(t, ns, healthPort, "go_gc_heap_live_bytes"), 64)
		if err != nil {
			t.Fatalf("go_gc_heap_live_bytes: %v", err)
		}
		return v
	}
	before := live()
	pad := strings.Repeat("x", 1<<20)
	for i := range 100 {
		c.put(fmt.Sprintf("/twill.io/network/subnets/10.244.%d.0-24", 100+i),
			fmt.Sprintf(`{"PublicIP":"10.99.0.%d","BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"0a:ee:00:00:00:%02x","pad":%q}}`, 100+i, i, pad))
	}
	check := func(when string) {
		t.Helper()
		waitFor(t, 60*time.Second, when+": node1 refusing the 100", func() bool { return metricIn(t, ns, healthPort, "twill_leases_refused") == "100" })
		if got := c.routes(0); got != routes {
			t.Errorf("%s: node1's routes changed:\n%s\nwere:\n%s", when, got, routes)
		}
		if got := fdb(); got != fdbBefore || strings.Contains(got, "0a:ee:") {
			t.Errorf("%s: node1's FDB changed:\n%s\nwas:\n%s", when, got, fdbBefore)
		}
		if err := ping(podA, addrB); err != nil {
			t.Errorf("%s: %v", when, err)
		}
		var kept float64
		waitFor(t, 60*time.Second, when+": node1's live heap back within 16 MB", func() bool {
			kept = live()
			return kept < before+16<<20
		})
		t.Logf("%s: live heap %.1f MB (%.1f MB before)", when, kept/(1<<20), before/(1<<20))
	}
	check("with the records written")
	if log := d.Output(); strings.Count(log, "a value of 1048") > 20 || !strings.Contains(log, "refusing more leases, not logged one by one") {
		t.Errorf("node1's log: want at most 20 refusals named, the rest counted:\n%s", tailString(log, 4000))
	}
	c.daemons[0].Stop(t)
	d = c.startDaemon(0, "--healthz-ip", "127.0.0.1", "--healthz-port", fmt.Sprint(healthPort))
	waitFor(t, 30*time.Second, "node1's twilld serving again", func() bool {
		resp, err := nodeClient(ns).Get(fmt.Sprintf("http://127.0.0.1:%d/readyz", healthPort))
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	check("after a restart that lists them") // against the first twilld's heap: the same binary, the same peers
	if log := d.OwnOutput(); strings.Count(log, "a value of 1048") != 20 || !strings.Contains(log, "more=80") {
		t.Errorf("node1's log after its restart: want 20 refusals named and 80 counted:\n%s", tailString(log, 4000))
	}
}
