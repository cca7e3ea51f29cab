package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/twill-net/twill/lab/topology"
	"github.com/twill-net/twill/testsupport/kubetest"
)

// kubeCluster is a cluster whose nodes run twilld --kube-subnet-mgr against
// a real kube-apiserver (on the test's etcd), authenticated as the
// ServiceAccount dist/kube-twill.yml creates, with only its RBAC.
type kubeCluster struct {
	*cluster
	api        *kubetest.APIServer
	nodes      corev1client.NodeInterface
	kubeconfig string
	netConf    string
}

const kubeHealthPort = 9966

func newKubeCluster(t testing.TB, n int, backend string) *kubeCluster {
	t.Helper()
	return newKubeClusterOn(t, n, netip.MustParsePrefix("10.99.0.0/24"), "10.244.0.0/16", backend)
}

// newKubeClusterOn is newKubeCluster with the nodes on underlay and
// net-conf.json's Network set to network.
func newKubeClusterOn(t testing.TB, n int, underlay netip.Prefix, network, backend string) *kubeCluster {
	t.Helper()
	return newKubeClusterWith(t, topology.Options{Nodes: n, Underlay: underlay}, fmt.Sprintf(`{"Network":%q,"Backend":{"Type":%q}}`, network, backend))
}

// newKubeClusterWith is a Kubernetes-mode cluster on the topology o
// describes, with netConf as net-conf.json.
func newKubeClusterWith(t testing.TB, o topology.Options, netConf string) *kubeCluster {
	t.Helper()
	c := newClusterWith(t, o)
	api := kubetest.Start(t, kubetest.Options{NS: c.topo.Underlay, Addr: c.topo.BridgeAddr, EtcdURL: c.etcdURL, Dir: filepath.Join(c.dir, "kube")})
	manifest := filepath.Join(kubetest.Root(t), "dist", "kube-twill.yml")
	// The manifest is schema-valid: the apiserver accepts it in a server
	// dry run (every object validated and admitted, nothing stored). A dry
	// run stores no Namespace, so the namespaced objects need it to exist
	// already, as on any cluster the manifest is re-applied to.
	if out, err := api.Kubectl("create", "namespace", "kube-twill"); err != nil {
		t.Fatalf("kubectl create namespace: %v\n%s", err, out)
	}
	if out, err := api.Kubectl("apply", "--dry-run=server", "-f", manifest); err != nil {
		t.Fatalf("kubectl apply --dry-run=server -f dist/kube-twill.yml: %v\n%s", err, out)
	}
	cleanup := filepath.Join(kubetest.Root(t), "dist", "kube-twill-cleanup.yml")
	if out, err := api.Kubectl("apply", "--dry-run=server", "-f", cleanup); err != nil {
		t.Fatalf("kubectl apply --dry-run=server -f dist/kube-twill-cleanup.yml: %v\n%s", err, out)
	}
	if out, err := api.Kubectl("apply", "-f", manifest); err != nil {
		t.Fatalf("kubectl apply -f dist/kube-twill.yml: %v\n%s", err, out)
	}
	k := &kubeCluster{cluster: c, api: api, nodes: api.AdminClient(t).Nodes(),
		kubeconfig: api.ServiceAccountKubeconfig(t, "kube-twill", "twill"),
		netConf:    filepath.Join(c.dir, "net-conf.json")}
	if err := os.WriteFile(k.netConf, []byte(netConf), 0o644); err != nil {
		t.Fatal(err)
	}
	return k
}

// createNode registers a Node as kubelet and kube-controller-manager would:
// addresses, and a podCIDR.
func (k *kubeCluster) createNode(name, podCIDR string, addr netip.Addr, annotations map[string]string) {
	k.t.Helper()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: annotations}}
	n.Spec.PodCIDR, n.Spec.PodCIDRs = podCIDR, []string{podCIDR}
	n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: addr.String()}, {Type: corev1.NodeHostName, Address: name}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := k.nodes.Create(ctx, n, metav1.CreateOptions{}); err != nil {
		k.t.Fatalf("creating Node %s: %v", name, err)
	}
}

