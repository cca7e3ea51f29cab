package e2e

import (
	"fmt"
	"net/netip"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	enicni "github.com/twill-net/twill/backend/eni/cni"
	"github.com/twill-net/twill/lab/eni/sim"
	"github.com/twill-net/twill/lab/topology"
	"github.com/twill-net/twill/subnet"
)

// vpcCluster is a cluster on a simulated VPC: every node has eth0 (primary
// NIC) and eth1 (its ENI) on the fabric namespace, which routes what the
// sim provider assigns and drops spoofed sources.
type vpcCluster struct {
	*cluster
	state string
}

func newVPCCluster(t *testing.T, nodes, maxIPs int) *vpcCluster {
	t.Helper()
	state := filepath.Join(t.TempDir(), "vpc.json")
	c := newClusterWith(t, topology.Options{Nodes: nodes, Underlay: netip.MustParsePrefix("10.10.0.0/24"),
		VPC: &topology.VPCOptions{Space: netip.MustParsePrefix("10.10.0.0/16"), ENISubnet: netip.MustParsePrefix("10.10.1.0/24"),
			MaxIPsPerENI: maxIPs, StateFile: state}})
	c.daemon = "twilld-lab" // the shipped twilld does not link the simulated cloud
	return &vpcCluster{cluster: c, state: state}
}

func (v *vpcCluster) netConf(mode string, extra string) string {
	return fmt.Sprintf(`{"Network":"10.10.128.0/17","SubnetLen":24,"Backend":{"Type":"eni","Interface":"eth1","Mode":%q,"Provider":"sim","ProviderConfig":{"StateFile":%q}%s}}`,
		mode, v.state, extra)
}

// rules is `ip rule` of node i.
func (v *vpcCluster) rules(i int) string {
	out, err := exec.Command("ip", "-n", v.topo.Nodes[i].NS, "rule", "show").CombinedOutput()
	if err != nil {
		v.t.Fatalf("ip rule: %v: %s", err, out)
	}
	return string(out)
}

// fabricDrops is the fabric's count of packets dropped by the reverse-path
// filter: the simulated cloud's source/destination check.
func (v *vpcCluster) fabricDrops() int {
	out, err := exec.Command("ip", "netns", "exec", v.topo.Underlay, "cat", "/proc/net/netstat").CombinedOutput()
	if err != nil {
		v.t.Fatalf("fabric netstat: %v: %s", err, out)
	}
	lines := strings.Split(string(out), "\n")
	for i := 0; i+1 < len(lines); i += 2 {
		names, vals := strings.Fields(lines[i]), strings.Fields(lines[i+1])
		for j, n := range names {
			if n == "IPReversePathFilter" && j < len(vals) {
				x, _ := strconv.Atoi(vals[j])
				return x
			}
		}
	}
	v.t.Fatal("fabric: no IPReversePathFilter counter")
	return 0
}

// leftovers lists what the plugin made on node i that is still there.
func (v *vpcCluster) leftovers(i int) []string {
	var left []string
	for _, l := range strings.Split(v.rules(i), "\n") {
		if strings.HasPrefix(l, "512:") || strings.HasPrefix(l, "1536:") && !strings.Contains(l, v.topo.Nodes[i].ENIAddr.Addr().String()) {
			left = append(left, "rule "+l)
		}
	}
	for _, l := range strings.Split(v.routes(i), "\n") {
		if strings.Contains(l, "proto 168") {
			left = append(left, "route "+l)
		}
	}
	out, _ := exec.Command("ip", "-n", v.topo.Nodes[i].NS, "-o", "link", "show").CombinedOutput()
	for _, l := range strings.Split(string(out), "\n") {
		if f := strings.Fields(l); len(f) > 1 && strings.HasPrefix(f[1], "tw") {
			left = append(left, "link "+f[1])
		}
	}
	return left
}

type vpcPod struct {
	node int
	name string
	ns   string
	addr netip.Addr
}

func (v *vpcCluster) pod(node int, name string) vpcPod {
	ns, addr := v.addPod(node, name)
	return vpcPod{node, name, ns, addr}
}

