package e2e

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	twcluster "github.com/twill-net/twill/lab/cluster"
	"github.com/twill-net/twill/lab/cnidriver"
	"github.com/twill-net/twill/lab/topology"
	"github.com/twill-net/twill/nl"
	"github.com/twill-net/twill/testsupport/kubetest"
)

// These tests take over a running flannel cluster, node by node, with
// flanneld itself (built from the Go module proxy at the version
// tools/flannel pins) and pods wired as flannel's CNI plugin wires them:
// the reference bridge and host-local plugins, configured as flannel's
// plugin configures them (flannel's own plugin is not on the module proxy).

// flannelPrefix is flannel's etcd prefix, which twill runs on beside it.
const flannelPrefix = "/coreos.com/network"

// flanneldBinary builds flanneld once (cached in build/flannel/<version>).
func flanneldBinary(t testing.TB) string { return builtTool(t, "flannel", "flanneld") }

// builtTool builds (or finds cached) a tool of tools/<dir>/build.sh, which
// ends by printing "<what>: <version> in <dir>", and returns the path of
// its binary name.
func builtTool(t testing.TB, dir, name string) string {
	t.Helper()
	root := kubetest.Root(t)
	out, err := exec.Command("bash", filepath.Join(root, "tools", dir, "build.sh")).CombinedOutput()
	if err != nil {
		t.Fatalf("building %s (tools/%s/build.sh): %v\n%s", name, dir, err, out)
	}
	m := regexp.MustCompile(`: (\S+) in (\S+)\n*$`).FindStringSubmatch(string(out))
	if m == nil {
		t.Fatalf("tools/%s/build.sh said:\n%s", dir, out)
	}
	return filepath.Join(m[2], name)
}

// flannelCluster is a cluster whose nodes run flanneld or twilld, on
// flannel's etcd prefix, or (kube set) on a kube-apiserver's Nodes.
type flannelCluster struct {
	*cluster
	kube     *kubeCluster
	flanneld string
	flannels map[int]*proc
	pods     []*flPod
	twillNet string // twill's network name in its conflist: "twill" unless a test sets flannel's
}

// flannelAnnotations is flannel's Node annotation prefix, which twill
// runs with beside it in Kubernetes mode.
const flannelAnnotations = "flannel.alpha.coreos.com"

// flPod is a pod and the node and plugin that wired it.
type flPod struct {
	node  int
	name  string
	ns    string
	ip    netip.Addr
	twill bool
}

func (c *flannelCluster) flannelEnv(i int) string {
	return filepath.Join(c.dir, c.topo.Nodes[i].Name, "flannel-subnet.env")
}

// startFlannel runs flanneld on node i and waits for its subnet.env.
func (c *flannelCluster) startFlannel(i int) {
	c.t.Helper()
	n := c.topo.Nodes[i]
	if err := os.MkdirAll(filepath.Dir(c.flannelEnv(i)), 0o755); err != nil {
		c.t.Fatal(err)
	}
	args := []string{"--etcd-endpoints", c.etcdURL, "--etcd-prefix", flannelPrefix}
	var env []string
	if c.kube != nil {
		kc, err := c.kube.api.AdminKubeconfig()
		if err != nil {
			c.t.Fatal(err)
		}
		args = []string{"--kube-subnet-mgr", "--kubeconfig-file", kc, "--net-config-path", c.kube.netConf}
		env = []string{"NODE_NAME=" + n.Name}
	}
	c.flannels[i] = startEnv(c.t, env, n.NS, filepath.Join(c.dir, n.Name+"-flanneld.log"), c.flanneld,
		append(args, "--iface", "eth0", "--subnet-file", c.flannelEnv(i), "--ip-masq")...)
	p := c.flannels[i]
	c.t.Cleanup(func() {
		if c.t.Failed() {
			c.t.Logf("node%d's flanneld, end of its log:\n%s", i+1, tailString(p.Output(), 3000))
		}
	})
	waitFor(c.t, 30*time.Second, fmt.Sprintf("flanneld on node%d to write %s", i+1, c.flannelEnv(i)), func() bool {
		_, err := os.Stat(c.flannelEnv(i))
		return err == nil
	})
}