func (k *kubeCluster) deleteNode(name string) {
	k.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := k.nodes.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		k.t.Fatalf("deleting Node %s: %v", name, err)
	}
}

func (k *kubeCluster) node(name string) *corev1.Node {
	k.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n, err := k.nodes.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		k.t.Fatalf("getting Node %s: %v", name, err)
	}
	return n
}

func (k *kubeCluster) startKubeDaemon(i int, extra ...string) *proc {
	k.t.Helper()
	n := k.topo.Nodes[i]
	state := filepath.Join(k.dir, n.Name)
	if err := os.MkdirAll(state, 0o755); err != nil {
		k.t.Fatal(err)
	}
	// The token is bound to a pod on the node, as kubelet's is: the
	// manifest's admission policy lets it change that Node alone.
	kubeconfig := k.api.NodeTokenKubeconfig(k.t, "kube-twill", "twill", n.Name)
	args := append([]string{"--kube-subnet-mgr", "--kubeconfig-file", kubeconfig, "--net-config-path", k.netConf,
		"--iface", "eth0", "--subnet-file", k.subnetFile(i), "--state-dir", state,
		"--healthz-ip", "127.0.0.1", "--healthz-port", strconv.Itoa(kubeHealthPort)}, extra...)
	p := startEnv(k.t, []string{"NODE_NAME=" + n.Name}, n.NS, filepath.Join(k.dir, n.Name+".log"), k.bin+"/twilld", args...)
	k.daemons[i] = p
	k.t.Cleanup(func() {
		if k.t.Failed() {
			k.t.Logf("%s twilld log:\n%s", n.Name, tailString(p.Output(), 3000))
		}
	})
	return p
}

