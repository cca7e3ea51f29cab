package policy

import (
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/twill-net/twill/policy/cnpapi"
	"github.com/twill-net/twill/testsupport/netnstest"
)

// node is a node namespace forwarding between pod namespaces, each wired
// as the twill plugin wires a pod: a veth, a /32, a route to it.
type node struct {
	t    testing.TB
	name string
	pods map[string]string // address → namespace
	tb   *Table
}

func newNode(t testing.TB) *node {
	n := &node{t: t, name: netnstest.New(t, "pol"), pods: map[string]string{}}
	netnstest.IP(t, n.name, "link", "set", "lo", "up")
	if out, err := netnstest.Exec(n.name, "sysctl", "-qw", "net.ipv4.ip_forward=1"); err != nil {
		t.Fatalf("enabling forwarding: %v: %s", err, out)
	}
	f, err := os.Open("/var/run/netns/" + n.name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	n.tb = &Table{NetNS: int(f.Fd())}
	return n
}

func (n *node) pod(ip string, v6 ...string) {
	ns := netnstest.New(n.t, "pod")
	host := "v" + strings.ReplaceAll(ip, ".", "")[5:]
	netnstest.Veth(n.t, n.name, host, ns, "eth0")
	netnstest.IP(n.t, ns, "addr", "add", ip+"/32", "dev", "eth0")
	netnstest.IP(n.t, ns, "route", "add", "169.254.1.1", "dev", "eth0", "scope", "link")
	netnstest.IP(n.t, ns, "route", "add", "default", "via", "169.254.1.1", "dev", "eth0", "onlink")
	netnstest.IP(n.t, n.name, "route", "add", ip+"/32", "dev", host)
	netnstest.IP(n.t, n.name, "addr", "add", "169.254.1.1/32", "dev", host)
	n.pods[ip] = ns
	for _, a := range v6 {
		// The IPv6 gateway is the host end's link-local address.
		netnstest.IP(n.t, n.name, "addr", "add", "fe80::1/64", "dev", host, "nodad")
		netnstest.IP(n.t, ns, "-6", "addr", "add", a+"/128", "dev", "eth0", "nodad")
		netnstest.IP(n.t, ns, "-6", "route", "add", "default", "via", "fe80::1", "dev", "eth0")
		netnstest.IP(n.t, n.name, "-6", "route", "add", a+"/128", "dev", host)
		n.pods[a] = ns
	}
}

// reaches says whether a ping from one pod to another gets an answer.
func (n *node) reaches(from, to string) bool {
	_, err := netnstest.Exec(n.pods[from], "ping", "-c1", "-W1", to)
	return err == nil
}

// dualStackNode is a node forwarding both families with two dual-stack
// pods of namespace x, and the snapshot that holds them: x/server
// (app=server) at .2 and ::2, x/client (role=client) at .3 and ::3.
func dualStackNode(t *testing.T) (*node, Snapshot) {
	n := newNode(t)
	if out, err := netnstest.Exec(n.name, "sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"); err != nil {
		t.Fatalf("enabling IPv6 forwarding: %v: %s", err, out)
	}
	n.pod("10.244.1.2", "fd00:10:1::2")
	n.pod("10.244.1.3", "fd00:10:1::3")
	return n, Snapshot{Node: "n1",
		LocalCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24"), netip.MustParsePrefix("fd00:10:1::/64")},
		Namespaces: []*corev1.Namespace{testNS("x", nil)},
		Pods: []*corev1.Pod{
			dualPod(testPod("x", "server", "n1", "10.244.1.2", map[string]string{"app": "server"}), "fd00:10:1::2"),
			dualPod(testPod("x", "client", "n1", "10.244.1.3", map[string]string{"role": "client"}), "fd00:10:1::3"),
		},
	}
}

// dualPod gives p an IPv6 address after its IPv4 one.
func dualPod(p *corev1.Pod, v6 string) *corev1.Pod {
	p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: v6})
	return p
}