func (v *vpcCluster) del(p vpcPod) {
	v.t.Helper()
	if out := v.cni(p.node, "del", p.name, p.ns); out.Error != "" {
		v.t.Fatalf("cni del %s: %s", p.name, out.Error)
	}
}

// connectivity: TCP between pods on every pair of nodes, between two pods
// of one node (the 512 rule's job), and from a node to a remote pod.
func (v *vpcCluster) connectivity(pods []vpcPod, sameNode vpcPod) {
	v.t.Helper()
	for i := range pods {
		a, b := pods[i], pods[(i+1)%len(pods)]
		v.tcp(b.ns, b.addr, a.ns)
	}
	v.tcp(sameNode.ns, sameNode.addr, pods[0].ns)
	if err := ping(v.topo.Nodes[0].NS, pods[1].addr); err != nil {
		v.t.Errorf("node1 to a pod on node2: %v", err)
	}
}

func TestENIPrefixMode(t *testing.T) {
	beside(t)
	v := newVPCCluster(t, 3, 10)
	v.put("/twill.io/network/config", v.netConf("prefix", ""))
	for i := range v.topo.Nodes {
		v.startDaemon(i)
	}
	leases := make([]netip.Prefix, 3)
	for i := range leases {
		env := v.env(i)
		leases[i] = env.Subnet
		if env.Extra[enicni.EnvMode] != "prefix" || env.Extra[enicni.EnvTable] != "100" {
			t.Fatalf("node%d subnet.env %+v: want TWILL_ENI_MODE=prefix, TWILL_ENI_TABLE=100", i+1, env)
		}
	}
	// The ENI table: the VPC subnet, the gateway, and each peer's
	// delegated prefix via the peer's ENI; main keeps no VPC subnet route.
	eniTable := func(i int) string {
		out, _ := exec.Command("ip", "-n", v.topo.Nodes[i].NS, "route", "show", "table", "100").CombinedOutput()
		return string(out)
	}
	waitFor(t, 10*time.Second, "ENI tables with every peer prefix", func() bool {
		for i := range v.topo.Nodes {
			table := eniTable(i)
			if !strings.Contains(table, "default via 10.10.1.254 dev eth1 proto 167") || !strings.Contains(table, "10.10.1.0/24 dev eth1 proto 167 scope link") {
				return false
			}
			for j := range v.topo.Nodes {
				if i != j && !strings.Contains(table, fmt.Sprintf("%s via %s dev eth1 proto 167", leases[j], v.topo.Nodes[j].ENIAddr.Addr())) {
					return false
				}
			}
		}
		return true
	})
	for i := range v.topo.Nodes {
		if strings.Contains(v.routes(i), "10.10.1.0/24") {
			t.Errorf("node%d main table still routes the VPC subnet:\n%s", i+1, v.routes(i))
		}
		if !strings.Contains(v.rules(i), fmt.Sprintf("1536:\tfrom %s lookup 100 proto 167", v.topo.Nodes[i].ENIAddr.Addr())) {
			t.Errorf("node%d lacks the rule for its ENI's address:\n%s", i+1, v.rules(i))
		}
	}
	// The cloud routes each lease prefix to its node's ENI.
	st, err := sim.Load(v.state)
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range st.ENIs {
		if len(e.Prefixes) != 1 || e.Prefixes[0] != leases[i] {
			t.Errorf("sim: ENI %s prefixes %v, want the lease %s", e.ID, e.Prefixes, leases[i])
		}
	}

	// node3 loses its lease and comes back with another: the cloud takes
	// the old prefix back from its ENI, and the peers route the new one.
	v.daemons[2].Stop(t)
	v.cluster.del(fmt.Sprintf("/twill.io/network/subnets/%s-24", leases[2].Addr()))
	// A subnet.env naming a free subnet steers the new lease (a restarting
	// node asks for the subnet recorded there).
	old := leases[2]
	next := netip.MustParsePrefix("10.10.250.0/24")
	for next == leases[0] || next == leases[1] || next == old {
		next = netip.PrefixFrom(next.Addr().Prev().Prev(), 24).Masked()
	}
	env := v.env(2)
	env.Subnet = next
	if err := subnet.WriteEnv(v.subnetFile(2), env); err != nil {
		t.Fatal(err)
	}
	v.startDaemon(2)
	leases[2] = next
	waitFor(t, 10*time.Second, "node3's new prefix on its ENI alone", func() bool {
		st, err := sim.Load(v.state)
		return err == nil && slices.Equal(st.ENIs[2].Prefixes, []netip.Prefix{leases[2]})
	})
	waitFor(t, 10*time.Second, "peers routing node3's new prefix", func() bool {
		want := fmt.Sprintf("%s via %s dev eth1 proto 167", leases[2], v.topo.Nodes[2].ENIAddr.Addr())
		return strings.Contains(eniTable(0), want) && strings.Contains(eniTable(1), want) && !strings.Contains(eniTable(0), old.String())
	})

	var pods []vpcPod
	for i := range v.topo.Nodes {
		p := v.pod(i, "a")
		if !leases[i].Contains(p.addr) {
			t.Fatalf("pod %s on node%d got %s, outside the node's prefix %s", p.name, i+1, p.addr, leases[i])
		}
		pods = append(pods, p)
	}
	b := v.pod(0, "b")
	v.connectivity(pods, b)

	// Break pod a's from-pod rule on node1: its traffic now leaves by the
	// primary NIC, and the fabric's source check drops it.
	a := pods[0]
	rule := []string{"from", a.addr.String(), "lookup", "100", "pref", "1536"}
	if err := topology.IP(v.topo.Nodes[0].NS, append([]string{"rule", "del"}, rule...)...); err != nil {
		t.Fatal(err)
	}
	before := v.fabricDrops()
	if err := ping(a.ns, pods[1].addr); err == nil {
		t.Error("a pod without its from-pod rule still reached another node")
	}
	if after := v.fabricDrops(); after <= before {
		t.Errorf("fabric source-check drops %d → %d: the packets did not die at the fabric", before, after)
	}
	if out := v.cni(0, "check", a.name, a.ns); !strings.Contains(out.Error, "from "+a.addr.String()+"/32 lookup 100") {
		t.Errorf("CHECK with the rule missing: %q; want it named", out.Error)
	}
	if err := topology.IP(v.topo.Nodes[0].NS, append(append([]string{"rule", "add"}, rule...), "proto", "168")...); err != nil {
		t.Fatal(err)
	}
	if err := ping(a.ns, pods[1].addr); err != nil {
		t.Errorf("after restoring the rule: %v", err)
	}
	if out := v.cni(0, "check", a.name, a.ns); out.Error != "" {
		t.Errorf("CHECK after restoring: %s", out.Error)
	}

	// DEL of every pod leaves nothing behind.
	for _, p := range append(pods, b) {
		v.del(p)
	}
	for i := range v.topo.Nodes {
		if left := v.leftovers(i); len(left) > 0 {
			t.Errorf("node%d after DEL of every pod: %v", i+1, left)
		}
	}

	// Kill node1's daemon, then delete its pod: DEL still cleans up.
	c := v.pod(0, "c")
	if err := v.daemons[0].cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "node1's twilld gone", func() bool { done, _ := v.daemons[0].Exited(); return done })
	v.del(c)
	if left := v.leftovers(0); len(left) > 0 {
		t.Errorf("node1 after DEL with the daemon killed: %v", left)
	}

	// twilld cleanup undoes the node setup: the ENI table, the ENI's rule,
	// and the VPC subnet's route in main comes back.
	if out, err := exec.Command("ip", "netns", "exec", v.topo.Nodes[0].NS, v.bin+"/"+v.daemon, "cleanup", "--subnet-file", v.subnetFile(0)).CombinedOutput(); err != nil {
		t.Fatalf("twilld cleanup: %v\n%s", err, out)
	}
	if strings.Contains(v.rules(0), "proto 167") || strings.TrimSpace(eniTable(0)) != "" {
		t.Errorf("after cleanup: rules\n%s\ntable 100:\n%s", v.rules(0), eniTable(0))
	}
	if !strings.Contains(v.routes(0), "10.10.1.0/24 dev eth1 proto kernel scope link src "+v.topo.Nodes[0].ENIAddr.Addr().String()) {
		t.Errorf("after cleanup the VPC subnet's route is not back in main:\n%s", v.routes(0))
	}
}