func tailString(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// metric reads one unlabelled metric from node i's /metrics, fetched from
// inside the node's namespace.
func (k *kubeCluster) metric(i int, name string) string {
	k.t.Helper()
	return metricIn(k.t, k.topo.Nodes[i].NS, kubeHealthPort, name)
}

// published waits until node i's Node carries twill's annotations and the
// NetworkUnavailable=False condition, and returns the annotations.
func (k *kubeCluster) published(i int) map[string]string {
	k.t.Helper()
	name := k.topo.Nodes[i].Name
	var n *corev1.Node
	waitFor(k.t, 15*time.Second, name+" annotated and NetworkUnavailable=False", func() bool {
		n = k.node(name)
		if n.Annotations["twill.io/backend-type"] == "" {
			return false
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeNetworkUnavailable && c.Status == corev1.ConditionFalse && c.Reason == "TwillIsUp" {
				return true
			}
		}
		return false
	})
	return n.Annotations
}

// startNodes registers a Node per node namespace, with podCIDR(i), and
// starts twilld in each.
func (k *kubeCluster) startNodes() {
	k.t.Helper()
	for i, n := range k.topo.Nodes {
		k.createNode(n.Name, podCIDR(i).String(), n.Addr.Addr(), nil)
	}
	for i := range k.topo.Nodes {
		k.startKubeDaemon(i)
	}
}

func podCIDR(i int) netip.Prefix { return netip.MustParsePrefix(fmt.Sprintf("10.244.%d.0/24", i+1)) }

// TestKubeHostGW covers Kubernetes mode end to end with host-gw: three
// nodes annotate themselves and route to each other, pods wired by the CNI
// plugin talk across nodes, Nodes that come and go are followed within 2 s,
// Nodes with bad annotations, a podCIDR outside Network, a spoofed public
// IP or an overlapping podCIDR never become routes, and a node with an
// operator's public-ip-overwrite is published and routed at that address.
func TestKubeHostGW(t *testing.T) {
	beside(t)
	k := newKubeCluster(t, 3, "host-gw")
	// node3 is to be reached at a second address, not in its
	// status.addresses: an operator vouches for it with public-ip-overwrite.
	alias := k.topo.Nodes[2].Addr.Addr().Next().Next().Next().Next().Next().Next().Next().Next()
	if err := topology.IP(k.topo.Nodes[2].NS, "addr", "add", netip.PrefixFrom(alias, 24).String(), "dev", "eth0"); err != nil {
		t.Fatal(err)
	}
	publicIP := []netip.Addr{k.topo.Nodes[0].Addr.Addr(), k.topo.Nodes[1].Addr.Addr(), alias}
	for i, n := range k.topo.Nodes {
		var ann map[string]string
		if i == 2 {
			ann = map[string]string{"twill.io/public-ip-overwrite": alias.String()}
		}
		k.createNode(n.Name, podCIDR(i).String(), n.Addr.Addr(), ann)
	}
	for i := range k.topo.Nodes {
		k.startKubeDaemon(i)
	}
	for i, n := range k.topo.Nodes {
		ann := k.published(i)
		if ann["twill.io/backend-type"] != "host-gw" || ann["twill.io/public-ip"] != publicIP[i].String() {
			t.Errorf("%s annotations %v: want backend-type host-gw, public-ip %s", n.Name, ann, publicIP[i])
		}
		if env := k.env(i); env.Subnet != podCIDR(i) || env.Network.String() != "10.244.0.0/16" {
			t.Errorf("%s subnet.env %+v: want TWILL_SUBNET %s (its podCIDR)", n.Name, env, podCIDR(i))
		}
	}
	routedTo := func(dst netip.Prefix, via netip.Addr, nodes ...int) func() bool {
		return func() bool {
			for _, i := range nodes {
				if !strings.Contains(k.routes(i), fmt.Sprintf("%s via %s dev eth0 proto 167", dst, via)) {
					return false
				}
			}
			return true
		}
	}
	for j, n := range k.topo.Nodes {
		var others []int
		for i := range k.topo.Nodes {
			if i != j {
				others = append(others, i)
			}
		}
		waitFor(t, 10*time.Second, "routes to "+n.Name, routedTo(podCIDR(j), publicIP[j], others...))
	}

	// Someone overwrites node1's annotation and flips its condition:
	// twilld puts both back (level-triggered on its own Node too).
	patch := `{"metadata":{"annotations":{"twill.io/public-ip":"10.99.0.250"}},"status":{"conditions":[{"type":"NetworkUnavailable","status":"True","reason":"Test"}]}}`
	if out, err := k.api.Kubectl("patch", "node", "node1", "--subresource=status", "--type=strategic", "-p", patch); err != nil {
		t.Fatalf("kubectl patch: %v\n%s", err, out)
	}
	if ann := k.published(0); ann["twill.io/public-ip"] != k.topo.Nodes[0].Addr.Addr().String() {
		t.Errorf("node1 public-ip annotation %q after the tampering; want it restored to %s", ann["twill.io/public-ip"], k.topo.Nodes[0].Addr.Addr())
	}

	// Pods wired by the real plugin, on different nodes, exchange packets.
	podA, addrA := k.addPod(0, "a")
	podC, addrC := k.addPod(2, "c")
	if !podCIDR(0).Contains(addrA) || !podCIDR(2).Contains(addrC) {
		t.Fatalf("pod addresses %s, %s: not in their nodes' podCIDRs", addrA, addrC)
	}
	if err := ping(podA, addrC); err != nil {
		t.Fatal(err)
	}
	k.tcp(podC, addrC, podA)

	// Nodes twill must refuse. An unused underlay address stands in for
	// nodes that exist only as API objects.
	spare := k.topo.Nodes[2].Addr.Addr().Next().Next().Next()
	bad := map[string]struct {
		cidr string
		addr netip.Addr
		ann  map[string]string
	}{
		"bad-json": {"10.244.20.0/24", spare, map[string]string{"twill.io/backend-type": "host-gw", "twill.io/backend-data": "{oops", "twill.io/public-ip": spare.String()}},
		"outside":  {"172.31.5.0/24", spare, map[string]string{"twill.io/backend-type": "host-gw", "twill.io/public-ip": spare.String()}},
		// Claims node2's address, which is not one of its own.
		"spoof": {"10.244.22.0/24", spare, map[string]string{"twill.io/backend-type": "host-gw", "twill.io/public-ip": k.topo.Nodes[1].Addr.Addr().String()}},
		// Same podCIDR as node2, created later: node2 keeps its route.
		"dup": {podCIDR(1).String(), spare, map[string]string{"twill.io/backend-type": "host-gw", "twill.io/public-ip": spare.String()}},
	}
	// creationTimestamp has one-second resolution; "dup" must be visibly
	// younger than node2 for twill to know which of the two to keep.
	time.Sleep(time.Until(k.node("node2").CreationTimestamp.Add(1100 * time.Millisecond)))
	for name, b := range bad {
		k.createNode(name, b.cidr, b.addr, b.ann)
	}
	// A good late-comer: its route appears everywhere. (How fast is
	// BenchmarkKubeHostGW2000's business; a test only waits, generously.)
	late := netip.MustParsePrefix("10.244.30.0/24")
	k.createNode("late", late.String(), spare, map[string]string{"twill.io/backend-type": "host-gw", "twill.io/backend-data": "null", "twill.io/public-ip": spare.String()})
	took := waitFor(t, 30*time.Second, "route to the late node", routedTo(late, spare, 0, 1, 2))
	t.Logf("new Node routed on every node %s after it was created", took.Round(time.Millisecond))

	for i := range k.topo.Nodes {
		table := k.routes(i)
		for _, dst := range []string{"10.244.20.", "172.31.5.", "10.244.22."} {
			if strings.Contains(table, dst) {
				t.Errorf("node%d routes refused Node subnet %s:\n%s", i+1, dst, table)
			}
		}
		if i != 1 && !strings.Contains(table, fmt.Sprintf("%s via %s dev eth0", podCIDR(1), k.topo.Nodes[1].Addr.Addr())) {
			t.Errorf("node%d: node2's route lost to the overlapping Node:\n%s", i+1, table)
		}
	}
	logs := k.daemons[0].Output()
	for _, want := range []string{
		`node \"bad-json\": annotation twill.io/backend-data \"{oops\": must be a JSON object`,
		`subnet 172.31.5.0/24: not a /24 inside Network 10.244.0.0/16`,
		`node \"spoof\": annotation twill.io/public-ip \"` + k.topo.Nodes[1].Addr.Addr().String() + `\": not one of the node's status.addresses`,
		`node \"dup\": pod subnet 10.244.2.0/24 overlaps that of node \"node2\"`,
	} {
		if !strings.Contains(logs, want) {
			t.Errorf("node1's log lacks the refusal %s", want)
		}
	}
	if got := k.metric(0, "twill_leases_refused"); got != "4" {
		t.Errorf("node1 twill_leases_refused = %s, want 4", got)
	}
	// twillctl leases says the same, from the apiserver, with the
	// ServiceAccount's read-only view.
	out, err := exec.Command("ip", "netns", "exec", k.topo.Nodes[0].NS, k.bin+"/twillctl", "leases", "--kubeconfig", k.kubeconfig,
		"--net-config-path", k.netConf).CombinedOutput()
	if err != nil {
		t.Fatalf("twillctl leases --kubeconfig: %v\n%s", err, out)
	}
	state := map[string]string{}
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) > 2 {
			state[f[0]] = strings.Join(f[1:], " ")
		}
	}
	for node, want := range map[string]string{
		"node2": "10.244.2.0/24 " + k.topo.Nodes[1].Addr.Addr().String() + " host-gw peer", "late": "10.244.30.0/24 " + spare.String() + " host-gw peer",
		"bad-json": `REFUSED: node "bad-json": annotation twill.io/backend-data`, "spoof": `REFUSED: node "spoof"`,
		"dup": `REFUSED: node "dup"`, "outside": "REFUSED: subnet 172.31.5.0/24: not a /24 inside Network 10.244.0.0/16",
	} {
		if !strings.Contains(state[node], want) {
			t.Errorf("twillctl leases on %s: %q, want %q\n%s", node, state[node], want, out)
		}
	}

	// Deleting Nodes removes their routes from the others: the API-only
	// node, then a node running twilld (whose daemon stops).
	k.deleteNode("late")
	took = waitFor(t, 30*time.Second, "route to the deleted Node gone", func() bool {
		for i := range k.topo.Nodes {
			if strings.Contains(k.routes(i), late.String()) {
				return false
			}
		}
		return true
	})
	t.Logf("deleted Node's route gone from every node %s after the delete", took.Round(time.Millisecond))
	k.deleteNode(k.topo.Nodes[2].Name)
	waitFor(t, 30*time.Second, "routes to node3 gone", func() bool {
		return !strings.Contains(k.routes(0), podCIDR(2).String()) && !strings.Contains(k.routes(1), podCIDR(2).String())
	})
	waitFor(t, 10*time.Second, "node3's twilld to exit", func() bool { done, _ := k.daemons[2].Exited(); return done })
	if out := k.daemons[2].Output(); !strings.Contains(out, `node \"node3\" was deleted`) && !strings.Contains(out, `node "node3" was deleted`) {
		t.Errorf("node3's twilld did not say why it stopped:\n%s", out)
	}
	if err := ping(podA, addrC); err == nil {
		t.Error("pod on node1 still reaches the pod on deleted node3")
	}
}