// TestPrivilegedPolicyDualStack: one policy isolates a dual-stack pod in
// both families; its peers are allowed in both, and an IPv6 address no
// known pod holds is dropped like an IPv4 one.
func TestPrivilegedPolicyDualStack(t *testing.T) {
	n, s := dualStackNode(t)
	n.pod("10.244.1.4", "fd00:10:1::4")
	s.Policies = []*networkingv1.NetworkPolicy{testPolicy("x", "clients", map[string]string{"app": "server"}, func(sp *networkingv1.NetworkPolicySpec) {
		sp.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"role": "client"}}}}}}
	})}
	n.sync(s)
	for _, c := range []struct {
		from, to string
		want     bool
	}{
		{"10.244.1.3", "10.244.1.2", true}, {"fd00:10:1::3", "fd00:10:1::2", true}, // the client, both families
		{"fd00:10:1::4", "fd00:10:1::3", false}, {"fd00:10:1::3", "fd00:10:1::4", false}, // unknown IPv6 address
	} {
		if got := n.reaches(c.from, c.to); got != c.want {
			t.Errorf("%s -> %s: reached %v, want %v", c.from, c.to, got, c.want)
		}
	}
	// .4 becomes a known pod without the client's label: refused in both
	// families, though it may now send and receive.
	s.Pods = append(s.Pods, dualPod(testPod("x", "other", "n1", "10.244.1.4", nil), "fd00:10:1::4"))
	n.sync(s)
	for _, c := range []struct {
		from, to string
		want     bool
	}{
		{"10.244.1.4", "10.244.1.2", false}, {"fd00:10:1::4", "fd00:10:1::2", false},
		{"fd00:10:1::4", "fd00:10:1::3", true},
	} {
		if got := n.reaches(c.from, c.to); got != c.want {
			t.Errorf("%s -> %s: reached %v, want %v", c.from, c.to, got, c.want)
		}
	}
}

func (n *node) sync(s Snapshot) Changes { return n.syncFrom(s, false) }

// syncFrom syncs, reading the kernel's table first when reread.
func (n *node) syncFrom(s Snapshot, reread bool) Changes {
	n.t.Helper()
	r := Compile(s)
	ch, err := n.tb.Sync(r.Ruleset, reread)
	if err != nil {
		n.t.Fatalf("Sync: %v", err)
	}
	return ch
}

