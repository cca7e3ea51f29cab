package policy

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/twill-net/twill/policy/cnpapi"
)

func testCNP(name string, tier cnpapi.Tier, prio int32, spec func(*cnpapi.Spec)) *cnpapi.ClusterNetworkPolicy {
	p := &cnpapi.ClusterNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: cnpapi.Spec{Tier: tier, Priority: prio, Subject: cnpapi.Subject{Namespaces: &metav1.LabelSelector{
			MatchLabels: map[string]string{"kubernetes.io/metadata.name": "x"}}}}}
	if spec != nil {
		spec(&p.Spec)
	}
	return p
}

func fromNS(ns string, action cnpapi.Action, protos ...cnpapi.Protocol) cnpapi.IngressRule {
	return cnpapi.IngressRule{Action: action, Protocols: protos, From: []cnpapi.IngressPeer{{Namespaces: &metav1.LabelSelector{
		MatchLabels: map[string]string{"kubernetes.io/metadata.name": ns}}}}}
}

func tcp(port int32) cnpapi.Protocol {
	return cnpapi.Protocol{TCP: &cnpapi.PortMatch{DestinationPort: &cnpapi.Port{Number: port}}}
}

// allowFromY is a NetworkPolicy of namespace x letting namespace y's
// pods reach x/a.
var allowFromY = testPolicy("x", "from-y", map[string]string{"pod": "a"}, func(sp *networkingv1.NetworkPolicySpec) {
	sp.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{
		MatchLabels: map[string]string{"team": "y"}}}}}}
})

// verdict runs y/a (10.244.1.3) → x/a (10.244.1.2) on TCP port through
// the table compiled from s.
func verdict(t *testing.T, s Snapshot, port uint16) Trace {
	t.Helper()
	r := Compile(s)
	return Evaluate(r.Ruleset, Packet{Src: netip.MustParseAddr("10.244.1.3"), Dst: netip.MustParseAddr("10.244.1.2"), Proto: unix.IPPROTO_TCP, Port: port})
}