// TestKubeVXLAN: the vxlan backend in Kubernetes mode publishes its VTEP in
// backend-data, and pods on different nodes reach each other.
func TestKubeVXLAN(t *testing.T) {
	beside(t)
	k := newKubeCluster(t, 3, "vxlan")
	k.startNodes()
	for i, n := range k.topo.Nodes {
		ann := k.published(i)
		if ann["twill.io/backend-type"] != "vxlan" || !strings.Contains(ann["twill.io/backend-data"], `"VtepMAC"`) {
			t.Errorf("%s annotations %v: want backend-type vxlan and a VtepMAC in backend-data", n.Name, ann)
		}
	}
	waitFor(t, 10*time.Second, "vxlan routes to every peer", func() bool {
		for i := range k.topo.Nodes {
			table := k.routes(i)
			for j := range k.topo.Nodes {
				if i != j && !strings.Contains(table, fmt.Sprintf("%s via %s dev twill.1 proto 167", podCIDR(j), podCIDR(j).Addr())) {
					return false
				}
			}
		}
		return true
	})
	podA, _ := k.addPod(0, "a")
	podB, addrB := k.addPod(1, "b")
	_, addrC := k.addPod(2, "c")
	for _, dst := range []netip.Addr{addrB, addrC} {
		if err := ping(podA, dst); err != nil {
			t.Fatal(err)
		}
	}
	k.tcp(podB, addrB, podA)
}