// flannelSubnet reads FLANNEL_NETWORK, FLANNEL_SUBNET and FLANNEL_MTU.
func (c *flannelCluster) flannelSubnet(i int) (network, sub string, mtu int) {
	c.t.Helper()
	data, err := os.ReadFile(c.flannelEnv(i))
	if err != nil {
		c.t.Fatal(err)
	}
	sc := bufio.NewScanner(strings.NewReader(string(data)))
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), "=")
		switch k {
		case "FLANNEL_NETWORK":
			network = v
		case "FLANNEL_SUBNET":
			sub = v
		case "FLANNEL_MTU":
			mtu, _ = strconv.Atoi(v)
		}
	}
	return network, sub, mtu
}

// netConf is the conflist of pod p's plugin: flannel's (bridge and
// host-local, as flannel's plugin delegates to them, network cbr0) or
// twill's, deliberately under a name of its own: twill's plugin must not
// hand out the addresses flannel's running pods hold in cbr0's store, nor
// need the operator to give it flannel's network name for that. (A rollback
// does: flannel's host-local reads its own store only.)
func (c *flannelCluster) netConf(p *flPod) json.RawMessage {
	state := filepath.Join(c.dir, c.topo.Nodes[p.node].Name)
	if p.twill {
		name := cmp.Or(c.twillNet, "twill")
		return json.RawMessage(fmt.Sprintf(`{"cniVersion":"1.0.0","name":%q,"plugins":[{"type":"twill","subnetFile":%q,"dataDir":%q}]}`,
			name, c.subnetFile(p.node), filepath.Join(state, "networks")))
	}
	network, sub, mtu := c.flannelSubnet(p.node)
	sub = netip.MustParsePrefix(sub).Masked().String() // flannel's plugin parses it as a network
	return json.RawMessage(fmt.Sprintf(`{"cniVersion":"1.0.0","name":"cbr0","plugins":[{"type":"bridge","bridge":"cni0","isGateway":true,
		"isDefaultGateway":true,"hairpinMode":true,"ipMasq":false,"mtu":%d,"ipam":{"type":"host-local","ranges":[[{"subnet":%q}]],
		"routes":[{"dst":%q}],"dataDir":%q}}]}`, mtu, sub, network, filepath.Join(state, "networks")))
}

// runCNI runs op for p with the plugin of conf.
func (c *flannelCluster) runCNI(op string, p *flPod, conf json.RawMessage) cnidriver.Outcome {
	c.t.Helper()
	state := filepath.Join(c.dir, c.topo.Nodes[p.node].Name)
	req := cnidriver.Request{Op: op, ConfList: conf, BinDirs: []string{c.bin, "/usr/lib/cni"}, CacheDir: filepath.Join(state, "cni-cache"),
		Attachments: []cnidriver.Attachment{{ContainerID: p.name, IfName: "eth0", Netns: "/var/run/netns/" + p.ns}}}
	resp, err := cnidriver.RunIn(context.Background(), c.bin+"/twill-lab", c.topo.Nodes[p.node].NS, req)
	if err != nil || len(resp.Outcomes) != 1 {
		c.t.Fatalf("cni %s %s on node%d: %+v (%v)", op, p.name, p.node+1, resp, err)
	}
	return resp.Outcomes[0]
}

// addPod wires a pod on node i, with flannel's plugins or twill's.
func (c *flannelCluster) addPod(i int, name string, twill bool) *flPod {
	c.t.Helper()
	p := &flPod{node: i, name: name, ns: fmt.Sprintf("%s-%s", c.topo.Nodes[i].NS, name), twill: twill}
	if out, err := exec.Command("ip", "netns", "add", p.ns).CombinedOutput(); err != nil {
		c.t.Fatalf("ip netns add %s: %v: %s", p.ns, err, out)
	}
	c.t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", p.ns).Run() })
	out := c.runCNI("add", p, c.netConf(p))
	if out.Error != "" {
		c.t.Fatalf("cni add %s on node%d: %s", name, i+1, out.Error)
	}
	var res struct {
		IPs []struct{ Address string } `json:"ips"`
	}
	if err := json.Unmarshal(out.Result, &res); err != nil || len(res.IPs) == 0 {
		c.t.Fatalf("cni add %s: result %s", name, out.Result)
	}
	pre, err := netip.ParsePrefix(res.IPs[0].Address)
	if err != nil {
		c.t.Fatal(err)
	}
	p.ip = pre.Addr()
	c.pods = append(c.pods, p)
	return p
}