func TestPrivilegedPolicyTableIsolatesAndRepairs(t *testing.T) {
	n := newNode(t)
	for _, ip := range []string{"10.244.1.2", "10.244.1.3", "10.244.1.4"} {
		n.pod(ip)
	}
	s := snapshot() // x/a at .2 and y/a at .3 on n1; nothing holds .4
	if ch := n.sync(s); !ch.Full {
		t.Errorf("first Sync = %+v, want the table written whole", ch)
	}
	if !n.reaches("10.244.1.2", "10.244.1.3") {
		out, _ := netnstest.Exec(n.name, "nft", "list", "ruleset")
		t.Fatalf("x/a cannot reach y/a with no policy:\n%s", out)
	}
	if n.reaches("10.244.1.2", "10.244.1.4") || n.reaches("10.244.1.4", "10.244.1.2") {
		t.Fatal("an address no known pod holds sent or received: it must be dropped until twilld knows its pod")
	}
	if ch := n.sync(s); !ch.Clean() {
		t.Errorf("second Sync of the same state wrote %+v, want nothing", ch)
	}
	// The kernel's table reads back as written, with the logging of
	// denied packets too: a drift check of an unchanged table writes
	// nothing (else it would rewrite it for ever).
	logged := s
	logged.LogDenied, logged.LogAllowed, logged.LogSample = true, true, 3
	logged.Policies = []*networkingv1.NetworkPolicy{testPolicy("x", "deny", nil, nil)}
	n.sync(logged)
	if ch := n.syncFrom(logged, true); !ch.Clean() {
		t.Errorf("Sync of the kernel's table, unchanged, wrote %+v, want nothing", ch)
	}
	if out, _ := netnstest.Exec(n.name, "nft", "list", "table", "inet", TableName); !strings.Contains(out, `limit rate 10/second burst 10 packets log prefix "twill deny ingress x/a" group 7163 snaplen 128`) ||
		!strings.Contains(out, `limit rate over 10/second burst 10 packets counter packets 0 bytes 0 comment "unlogged deny ingress x/a"`) ||
		!strings.Contains(out, `ip saddr @log-allowed4 numgen random mod 3 0 limit rate 100/second burst 100 packets log prefix "twill allow egress" group 7163 snaplen 128`) {
		t.Errorf("in:x/a does not log its denied packets (and count those over the rate), or x/a's allowed connections are not sampled:\n%s", out)
	}
	n.sync(s)

	s.Policies = append(s.Policies, testPolicy("y", "deny", nil, nil))
	n.sync(s)
	if n.reaches("10.244.1.2", "10.244.1.3") {
		t.Fatal("y/a reachable under a deny-all ingress policy")
	}
	if !n.reaches("10.244.1.3", "10.244.1.2") {
		t.Fatal("y/a's own connections (and their replies) blocked by an ingress-only policy")
	}

	// A pod that appears with the label a policy allows is let in by a set
	// change alone.
	s.Policies = append(s.Policies, testPolicy("y", "from-x", nil, func(sp *networkingv1NetworkPolicySpec) {
		sp.Ingress = fromNamespaces("x")
	}))
	n.sync(s)
	// What twillctl status shows, from the kernel's table.
	isolated, exists, err := n.tb.Isolated()
	if err != nil || !exists || len(isolated) != 1 || !slices.Equal(isolated["y/a"].Ingress, []string{"y/deny", "y/from-x"}) || isolated["y/a"].Egress != nil {
		t.Errorf("Isolated() = %+v, %v, %v; want y/a isolated for ingress by y/deny and y/from-x", isolated, exists, err)
	}
	if !n.reaches("10.244.1.2", "10.244.1.3") {
		t.Fatal("x/a blocked though y/from-x allows namespace x")
	}
	s.Pods = append(s.Pods, testPod("x", "late", "n1", "10.244.1.4", nil))
	// known4 and from-x's set gain .4; no rule changes.
	if ch := n.sync(s); ch != (Changes{Elems: 2}) {
		t.Errorf("Sync after a new pod wrote %+v, want two set elements and nothing else", ch)
	}
	if !n.reaches("10.244.1.4", "10.244.1.3") {
		t.Fatal("x/late blocked once known, though namespace x is allowed")
	}

	// Drift: someone flushes the base chain; the next Sync puts it back.
	if out, err := netnstest.Exec(n.name, "nft", "flush", "chain", "inet", TableName, ChainForward); err != nil {
		t.Fatalf("nft flush: %v: %s", err, out)
	}
	if !n.reaches("10.244.1.4", "10.244.1.2") {
		t.Fatal("flushing the base chain should have opened everything")
	}
	s.Pods = s.Pods[:len(s.Pods)-1] // and x/late is gone
	if ch := n.syncFrom(s, true); ch.Chains == 0 {
		t.Errorf("Sync after a flush wrote %+v, want the base chain back", ch)
	}
	if n.reaches("10.244.1.2", "10.244.1.4") {
		t.Fatal("after the repair, the address of a pod that is gone is still reachable")
	}

	// Drift in a verdict map: y/a's jump deleted (its packets would skip
	// its chain) is put back by the next read of the kernel.
	m := JumpMap("in", false)
	if out, err := netnstest.Exec(n.name, "nft", "delete", "element", "inet", TableName, m, "{ 10.244.1.3 }"); err != nil {
		t.Fatalf("nft delete element: %v: %s", err, out)
	}
	if ch := n.syncFrom(s, true); ch != (Changes{Elems: 1}) {
		t.Errorf("Sync after y/a's jump was deleted wrote %+v, want that element back alone", ch)
	}
	if out, _ := netnstest.Exec(n.name, "nft", "list", "map", "inet", TableName, m); !strings.Contains(out, `10.244.1.3 : jump in:y/a`) {
		t.Errorf("%s lacks y/a's jump after the repair:\n%s", m, out)
	}

	if ok, err := n.tb.Delete(); err != nil || !ok {
		t.Fatalf("Delete = %v, %v", ok, err)
	}
	if !n.reaches("10.244.1.2", "10.244.1.4") {
		t.Fatal("Delete left enforcement behind")
	}
}

