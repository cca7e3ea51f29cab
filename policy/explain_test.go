package policy

import (
	"net/netip"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

func testNode(name, cidr string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.NodeSpec{PodCIDR: cidr, PodCIDRs: []string{cidr}}}
}

// TestExplain: Explain names the rule that lets a connection through, the
// default deny that drops it, and says when no policy selects either pod.
func TestExplain(t *testing.T) {
	port80 := intstr.FromInt32(80)
	s := snapshot(
		testPolicy("x", "web", map[string]string{"pod": "a"}, func(sp *networkingv1.NetworkPolicySpec) {
			sp.Ingress = []networkingv1.NetworkPolicyIngressRule{
				{From: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"pod": "c"}}}}},
				{From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "y"}}}},
					Ports: []networkingv1.NetworkPolicyPort{{Port: &port80}}},
			}
		}),
		testPolicy("y", "no-egress", map[string]string{"pod": "c"}, func(sp *networkingv1.NetworkPolicySpec) {
			sp.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
		}))
	c := &Cluster{Nodes: []*corev1.Node{testNode("n1", "10.244.1.0/24"), testNode("n2", "10.244.2.0/24")},
		Pods: s.Pods, Namespaces: s.Namespaces, Policies: s.Policies}
	for _, tc := range []struct {
		from, to string
		port     uint16
		allowed  bool
		egress   string
		ingress  string
	}{
		{"y/a", "x/a", 80, true, "allowed: no policy selects y/a for egress", "allowed by x/web spec.ingress[1]"},
		{"y/a", "x/a", 81, false, "allowed: no policy", `denied: x/a is isolated for ingress and no rule of the policies that select it allows this ("deny ingress x/a")`},
		{"x/b", "x/a", 80, false, "allowed: no policy", "denied: x/a is isolated for ingress"},
		{"y/c", "x/a", 81, false, `denied: y/c is isolated for egress`, "denied: x/a is isolated for ingress"},
		{"y/c", "y/a", 80, false, `denied: y/c is isolated for egress`, "allowed: no policy selects y/a"},
		{"x/a", "y/a", 80, true, "allowed: no policy selects x/a for egress", "allowed: no policy selects y/a for ingress"},
	} {
		a, err := c.Explain(Query{From: tc.from, To: tc.to, Proto: unix.IPPROTO_TCP, Port: tc.port})
		if err != nil {
			t.Fatal(err)
		}
		if a.Allowed != tc.allowed || !strings.HasPrefix(a.Egress, tc.egress) || !strings.HasPrefix(a.Ingress, tc.ingress) {
			t.Errorf("%s -> %s %d: got %s\nwant allowed %v, egress %q…, ingress %q…", tc.from, tc.to, tc.port, a, tc.allowed, tc.egress, tc.ingress)
		}
	}
	if _, err := c.Explain(Query{From: "x/pending", To: "x/a", Proto: unix.IPPROTO_TCP, Port: 80}); err == nil || !strings.Contains(err.Error(), "x/pending") {
		t.Errorf("a pod without an address: err %v, want one naming it", err)
	}
	if _, err := c.Explain(Query{From: "x", To: "x/a"}); err == nil || !strings.Contains(err.Error(), `"x"`) {
		t.Errorf("a malformed pod name: err %v, want one naming it", err)
	}
}

// TestEvaluateEstablished: replies of an allowed connection pass, whatever
// isolates their source.
func TestEvaluateEstablished(t *testing.T) {
	r := Compile(snapshot(testPolicy("x", "deny", nil, nil)))
	p := Packet{Src: netip.MustParseAddr("10.244.2.3"), Dst: netip.MustParseAddr("10.244.1.2"), Proto: unix.IPPROTO_TCP, Port: 80}
	if tr := Evaluate(r.Ruleset, p); tr.Allowed || len(tr.Steps) != 1 || tr.Steps[0].Comment != "deny ingress x/a" {
		t.Errorf("new connection to a deny-all pod: %+v, want dropped by its chain's deny", tr)
	}
	p.Established = true
	if tr := Evaluate(r.Ruleset, p); !tr.Allowed {
		t.Errorf("established packet: %+v, want allowed", tr)
	}
	p.Established, p.Src, p.Dst = false, netip.MustParseAddr("10.244.1.9"), netip.MustParseAddr("10.244.2.3")
	if tr := Evaluate(r.Ruleset, p); tr.Allowed || tr.Steps[0].Comment != "unknown source" {
		t.Errorf("from an address twilld does not know: %+v, want dropped as unknown", tr)
	}
}

func TestParsePort(t *testing.T) {
	for in, want := range map[string]uint16{"80": 80, "80/tcp": 80, "53/UDP": 53, "9/sctp": 9} {
		if _, p, err := ParsePort(in); err != nil || p != want {
			t.Errorf("ParsePort(%q) = %d, %v", in, p, err)
		}
	}
	for _, in := range []string{"", "0", "65536", "80/icmp", "http", "080", "80/"} {
		if _, _, err := ParsePort(in); err == nil || !strings.Contains(err.Error(), in) {
			t.Errorf("ParsePort(%q): err %v, want one naming it", in, err)
		}
	}
}

// TestLogRules: denied packets are logged per isolated pod, with the
// packets over the rate counted; a namespace annotated
// twill.io/log-allowed=true has its pods' allowed connections logged; and
// LogOff (the verdict log cannot read) writes no log rule at all.
func TestLogRules(t *testing.T) {
	s := snapshot(testPolicy("x", "deny", nil, nil))
	s.LogDenied = true
	s.Namespaces[1].Annotations = map[string]string{LogAllowedAnnotation: "true"} // y: y/a on n1
	count := func(rs Ruleset) (logs, unlogged int, allowed []string) {
		for _, c := range rs.Chains {
			for _, r := range c.Rules {
				switch {
				case r.Log != "" && strings.HasPrefix(r.Log, "twill allow"):
					allowed = append(allowed, r.Src.Set+r.Dst.Set)
				case r.Log != "":
					logs++
				case r.LimitOver:
					unlogged++
				}
			}
		}
		return logs, unlogged, allowed
	}
	rs := Compile(s).Ruleset
	if logs, unlogged, allowed := count(rs); logs != 1 || unlogged != 1 || len(allowed) != 2 {
		t.Errorf("got %d deny logs, %d unlogged counters, allowed logs on %v; want 1, 1, and both directions of log-allowed4", logs, unlogged, allowed)
	}
	if tr := Evaluate(rs, Packet{Src: netip.MustParseAddr("10.244.1.3"), Dst: netip.MustParseAddr("10.244.2.3"), Proto: unix.IPPROTO_TCP, Port: 80}); !tr.Allowed {
		t.Errorf("y/a's own connection, logged: %+v, want allowed", tr)
	}
	for _, st := range rs.Sets {
		if st.Name == "log-allowed4" && (len(st.Elems) != 1 || st.Elems[0] != netip.MustParseAddr("10.244.1.3")) {
			t.Errorf("log-allowed4 = %v, want y/a's address alone", st.Elems)
		}
	}
	s.LogOff = true
	if logs, unlogged, allowed := count(Compile(s).Ruleset); logs+unlogged+len(allowed) != 0 {
		t.Errorf("LogOff: %d log rules, %d counters, %v allowed logs; want none", logs, unlogged, allowed)
	}
}