// flProbe pings from one pod to another every 50 ms for as long as it runs.
type flProbe struct {
	from, to *flPod
	p        *proc
}

func (c *flannelCluster) probe(from, to *flPod) *flProbe {
	c.t.Helper()
	log := filepath.Join(c.dir, fmt.Sprintf("probe-%s-%s.log", from.name, to.name))
	return &flProbe{from: from, to: to, p: start(c.t, from.ns, log, "ping", "-n", "-i", "0.05", "-W", "1", to.ip.String())}
}

var icmpSeq = regexp.MustCompile(`icmp_seq=(\d+)`)

// longestGap stops the probe and returns the longest run of unanswered
// pings, as time, and how many were answered.
func (pr *flProbe) longestGap(t *testing.T) (time.Duration, int) {
	t.Helper()
	pr.p.Stop(t)
	var seqs []int
	for _, m := range icmpSeq.FindAllStringSubmatch(pr.p.Output(), -1) {
		n, _ := strconv.Atoi(m[1])
		seqs = append(seqs, n)
	}
	if len(seqs) == 0 {
		return time.Hour, 0
	}
	slices.Sort(seqs)
	gap := seqs[0] - 1
	for i := 1; i < len(seqs); i++ {
		gap = max(gap, seqs[i]-seqs[i-1]-1)
	}
	return time.Duration(gap) * 50 * time.Millisecond, len(seqs)
}

// reachAll checks that every pod reaches every pod on another node.
func (c *flannelCluster) reachAll(when string) {
	c.t.Helper()
	for _, a := range c.pods {
		for _, b := range c.pods {
			if a.node == b.node && a != b && !(a.twill != b.twill) {
				continue
			}
			if a == b {
				continue
			}
			if err := ping(a.ns, b.ip); err != nil {
				c.t.Errorf("%s: %s (node%d) cannot reach %s (node%d, %s): %v", when, a.name, a.node+1, b.name, b.node+1, b.ip, err)
			}
		}
	}
}

func newFlannelCluster(t *testing.T, backend string, kube bool) *flannelCluster {
	t.Helper()
	fl := flanneldBinary(t)
	conf := fmt.Sprintf(`{"Network":"10.50.0.0/16","Backend":{"Type":%q}}`, backend)
	c := &flannelCluster{flanneld: fl, flannels: map[int]*proc{}}
	if kube {
		c.kube = newKubeClusterWith(t, topology.Options{Nodes: 3, Underlay: netip.MustParsePrefix("10.99.0.0/24")}, conf)
		c.cluster = c.kube.cluster
		// As Documentation/migrating-from-flannel.md says: twill takes
		// flannel's annotations, and the admission policy lets it.
		if out, err := c.kube.api.Kubectl("-n", "kube-twill", "patch", "configmap", "kube-twill-cfg", "--type", "merge",
			"-p", `{"data":{"annotation-prefix":"`+flannelAnnotations+`"}}`); err != nil {
			t.Fatalf("setting annotation-prefix: %v\n%s", err, out)
		}
		if out, err := c.kube.api.Kubectl("patch", "validatingadmissionpolicy", "twill-node-isolation", "--type", "json",
			"-p", `[{"op":"test","path":"/spec/variables/1/name","value":"prefix"},{"op":"replace","path":"/spec/variables/1/expression","value":"\"`+flannelAnnotations+`/\""}]`); err != nil {
			t.Fatalf("setting the admission policy's prefix: %v\n%s", err, out)
		}
		for i, n := range c.topo.Nodes {
			// As kubelet registers a Node: with annotations (flanneld
			// panics on a Node that has none).
			c.kube.createNode(n.Name, fmt.Sprintf("10.50.%d.0/24", i+1), n.Addr.Addr(),
				map[string]string{"volumes.kubernetes.io/controller-managed-attach-detach": "true"})
		}
	} else {
		c.cluster = newCluster(t, 3)
		c.put(flannelPrefix+"/config", conf)
	}
	for i := range 3 {
		c.startFlannel(i)
	}
	for i := range 3 {
		c.addPod(i, fmt.Sprintf("fl%d", i+1), false)
	}
	return c
}