type networkingv1NetworkPolicySpec = networkingv1.NetworkPolicySpec

func fromNamespaces(ns string) []networkingv1.NetworkPolicyIngressRule {
	return []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{
		NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": ns}}}}}}
}

// TestPrivilegedPolicyClusterTiers: on a real kernel, ClusterNetworkPolicy
// tiers written as changes to a table already there (a shared Admin chain
// that looks up a rest map, whose elements go to the pod's rest chain),
// then taken away: each change is
// written as a diff, and pings answer as the tiers say.
func TestPrivilegedPolicyClusterTiers(t *testing.T) {
	n := newNode(t)
	for _, ip := range []string{"10.244.1.2", "10.244.1.3"} {
		n.pod(ip)
	}
	s := snapshot() // x/a at .2, y/a at .3
	n.sync(s)
	if !n.reaches("10.244.1.3", "10.244.1.2") {
		t.Fatal("y/a cannot reach x/a with no policy")
	}
	// An Admin Pass of y's pods, then an Admin Deny of them below it, and
	// a Baseline Deny: the Pass skips the Admin Deny, the Baseline denies.
	from := func(a cnpapi.Action) []cnpapi.IngressRule {
		return []cnpapi.IngressRule{{Action: a, From: []cnpapi.IngressPeer{{Namespaces: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "y"}}}}}}
	}
	s.ClusterPolicies = []*cnpapi.ClusterNetworkPolicy{
		testCNP("pass", cnpapi.Admin, 1, func(sp *cnpapi.Spec) { sp.Ingress = from(cnpapi.Pass) }),
		testCNP("deny", cnpapi.Admin, 2, func(sp *cnpapi.Spec) { sp.Ingress = from(cnpapi.Deny) }),
		testCNP("baseline", cnpapi.Baseline, 1, func(sp *cnpapi.Spec) { sp.Ingress = from(cnpapi.Deny) }),
	}
	if ch := n.sync(s); ch.Full {
		t.Errorf("the tiers were written as the whole table (%+v), want a change", ch)
	}
	if n.reaches("10.244.1.3", "10.244.1.2") {
		out, _ := netnstest.Exec(n.name, "nft", "list", "table", "inet", TableName)
		t.Fatalf("y/a reaches x/a through a Pass to a Baseline Deny:\n%s", out)
	}
	// twillctl status lists x/a, which ClusterNetworkPolicies alone select.
	want := []string{ClusterPolicyPrefix + "pass", ClusterPolicyPrefix + "deny", ClusterPolicyPrefix + "baseline"}
	if sel, _, err := n.tb.Isolated(); err != nil || len(sel) != 1 || !sameElems(sel["x/a"].Ingress, want) || sel["x/a"].Egress != nil {
		t.Errorf("Isolated() = %+v, %v; want x/a selected for ingress by %v", sel, err, want)
	}
	// An Admin Accept above them all lets it in.
	s.ClusterPolicies = append(s.ClusterPolicies, testCNP("accept", cnpapi.Admin, 0, func(sp *cnpapi.Spec) { sp.Ingress = from(cnpapi.Accept) }))
	n.sync(s)
	if !n.reaches("10.244.1.3", "10.244.1.2") {
		t.Fatal("y/a cannot reach x/a under an Admin Accept")
	}
	s.ClusterPolicies = nil
	if ch := n.sync(s); ch.Full || ch.Del == 0 {
		t.Errorf("taking the tiers away wrote %+v, want a change deleting their chains", ch)
	}
	if ch := n.syncFrom(s, true); !ch.Clean() {
		t.Errorf("the kernel's table differs from the one without tiers: a Sync wrote %+v", ch)
	}
}