// TestTiersOrder: the Admin tier decides before NetworkPolicy, the
// Baseline tier after it; Pass goes on to NetworkPolicy; priority orders
// the Admin tier.
func TestTiersOrder(t *testing.T) {
	for _, tc := range []struct {
		name    string
		nps     []*networkingv1.NetworkPolicy
		cnps    []*cnpapi.ClusterNetworkPolicy
		allowed bool
		why     string
	}{
		{"an Admin Deny beats a NetworkPolicy that allows", []*networkingv1.NetworkPolicy{allowFromY},
			[]*cnpapi.ClusterNetworkPolicy{testCNP("deny-y", cnpapi.Admin, 10, func(s *cnpapi.Spec) { s.Ingress = []cnpapi.IngressRule{fromNS("y", cnpapi.Deny)} })},
			false, "ClusterNetworkPolicy/deny-y spec.ingress[0]"},
		{"a Baseline Deny loses to a NetworkPolicy that allows", []*networkingv1.NetworkPolicy{allowFromY},
			[]*cnpapi.ClusterNetworkPolicy{testCNP("deny-y", cnpapi.Baseline, 10, func(s *cnpapi.Spec) { s.Ingress = []cnpapi.IngressRule{fromNS("y", cnpapi.Deny)} })},
			true, "x/from-y spec.ingress[0]"},
		{"a Baseline Deny decides for a pod no NetworkPolicy selects", nil,
			[]*cnpapi.ClusterNetworkPolicy{testCNP("deny-y", cnpapi.Baseline, 10, func(s *cnpapi.Spec) { s.Ingress = []cnpapi.IngressRule{fromNS("y", cnpapi.Deny)} })},
			false, "ClusterNetworkPolicy/deny-y spec.ingress[0]"},
		{"an Admin Accept beats a NetworkPolicy that isolates", []*networkingv1.NetworkPolicy{testPolicy("x", "deny-all", nil, nil)},
			[]*cnpapi.ClusterNetworkPolicy{testCNP("accept-y", cnpapi.Admin, 10, func(s *cnpapi.Spec) { s.Ingress = []cnpapi.IngressRule{fromNS("y", cnpapi.Accept)} })},
			true, "ClusterNetworkPolicy/accept-y spec.ingress[0]"},
		{"an Admin Pass skips the Admin tier's lower rules to NetworkPolicy", []*networkingv1.NetworkPolicy{allowFromY},
			[]*cnpapi.ClusterNetworkPolicy{
				testCNP("pass-y", cnpapi.Admin, 5, func(s *cnpapi.Spec) { s.Ingress = []cnpapi.IngressRule{fromNS("y", cnpapi.Pass)} }),
				testCNP("deny-y", cnpapi.Admin, 10, func(s *cnpapi.Spec) { s.Ingress = []cnpapi.IngressRule{fromNS("y", cnpapi.Deny)} })},
			true, "x/from-y spec.ingress[0]"},
		{"an Admin Pass with no NetworkPolicy reaches the Baseline tier", nil,
			[]*cnpapi.ClusterNetworkPolicy{
				testCNP("pass-y", cnpapi.Admin, 5, func(s *cnpapi.Spec) { s.Ingress = []cnpapi.IngressRule{fromNS("y", cnpapi.Pass)} }),
				testCNP("deny-y", cnpapi.Baseline, 0, func(s *cnpapi.Spec) { s.Ingress = []cnpapi.IngressRule{fromNS("y", cnpapi.Deny)} })},
			false, "ClusterNetworkPolicy/deny-y spec.ingress[0]"},
		{"the lower priority number decides first", nil,
			[]*cnpapi.ClusterNetworkPolicy{
				testCNP("b-deny", cnpapi.Admin, 20, func(s *cnpapi.Spec) { s.Ingress = []cnpapi.IngressRule{fromNS("y", cnpapi.Deny)} }),
				testCNP("a-accept", cnpapi.Admin, 30, func(s *cnpapi.Spec) { s.Ingress = []cnpapi.IngressRule{fromNS("y", cnpapi.Accept)} })},
			false, "ClusterNetworkPolicy/b-deny spec.ingress[0]"},
		{"within a policy, rules decide in order", nil,
			[]*cnpapi.ClusterNetworkPolicy{testCNP("both", cnpapi.Admin, 1, func(s *cnpapi.Spec) {
				s.Ingress = []cnpapi.IngressRule{fromNS("y", cnpapi.Accept, tcp(80)), fromNS("y", cnpapi.Deny)}
			})},
			true, "ClusterNetworkPolicy/both spec.ingress[0]"},
		{"a rule for another port does not match", nil,
			[]*cnpapi.ClusterNetworkPolicy{testCNP("deny-81", cnpapi.Admin, 1, func(s *cnpapi.Spec) { s.Ingress = []cnpapi.IngressRule{fromNS("y", cnpapi.Deny, tcp(81))} })},
			true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := snapshot(tc.nps...)
			s.ClusterPolicies = tc.cnps
			tr := verdict(t, s, 80)
			if tr.Allowed != tc.allowed {
				t.Fatalf("allowed %v, want %v: %+v", tr.Allowed, tc.allowed, tr)
			}
			if tc.why != "" && (len(tr.Steps) == 0 || tr.Steps[len(tr.Steps)-1].Why != tc.why) {
				t.Errorf("decided by %+v, want %q", tr.Steps, tc.why)
			}
			if p := Compile(s).Problems; len(p) > 0 {
				t.Errorf("problems: %v", p)
			}
		})
	}
}

// TestTiersEgressPeers: networks, nodes and named ports of egress rules.
func TestTiersEgressPeers(t *testing.T) {
	s := snapshot()
	s.Nodes = []*corev1.Node{{ObjectMeta: metav1.ObjectMeta{Name: "n2", Labels: map[string]string{"role": "db"}},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.168.0.2"}, {Type: corev1.NodeHostName, Address: "n2"}}}}}
	s.ClusterPolicies = []*cnpapi.ClusterNetworkPolicy{testCNP("egress", cnpapi.Admin, 1, func(sp *cnpapi.Spec) {
		sp.Egress = []cnpapi.EgressRule{
			{Action: cnpapi.Accept, To: []cnpapi.EgressPeer{{Pods: &cnpapi.NamespacedPod{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"pod": "b"}}}}},
				Protocols: []cnpapi.Protocol{{DestinationNamedPort: "serve-80-tcp"}}},
			{Action: cnpapi.Deny, To: []cnpapi.EgressPeer{{Networks: []string{"10.244.2.0/24"}}}},
			{Action: cnpapi.Deny, To: []cnpapi.EgressPeer{{Nodes: &metav1.LabelSelector{MatchLabels: map[string]string{"role": "db"}}}},
				Protocols: []cnpapi.Protocol{{TCP: &cnpapi.PortMatch{DestinationPort: &cnpapi.Port{Range: &cnpapi.PortRange{Start: 6000, End: 6999}}}}}},
		}
	})}
	rs := Compile(s)
	if len(rs.Problems) > 0 {
		t.Fatalf("problems: %v", rs.Problems)
	}
	for _, tc := range []struct {
		dst     string
		port    uint16
		allowed bool
	}{
		{"10.244.2.2", 8080, true},  // x/b's serve-80-tcp
		{"10.244.2.2", 80, false},   // not x/b's named port: the network's Deny
		{"10.244.2.3", 8080, false}, // y/c: no such port
		{"192.168.0.2", 5432, true},
		{"192.168.0.2", 6500, false},
		{"10.244.1.3", 80, true}, // a local pod, outside 10.244.2.0/24
	} {
		tr := Evaluate(rs.Ruleset, Packet{Src: netip.MustParseAddr("10.244.1.2"), Dst: netip.MustParseAddr(tc.dst), Proto: unix.IPPROTO_TCP, Port: tc.port})
		if tr.Allowed != tc.allowed {
			t.Errorf("x/a -> %s:%d allowed %v, want %v (%+v)", tc.dst, tc.port, tr.Allowed, tc.allowed, tr.Steps)
		}
	}
}