func TestFlannelTakeover(t *testing.T) {
	alone(t)
	for _, backend := range []string{"vxlan", "host-gw"} {
		t.Run(backend, func(t *testing.T) { testFlannelTakeover(t, backend, false) })
	}
}

// TestKubeFlannelTakeover is TestFlannelTakeover in Kubernetes mode:
// flanneld --kube-subnet-mgr and twilld on one apiserver's Nodes, twill
// with flannel's annotation prefix.
func TestKubeFlannelTakeover(t *testing.T) {
	kubeLab(t)
	for _, backend := range []string{"vxlan", "host-gw"} {
		t.Run(backend, func(t *testing.T) { testFlannelTakeover(t, backend, true) })
	}
}

// namesFlannelPeers checks, with node1 switched, that twillctl leases and
// status tell node1's twill lease from the flannel leases of node2 and
// node3 (twilld marks its own lease, flanneld does not).
func (c *flannelCluster) namesFlannelPeers(t *testing.T) {
	t.Helper()
	ns := c.topo.Nodes[0].NS
	out, err := exec.Command("ip", "netns", "exec", ns, c.bin+"/twillctl", "leases", "--etcd-endpoints", c.etcdURL,
		"--etcd-prefix", flannelPrefix).CombinedOutput()
	if err != nil {
		t.Fatalf("twillctl leases: %v\n%s", err, out)
	}
	for i := range 3 {
		sub := c.env(0).Subnet.String()
		if i > 0 {
			_, fl, _ := c.flannelSubnet(i)
			sub = netip.MustParsePrefix(fl).Masked().String()
		}
		var row string
		for _, l := range strings.Split(string(out), "\n") {
			if strings.HasPrefix(l, sub+" ") {
				row = l
			}
		}
		if onFlannel := strings.HasSuffix(strings.TrimSpace(row), "valid (flannel)"); row == "" || onFlannel != (i > 0) {
			t.Errorf("twillctl leases: node%d's %s is %q, want it on flannel: %v\n%s", i+1, sub, row, i > 0, out)
		}
	}
	st, _ := exec.Command("ip", "netns", "exec", ns, c.bin+"/twillctl", "status", "--etcd-endpoints", c.etcdURL,
		"--etcd-prefix", flannelPrefix, "--subnet-file", c.subnetFile(0), "--iface", "eth0",
		"--state-dir", twcluster.NodeDir(c.dir, c.topo.Nodes[0].Name)).CombinedOutput()
	if n := strings.Count(string(st), "on flannel"); n != 2 {
		t.Errorf("twillctl status on node1 names %d peers on flannel, want 2:\n%s", n, st)
	}
}

// switchNode stops flanneld on node i and starts twilld in its place.
func (c *flannelCluster) switchNode(i int) {
	c.t.Helper()
	c.flannels[i].Stop(c.t)
	if c.kube != nil {
		c.kube.startKubeDaemon(i, "--kube-annotation-prefix", flannelAnnotations, "--flannel-subnet-file", c.flannelEnv(i))
		return
	}
	c.startDaemon(i, "--etcd-prefix", flannelPrefix, "--flannel-subnet-file", c.flannelEnv(i))
}

// removeNode takes node i out of the cluster: twilld stops, its lease or
// Node goes.
func (c *flannelCluster) removeNode(i int, sub netip.Prefix) {
	c.t.Helper()
	c.daemons[i].Stop(c.t)
	if c.kube != nil {
		c.kube.deleteNode(c.topo.Nodes[i].Name)
		return
	}
	c.del(flannelPrefix + "/subnets/" + strings.ReplaceAll(sub.String(), "/", "-"))
}