// TestPrivilegedPolicyEgressToOwnNode: a pod's packets to its own node
// (the node's address, where hostPorts and hostNetwork pods listen) take
// the input hook, not forward; the pod's egress policy decides there too.
// The node's own connections to the pod are untouched, and a table an
// older twilld wrote (without the input chain) is rewritten whole.
func TestPrivilegedPolicyEgressToOwnNode(t *testing.T) {
	n := newNode(t)
	for _, ip := range []string{"10.244.1.2", "10.244.1.3"} {
		n.pod(ip)
	}
	netnstest.IP(t, n.name, "addr", "add", "192.0.2.1/32", "dev", "lo") // the node's address
	nodeReached := func(from string) bool {
		_, err := netnstest.Exec(n.pods[from], "ping", "-c1", "-W1", "192.0.2.1")
		return err == nil
	}
	s := snapshot() // x/a at .2, y/a at .3
	n.sync(s)
	if !nodeReached("10.244.1.2") {
		t.Fatal("x/a cannot reach its node with no policy")
	}
	s.Policies = []*networkingv1.NetworkPolicy{testPolicy("x", "no-egress", nil, func(sp *networkingv1.NetworkPolicySpec) {
		sp.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
	})}
	n.sync(s)
	if nodeReached("10.244.1.2") {
		out, _ := netnstest.Exec(n.name, "nft", "list", "table", "inet", TableName)
		t.Fatalf("x/a reaches its own node's address under a deny-all egress policy:\n%s", out)
	}
	if !nodeReached("10.244.1.3") {
		t.Fatal("y/a, which no policy selects, cannot reach its node")
	}
	if _, err := netnstest.Exec(n.name, "ping", "-c1", "-W1", "10.244.1.2"); err != nil {
		t.Fatal("the node cannot reach x/a (nor x/a answer it) under x/a's egress policy")
	}
	// A table without the input chain, as twilld before it wrote it.
	if out, err := netnstest.Exec(n.name, "nft", "delete", "chain", "inet", TableName, ChainInput); err != nil {
		t.Fatalf("nft delete chain: %v: %s", err, out)
	}
	if !nodeReached("10.244.1.2") {
		t.Fatal("x/a cannot reach its node once the input chain is gone")
	}
	if ch := n.syncFrom(s, true); !ch.Full {
		t.Errorf("Sync of a table without the input chain wrote %+v, want it whole", ch)
	}
	if nodeReached("10.244.1.2") {
		t.Fatal("x/a reaches its node after the input chain was put back")
	}
}

func sameElems(a, b []string) bool {
	return slices.Equal(slices.Sorted(slices.Values(a)), slices.Sorted(slices.Values(b)))
}

// TestPrivilegedPolicyIPv6NeighbourDiscovery: a pod's neighbour
// solicitations and advertisements reach its node through the input hook
// with the pod's own address as source, and conntrack never calls them
// established. A pod an egress policy isolates must still resolve its
// gateway and answer its node, or no IPv6 packet reaches it or leaves it.
func TestPrivilegedPolicyIPv6NeighbourDiscovery(t *testing.T) {
	n, s := dualStackNode(t)
	// The client may send to the server alone.
	s.Policies = []*networkingv1.NetworkPolicy{testPolicy("x", "client-out", map[string]string{"role": "client"}, func(sp *networkingv1.NetworkPolicySpec) {
		sp.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
		sp.Egress = []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "server"}}}}}}
	})}
	n.sync(s)
	for _, c := range []struct{ from, to string }{{"fd00:10:1::3", "fd00:10:1::2"}, {"fd00:10:1::2", "fd00:10:1::3"}} {
		// No neighbour known yet, on either side: each ping resolves.
		for _, ns := range []string{n.name, n.pods["fd00:10:1::2"], n.pods["fd00:10:1::3"]} {
			netnstest.IP(t, ns, "-6", "neigh", "flush", "all")
		}
		if !n.reaches(c.from, c.to) {
			out, _ := netnstest.Exec(n.name, "nft", "list", "table", "inet", TableName)
			t.Errorf("%s -> %s: no answer (the client's egress policy allows the server; its neighbour discovery must pass):\n%s", c.from, c.to, out)
		}
	}
}