// TestTiersFailClosed: a rule twill cannot read in full is never
// half-enforced: an Accept allows nothing it did not read, a Deny denies
// all; the problem names the field.
func TestTiersFailClosed(t *testing.T) {
	s := snapshot()
	s.ClusterPolicies = []*cnpapi.ClusterNetworkPolicy{
		testCNP("fqdn", cnpapi.Admin, 1, func(sp *cnpapi.Spec) {
			sp.Egress = []cnpapi.EgressRule{{Action: cnpapi.Accept, To: []cnpapi.EgressPeer{{DomainNames: []string{"example.com"}}}}}
		}),
		testCNP("empty-peer", cnpapi.Admin, 2, func(sp *cnpapi.Spec) {
			sp.Ingress = []cnpapi.IngressRule{{Action: cnpapi.Deny, From: []cnpapi.IngressPeer{{}}}}
		}),
	}
	r := Compile(s)
	var msgs []string
	for _, p := range r.Problems {
		msgs = append(msgs, p.Policy+": "+p.Err.Error())
	}
	all := strings.Join(msgs, "\n")
	for _, want := range []string{"ClusterNetworkPolicy/fqdn: spec.egress[0].to[0].domainNames: not supported", "ClusterNetworkPolicy/empty-peer: spec.ingress[0].from[0]"} {
		if !strings.Contains(all, want) {
			t.Errorf("problems %q, want one saying %q", all, want)
		}
	}
	// The Deny with a peer it cannot read denies every source.
	if tr := verdict(t, s, 80); tr.Allowed {
		t.Errorf("y/a -> x/a allowed through a Deny rule twill could not read: %+v", tr)
	}
	// The Accept to a domain name lets nothing through the Deny below it.
	s.ClusterPolicies = append(s.ClusterPolicies, testCNP("deny-out", cnpapi.Admin, 3, func(sp *cnpapi.Spec) {
		sp.Egress = []cnpapi.EgressRule{{Action: cnpapi.Deny, To: []cnpapi.EgressPeer{{Networks: []string{"0.0.0.0/0"}}}}}
	}))
	tr := Evaluate(Compile(s).Ruleset, Packet{Src: netip.MustParseAddr("10.244.1.2"), Dst: netip.MustParseAddr("93.184.216.34"), Proto: unix.IPPROTO_TCP, Port: 443})
	if tr.Allowed {
		t.Errorf("x/a -> 93.184.216.34 allowed by a domainNames Accept twill does not enforce: %+v", tr)
	}
}

// TestTiersSelectNothingChangesNothing: policies that select no pod
// leave the table as NetworkPolicy alone makes it.
func TestTiersSelectNothingChangesNothing(t *testing.T) {
	s := snapshot(allowFromY)
	want := Compile(s).Ruleset
	s.ClusterPolicies = []*cnpapi.ClusterNetworkPolicy{testCNP("nobody", cnpapi.Admin, 1, func(sp *cnpapi.Spec) {
		sp.Subject = cnpapi.Subject{Namespaces: &metav1.LabelSelector{MatchLabels: map[string]string{"no": "such"}}}
		sp.Ingress = []cnpapi.IngressRule{fromNS("y", cnpapi.Deny)}
	})}
	got := Compile(s).Ruleset
	if len(got.Chains) != len(want.Chains) || len(got.Sets) != len(want.Sets) {
		t.Errorf("a policy selecting nothing changed the table: %v, want %v", chainNames(got), chainNames(want))
	}
}