func testFlannelTakeover(t *testing.T, backend string, kube bool) {
	c := newFlannelCluster(t, backend, kube)
	c.reachAll("flannel alone")
	if t.Failed() {
		t.FailNow()
	}
	bridgePods := slices.Clone(c.pods)
	var probes []*flProbe
	for i, p := range bridgePods {
		probes = append(probes, c.probe(p, bridgePods[(i+1)%len(bridgePods)]))
	}
	for i := range 3 {
		_, flSub, _ := c.flannelSubnet(i)
		c.switchNode(i)
		env := c.env(i)
		if want := netip.MustParsePrefix(flSub).Masked(); env.Subnet != want {
			t.Fatalf("node%d: twill took %s, flannel held %s", i+1, env.Subnet, want)
		}
		p := c.addPod(i, fmt.Sprintf("tw%d", i+1), true)
		for _, o := range c.pods {
			if o != p && o.ip == p.ip {
				t.Fatalf("node%d's first twill pod got %s, the address of running pod %s", i+1, p.ip, o.name)
			}
		}
		if _, gw, _ := c.flannelSubnet(i); strings.HasPrefix(gw, p.ip.String()+"/") {
			t.Fatalf("node%d's twill pod got cni0's gateway address %s", i+1, p.ip)
		}
		c.reachAll(fmt.Sprintf("after node%d switched", i+1))
		if !kube && i == 0 {
			c.namesFlannelPeers(t)
		}
	}
	for _, pr := range probes {
		gap, n := pr.longestGap(t)
		t.Logf("probe %s -> %s: %d answers, longest gap %s", pr.from.name, pr.to.name, n, gap)
		if gap > time.Second {
			t.Errorf("probe %s -> %s: a gap of %s in pod-to-pod traffic (at most 1s)", pr.from.name, pr.to.name, gap)
		}
	}
	// flannel's state stays while its pods are on cni0; its routes to
	// peers are gone (twill routes them), as are its jumps.
	for i := range 3 {
		if !linkExists(t, c.topo.Nodes[i].NS, "cni0") {
			t.Errorf("node%d: cni0 was removed while a flannel pod is on it", i+1)
		}
		if r := c.routes(i); strings.Contains(r, "flannel.") || regexp.MustCompile(`10\.50\.\d+\.0/24 via \S+ dev eth0\s*\n`).MatchString(r) {
			t.Errorf("node%d: flannel's routes are still there:\n%s", i+1, r)
		}
	}
	// A node removed from the cluster is gone from every node's routes
	// within 2 s.
	removed := 2
	gone := c.env(removed).Subnet
	c.removeNode(removed, gone)
	for i := range 2 {
		took := waitFor(t, 5*time.Second, fmt.Sprintf("node%d to forget %s", i+1, gone), func() bool { return !strings.Contains(c.routes(i), gone.String()) })
		if took > 2*time.Second {
			t.Errorf("node%d kept routing the removed node's %s for %s", i+1, gone, took)
		}
	}
	// The bridge pods leave through twill's plugin (the node's conflist
	// now): each is released, and with the last, flannel's state goes.
	for _, p := range bridgePods[:2] {
		if out := c.runCNI("del", p, c.netConf(&flPod{node: p.node, name: p.name, ns: p.ns, twill: true})); out.Error != "" {
			t.Fatalf("DEL of flannel pod %s through twill's plugin: %s", p.name, out.Error)
		}
		if _, err := os.Stat(filepath.Join(c.dir, c.topo.Nodes[p.node].Name, "networks", "cbr0", p.ip.String())); !os.IsNotExist(err) {
			t.Errorf("%s's address %s is still allocated after its DEL: %v", p.name, p.ip, err)
		}
		i := p.node
		waitFor(t, 10*time.Second, fmt.Sprintf("node%d to retire flannel's state", i+1), func() bool {
			_, err := os.Stat(c.flannelEnv(i))
			return os.IsNotExist(err) && !linkExists(t, c.topo.Nodes[i].NS, "cni0") && !linkExists(t, c.topo.Nodes[i].NS, "flannel.1")
		})
		if out, _ := topology.Exec(c.topo.Nodes[i].NS, "iptables-save"); strings.Contains(out, "FLANNEL") {
			t.Errorf("node%d: flannel's chains stay after its last bridge pod left:\n%s", i+1, out)
		}
	}
}