// TestKubeVXLANDualStack: Nodes with an IPv4 and an IPv6 podCIDR and
// addresses of both families (a dual-stack underlay): vxlan publishes its
// VTEP in backend-data and backend-v6-data, routes both families over one
// VTEP, and pods on different nodes talk over both. A Node whose
// public-ipv6 is not one of its addresses is refused.
func TestKubeVXLANDualStack(t *testing.T) {
	beside(t)
	k := newKubeClusterWith(t, topology.Options{Nodes: 2, Underlay: netip.MustParsePrefix("10.99.0.0/24"), UnderlayV6: netip.MustParsePrefix("fd99::/64")},
		`{"Network":"10.244.0.0/16","EnableIPv6":true,"IPv6Network":"fd00:10::/56","Backend":{"Type":"vxlan"}}`)
	v6CIDR := func(i int) netip.Prefix { return netip.MustParsePrefix(fmt.Sprintf("fd00:10:0:%x::/64", i+1)) }
	create := func(name string, i int, v4, v6 netip.Addr, ann map[string]string) {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: ann}}
		n.Spec.PodCIDR, n.Spec.PodCIDRs = podCIDR(i).String(), []string{podCIDR(i).String(), v6CIDR(i).String()}
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: v4.String()},
			{Type: corev1.NodeInternalIP, Address: v6.String()}, {Type: corev1.NodeHostName, Address: name}}
		if _, err := k.nodes.Create(t.Context(), n, metav1.CreateOptions{}); err != nil {
			t.Fatalf("creating Node %s: %v", name, err)
		}
	}
	for i, n := range k.topo.Nodes {
		create(n.Name, i, n.Addr.Addr(), n.AddrV6.Addr(), nil)
	}
	// A Node claiming node2's IPv6 address, which is not one of its own.
	create("spoof", 5, netip.MustParseAddr("10.99.0.50"), netip.MustParseAddr("fd99::50"), map[string]string{
		"twill.io/backend-type": "vxlan", "twill.io/backend-data": `{"VNI":1,"VtepMAC":"0a:00:00:00:00:50"}`,
		"twill.io/backend-v6-data": `{"VNI":1,"VtepMAC":"0a:00:00:00:00:50"}`,
		"twill.io/public-ip":       "10.99.0.50", "twill.io/public-ipv6": k.topo.Nodes[1].AddrV6.Addr().String()})
	for i := range k.topo.Nodes {
		k.startKubeDaemon(i)
	}
	for i, n := range k.topo.Nodes {
		env := k.env(i)
		if env.Subnet != podCIDR(i) || env.IPv6Subnet != v6CIDR(i) || env.MTU != 1450 {
			t.Fatalf("%s subnet.env %+v: want its two podCIDRs and MTU 1450", n.Name, env)
		}
	}
	waitFor(t, 10*time.Second, "backend-v6-data published", func() bool {
		ann := k.published(0)
		return strings.Contains(ann["twill.io/backend-v6-data"], `"VtepMAC"`) && ann["twill.io/backend-v6-data"] == ann["twill.io/backend-data"] &&
			ann["twill.io/public-ipv6"] == k.topo.Nodes[0].AddrV6.Addr().String()
	})
	want := fmt.Sprintf("%s via %s dev twill.1 proto 167 ", v6CIDR(1), v6CIDR(1).Addr())
	waitFor(t, 10*time.Second, "node2's IPv6 route on node1", func() bool { return strings.Contains(k.routes6(0), want) })
	if r := k.routes6(0); strings.Contains(r, v6CIDR(5).String()) {
		t.Errorf("the spoofing Node's IPv6 podCIDR was routed:\n%s", r)
	}
	k.podsTalk(t, 1450, true, true)
}