func TestENISecondaryIPMode(t *testing.T) {
	beside(t)
	const maxIPs = 4
	v := newVPCCluster(t, 3, maxIPs)
	v.put("/twill.io/network/config", v.netConf("secondary-ip", `,"PoolLowWater":1,"PoolHighWater":2,"PoolReleaseCooldown":"1s"`))
	for i := range v.topo.Nodes {
		v.startDaemon(i)
	}
	eniIPs := func(i int) []netip.Addr {
		st, err := sim.Load(v.state)
		if err != nil {
			t.Fatal(err)
		}
		return st.ENIs[i].SecondaryIPs
	}
	for i := range v.topo.Nodes {
		env := v.env(i)
		if env.Extra[enicni.EnvMode] != "secondary-ip" || env.Extra[enicni.EnvPoolDir] == "" {
			t.Fatalf("node%d subnet.env %+v: want secondary-ip mode and a pool", i+1, env)
		}
		waitFor(t, 5*time.Second, fmt.Sprintf("node%d warm pool filled", i+1), func() bool { return len(eniIPs(i)) == 2 })
	}

	var pods []vpcPod
	for i := range v.topo.Nodes {
		p := v.pod(i, "a")
		if !slices.Contains(eniIPs(i), p.addr) {
			t.Fatalf("pod on node%d got %s, not one of its ENI's secondary IPs %v", i+1, p.addr, eniIPs(i))
		}
		pods = append(pods, p)
	}
	// Pod b takes node1's last warm IP; pod c, right after, is beyond the
	// warm pool: its ADD waits for the daemon to assign more through the
	// provider (the pod helper bounds the wait).
	b := v.pod(0, "b")
	emptied := time.Now()
	c := v.pod(0, "c")
	took := time.Since(emptied)
	if n := len(eniIPs(0)); n <= 2 {
		t.Fatalf("node1's ENI has %d secondary IPs after a pod beyond the warm pool; want more than 2", n)
	}
	t.Logf("pod beyond the warm pool wired %s after the pool ran dry", took.Round(time.Millisecond))
	v.connectivity(pods, b)
	d := v.pod(0, "d") // the 4th: the ENI's limit
	// A 5th pod exceeds the ENI's limit: ADD fails at once, saying why.
	extraNS := v.topo.Nodes[0].NS + "-e"
	if out, err := exec.Command("ip", "netns", "add", extraNS).CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", extraNS).Run() })
	start := time.Now()
	out := v.cni(0, "add", "e", extraNS)
	if !strings.Contains(out.Error, "no free secondary IP on ENI eni-1") || !strings.Contains(out.Error, "limit exceeded") {
		t.Errorf("ADD beyond the ENI's limit: %q; want a clear limit error", out.Error)
	}
	// The limit error (not the pool-wait timeout's message) shows that ADD
	// did not wait for an address that cannot come.
	t.Logf("ADD beyond the ENI's limit failed after %s", time.Since(start).Round(time.Millisecond))
	if out := v.cni(0, "status", "", ""); !strings.Contains(out.Error, "pool cannot grow") {
		t.Errorf("STATUS with the ENI at its limit: %q; want code 50 saying the pool cannot grow", out.Error)
	}

	// Deleting pods leaves surplus; it is released after the cooldown.
	for _, p := range []vpcPod{b, c, d} {
		v.del(p)
	}
	waitFor(t, 10*time.Second, "surplus released", func() bool { return len(eniIPs(0)) == 1+2 }) // a in use + HighWater free
	pool, _ := enicni.ReadPoolFile(v.env(0).Extra[enicni.EnvPoolDir])
	if len(pool.IPs) != 3 {
		t.Errorf("pool.json lists %v after the release; want 3 IPs", pool.IPs)
	}
	for _, p := range pods {
		v.del(p)
	}
	for i := range v.topo.Nodes {
		if left := v.leftovers(i); len(left) > 0 {
			t.Errorf("node%d after DEL of every pod: %v", i+1, left)
		}
	}
}