// TestTiersUnknownFields: a rule holding a field of a newer API fails
// closed; a newer field elsewhere in the spec refuses the policy whole;
// each says which field.
func TestTiersUnknownFields(t *testing.T) {
	deny := testCNP("newer-deny", cnpapi.Admin, 1, func(sp *cnpapi.Spec) {
		sp.Ingress = []cnpapi.IngressRule{fromNS("nobody", cnpapi.Deny)}
	})
	deny.Unknown = []string{"spec.ingress[0].from[0].services"}
	s := snapshot()
	s.ClusterPolicies = []*cnpapi.ClusterNetworkPolicy{deny}
	r := Compile(s)
	if len(r.Problems) != 1 || !strings.Contains(r.Problems[0].Err.Error(), "spec.ingress[0].from[0].services") {
		t.Errorf("problems %v, want one naming spec.ingress[0].from[0].services", r.Problems)
	}
	if tr := verdict(t, s, 80); tr.Allowed {
		t.Errorf("a Deny rule with a field twill does not know let y/a reach x/a: %+v", tr)
	}
	refused := testCNP("newer-spec", cnpapi.Admin, 1, func(sp *cnpapi.Spec) {
		sp.Ingress = []cnpapi.IngressRule{fromNS("y", cnpapi.Deny)}
	})
	refused.Unknown = []string{"spec.mode"}
	s.ClusterPolicies = []*cnpapi.ClusterNetworkPolicy{refused}
	r = Compile(s)
	if len(r.Problems) != 1 || !strings.Contains(r.Problems[0].Err.Error(), "spec.mode") || !strings.Contains(r.Problems[0].Err.Error(), "not enforced") {
		t.Errorf("problems %v, want one naming spec.mode and saying it is not enforced", r.Problems)
	}
	if slices.Contains(chainNames(r.Ruleset), "in:x/a") {
		t.Errorf("a refused policy made chains: %v", chainNames(r.Ruleset))
	}
}

// TestTiersProblemsOnEveryNode: a policy's problems are reported by a
// node where it selects no pod too (the node writing its status may be
// one), once each, and without a set of its in the table.
func TestTiersProblemsOnEveryNode(t *testing.T) {
	s := snapshot(allowFromY)
	want := Compile(s).Ruleset
	s.ClusterPolicies = []*cnpapi.ClusterNetworkPolicy{testCNP("elsewhere", cnpapi.Admin, 1, func(sp *cnpapi.Spec) {
		sp.Subject = cnpapi.Subject{Pods: &cnpapi.NamespacedPod{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"pod": "c"}}}} // y/c, on n2
		sp.Egress = []cnpapi.EgressRule{{Action: cnpapi.Accept, To: []cnpapi.EgressPeer{{DomainNames: []string{"example.com"}}, {Pods: &cnpapi.NamespacedPod{}}}}}
	})}
	r := Compile(s)
	if len(r.Problems) != 1 || !strings.Contains(r.Problems[0].Err.Error(), "spec.egress[0].to[0].domainNames") {
		t.Errorf("problems on n1, where the policy selects no pod: %v, want one naming domainNames", r.Problems)
	}
	if len(r.Ruleset.Sets) != len(want.Sets) || len(r.Ruleset.Chains) != len(want.Chains) {
		t.Errorf("checking a policy that selects no local pod changed the table: sets %d, want %d", len(r.Ruleset.Sets), len(want.Sets))
	}
	s.Node = "n2"
	if r := Compile(s); len(r.Problems) != 1 {
		t.Errorf("problems on n2, where it selects y/c: %v, want the same one, once", r.Problems)
	}
}