// TestKubeHostGWIPv6Only: an IPv6-only cluster in Kubernetes mode (one
// IPv6 podCIDR per Node, kubelet listing IPv6 addresses only) on a
// dual-stack underlay: host-gw publishes the node's IPv6 address alone,
// peers accept it against status.addresses, and pods talk.
func TestKubeHostGWIPv6Only(t *testing.T) {
	beside(t)
	k := newKubeClusterWith(t, topology.Options{Nodes: 2, Underlay: netip.MustParsePrefix("10.99.0.0/24"), UnderlayV6: netip.MustParsePrefix("fd99::/64")},
		`{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"fd00:10::/56","Backend":{"Type":"host-gw"}}`)
	cidr := func(i int) netip.Prefix { return netip.MustParsePrefix(fmt.Sprintf("fd00:10:0:%x::/64", i+1)) }
	for i, n := range k.topo.Nodes {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name}}
		node.Spec.PodCIDR, node.Spec.PodCIDRs = cidr(i).String(), []string{cidr(i).String()}
		node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: n.AddrV6.Addr().String()}, {Type: corev1.NodeHostName, Address: n.Name}}
		if _, err := k.nodes.Create(t.Context(), node, metav1.CreateOptions{}); err != nil {
			t.Fatalf("creating Node %s: %v", n.Name, err)
		}
	}
	for i := range k.topo.Nodes {
		k.startKubeDaemon(i)
	}
	for i, n := range k.topo.Nodes {
		if env := k.env(i); env.Subnet.IsValid() || env.IPv6Subnet != cidr(i) {
			t.Fatalf("%s subnet.env %+v: want its IPv6 podCIDR alone", n.Name, env)
		}
		ann := k.published(i)
		if ann["twill.io/public-ipv6"] != n.AddrV6.Addr().String() || ann["twill.io/public-ip"] != "" {
			t.Errorf("%s annotations %v: want public-ipv6 %s and no public-ip (kubelet lists no IPv4 address)", n.Name, ann, n.AddrV6.Addr())
		}
	}
	want := fmt.Sprintf("%s via %s dev eth0 proto 167", cidr(1), k.topo.Nodes[1].AddrV6.Addr())
	waitFor(t, 10*time.Second, "node2's IPv6 route on node1", func() bool { return strings.Contains(k.routes6(0), want) })
	k.podsTalk(t, 1500, false, true)
}