// TestFlannelRollback switches a node to twill and back to flanneld: its
// pods, the one twill wired included, keep talking to every other node.
func TestFlannelRollback(t *testing.T) {
	beside(t)
	c := newFlannelCluster(t, "vxlan", false)
	// Going back, flannel's host-local must see twill's pods' addresses:
	// twill's conflist has flannel's network name, as the guide says.
	c.twillNet = "cbr0"
	c.flannels[0].Stop(t)
	d := c.startDaemon(0, "--etcd-prefix", flannelPrefix, "--flannel-subnet-file", c.flannelEnv(0))
	c.env(0)
	tw := c.addPod(0, "tw1", true)
	c.reachAll("node1 on twill")
	// Pods of node1 (the one twill wired and one of flannel's) and of
	// node2 ping each other throughout the rollback.
	var probes []*flProbe
	for _, p := range c.pods {
		if p.node == 1 {
			probes = append(probes, c.probe(tw, p), c.probe(p, c.pods[0]))
		}
	}
	was, err := vxlanIn(c.topo.Nodes[0].NS, "twill.1")
	if err != nil {
		t.Fatal(err)
	}
	// Back to flannel: stop twilld, leave its data plane to flanneld
	// (twilld cleanup --hand-over-to-flannel), start flanneld
	// (Documentation/migrating-from-flannel.md).
	d.Stop(t)
	state := filepath.Join(c.dir, c.topo.Nodes[0].Name)
	if out, err := exec.Command("ip", "netns", "exec", c.topo.Nodes[0].NS, c.bin+"/twilld", "cleanup", "--hand-over-to-flannel", "--state-dir", state,
		"--subnet-file", c.subnetFile(0)).CombinedOutput(); err != nil {
		t.Fatalf("twilld cleanup: %v\n%s", err, out)
	}
	// twill's VTEP is flannel's now, as it was: same VNI, port and MAC.
	if now, err := vxlanIn(c.topo.Nodes[0].NS, "flannel.1"); err != nil || now.VNI != was.VNI || now.Port != was.Port ||
		!bytes.Equal(now.HardwareAddr, was.HardwareAddr) {
		t.Fatalf("after the hand-over, flannel.1 is %+v (%v); twill.1 was %+v", now, err, was)
	}
	if linkExists(t, c.topo.Nodes[0].NS, "twill.1") {
		t.Error("twill.1 is still there after the hand-over")
	}
	c.startFlannel(0)
	waitFor(t, 30*time.Second, "node1's pods to reach the others again on flannel", func() bool {
		for _, a := range c.pods {
			for _, b := range c.pods {
				if a.node != b.node && ping(a.ns, b.ip) != nil {
					return false
				}
			}
		}
		return true
	})
	c.reachAll("node1 back on flannel")
	for _, pr := range probes {
		gap, n := pr.longestGap(t)
		t.Logf("probe %s -> %s across the rollback: %d answers, longest gap %s", pr.from.name, pr.to.name, n, gap)
		if gap > time.Second {
			t.Errorf("probe %s -> %s: a gap of %s across the rollback (at most 1s)", pr.from.name, pr.to.name, gap)
		}
	}
	// A pod flannel wires now takes none of the addresses twill gave.
	p := c.addPod(0, "fl1b", false)
	for _, o := range c.pods {
		if o != p && o.ip == p.ip {
			t.Fatalf("flannel's new pod got %s, the address of running pod %s", p.ip, o.name)
		}
	}
}

// vxlanIn reads the VXLAN device name of the network namespace ns.
func vxlanIn(ns, name string) (nl.VXLAN, error) {
	h, err := nl.Open(ns)
	if err != nil {
		return nl.VXLAN{}, err
	}
	defer h.Close()
	_, v, ok, err := h.VXLANByName(name)
	if err == nil && !ok {
		err = fmt.Errorf("%s in %s is not a VXLAN device", name, ns)
	}
	return v, err
}

func linkExists(t *testing.T, ns, name string) bool {
	t.Helper()
	return exec.Command("ip", "-n", ns, "link", "show", name).Run() == nil
}