// TestTiersSubsetKeepsTheRestChain: a pod's subset (what explain compares
// with the node's) holds its rest chain, so a Pass decides in it as in the
// whole table.
func TestTiersSubsetKeepsTheRestChain(t *testing.T) {
	s := snapshot(allowFromY)
	s.ClusterPolicies = []*cnpapi.ClusterNetworkPolicy{testCNP("pass-y", cnpapi.Admin, 1, func(sp *cnpapi.Spec) { sp.Ingress = []cnpapi.IngressRule{fromNS("y", cnpapi.Pass)} })}
	full := Compile(s).Ruleset
	sub := full.Subset([]string{"x/a"}, []string{"10.244.1.2", "10.244.1.3"})
	if !slices.Contains(chainNames(sub), RestChainName("in", "x/a")) {
		t.Fatalf("x/a's subset lacks its rest chain: %v", chainNames(sub))
	}
	pkt := Packet{Src: netip.MustParseAddr("10.244.1.3"), Dst: netip.MustParseAddr("10.244.1.2"), Proto: unix.IPPROTO_TCP, Port: 80}
	sub.Chains = append([]Chain{{Name: ChainForward, Rules: full.Chains[0].Rules}}, sub.Chains...)
	if a, b := Evaluate(full, pkt), Evaluate(sub, pkt); a.Allowed != b.Allowed || len(a.Steps) != len(b.Steps) {
		t.Errorf("the subset decides otherwise: %+v, the whole table %+v", b, a)
	}
}

// TestAdminTierSharedByThePodsItSelects: the local pods the same Admin
// policies select share one chain of their rules, so that the table grows
// by a rule or two per pod, not by the policies' rules; each pod still
// gets the tiers' verdicts, a Pass going on to its own NetworkPolicies.
func TestAdminTierSharedByThePodsItSelects(t *testing.T) {
	cnps := []*cnpapi.ClusterNetworkPolicy{
		testCNP("accept-y", cnpapi.Admin, 0, func(s *cnpapi.Spec) { s.Ingress = []cnpapi.IngressRule{fromNS("y", cnpapi.Accept, tcp(9000))} }),
		testCNP("pass-y", cnpapi.Admin, 1, func(s *cnpapi.Spec) { s.Ingress = []cnpapi.IngressRule{fromNS("y", cnpapi.Pass, tcp(80))} }),
		testCNP("deny-y", cnpapi.Admin, 2, func(s *cnpapi.Spec) { s.Ingress = []cnpapi.IngressRule{fromNS("y", cnpapi.Deny)} }),
	}
	isolateA := testPolicy("x", "only-from-x", map[string]string{"pod": "a"}, func(sp *networkingv1.NetworkPolicySpec) {
		sp.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{}}}}}
	})
	withPods := func(n int) Snapshot {
		s := snapshot(isolateA)
		s.ClusterPolicies = cnps
		for i := range n {
			s.Pods = append(s.Pods, testPod("x", fmt.Sprint("e", i), "n1", fmt.Sprint("10.244.1.", 10+i), map[string]string{"pod": "e"}))
		}
		return s
	}
	rules := func(rs Ruleset) int {
		n := 0
		for _, c := range rs.Chains {
			n += len(c.Rules)
		}
		return n
	}
	few, many := Compile(withPods(10)).Ruleset, Compile(withPods(40)).Ruleset
	if grew := rules(many) - rules(few); grew > 2*30 {
		t.Errorf("30 more pods the same Admin policies select: %d more rules, want at most 2 each", grew)
	}
	shared := func(pod string) string {
		c := rawChain(t, many, ChainName("in", pod))
		return c.Rules[len(c.Rules)-1].Target
	}
	if a, e := shared("x/a"), shared("x/e7"); a != e || !IsShared(a) {
		t.Errorf("x/a's chain goes to %q, x/e7's to %q: want one shared chain", a, e)
	}
	for _, tc := range []struct {
		dst     string
		port    uint16
		allowed bool
		why     string
	}{
		{"10.244.1.2", 9000, true, "ClusterNetworkPolicy/accept-y spec.ingress[0]"},
		{"10.244.1.17", 9000, true, "ClusterNetworkPolicy/accept-y spec.ingress[0]"},
		{"10.244.1.2", 80, false, ""}, // passed on to x/a's NetworkPolicy: not from x
		{"10.244.1.17", 80, true, ""}, // passed on: x/e7 has no NetworkPolicy
		{"10.244.1.17", 22, false, "ClusterNetworkPolicy/deny-y spec.ingress[0]"},
	} {
		tr := Evaluate(many, Packet{Src: netip.MustParseAddr("10.244.1.3"), Dst: netip.MustParseAddr(tc.dst), Proto: unix.IPPROTO_TCP, Port: tc.port})
		var why []string
		for _, st := range tr.Steps {
			if st.Verdict != Goto {
				why = append(why, st.Why)
			}
		}
		if tr.Allowed != tc.allowed || tc.why != "" && !slices.Contains(why, tc.why) {
			t.Errorf("y/a → %s:%d: %+v, want allowed %v by %q", tc.dst, tc.port, tr, tc.allowed, tc.why)
		}
	}
}