// TestKubeRBAC asks the apiserver what dist/kube-twill.yml's ServiceAccount
// may do: exactly what twilld needs (get, list and watch, and no more, on
// pods, namespaces, networkpolicies and clusternetworkpolicies for
// --network-policy, and the latter's status patched).
func TestKubeRBAC(t *testing.T) {
	beside(t)
	k := newKubeCluster(t, 1, "host-gw")
	// kubectl auth can-i answers no for a resource the apiserver does
	// not serve.
	if out, err := k.api.Kubectl("apply", "--server-side", "-f", kubetest.ClusterPolicyCRD(t)); err != nil {
		t.Fatalf("kubectl apply the ClusterNetworkPolicy CRD: %v\n%s", err, out)
	}
	sa := "--as=system:serviceaccount:kube-twill:twill"
	for _, tc := range []struct {
		verb, resource string
		sub            string
		allowed        bool
	}{
		{"get", "nodes", "", true}, {"list", "nodes", "", true}, {"watch", "nodes", "", true},
		{"patch", "nodes", "status", true},
		{"patch", "nodes", "", false}, {"update", "nodes", "", false}, {"delete", "nodes", "", false},
		{"update", "nodes", "status", false}, {"create", "nodes", "", false},
		// --network-policy reads pods, namespaces and policies, and
		// writes none of them.
		{"list", "pods", "", true}, {"watch", "namespaces", "", true}, {"list", "networkpolicies.networking.k8s.io", "", true},
		{"create", "pods", "", false}, {"delete", "pods", "", false}, {"update", "namespaces", "", false},
		{"create", "networkpolicies.networking.k8s.io", "", false}, {"get", "pods", "log", false},
		// ClusterNetworkPolicies: read, and their status patched.
		{"watch", "clusternetworkpolicies.policy.networking.k8s.io", "", true}, {"patch", "clusternetworkpolicies.policy.networking.k8s.io", "status", true},
		{"patch", "clusternetworkpolicies.policy.networking.k8s.io", "", false}, {"create", "clusternetworkpolicies.policy.networking.k8s.io", "", false},
		{"update", "clusternetworkpolicies.policy.networking.k8s.io", "status", false},
		{"get", "secrets", "", false}, {"list", "configmaps", "", false},
		{"create", "serviceaccounts/token", "", false},
	} {
		args := []string{"auth", "can-i", sa, tc.verb, tc.resource}
		if tc.sub != "" {
			args = append(args, "--subresource="+tc.sub)
		}
		out, _ := k.api.Kubectl(args...)
		lines := strings.Fields(out) // kubectl may print a warning first
		got := len(lines) > 0 && lines[len(lines)-1] == "yes"
		if got != tc.allowed {
			t.Errorf("can-i %s %s %s: %q, want allowed=%v", tc.verb, tc.resource, tc.sub, strings.TrimSpace(out), tc.allowed)
		}
	}
}
