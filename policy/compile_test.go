package policy

import (
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

func testPod(ns, name, node, ip string, lbl map[string]string, ports ...corev1.ContainerPort) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: lbl},
		Spec:   corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Ports: ports}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	if ip != "" {
		p.Status.PodIP = ip
		p.Status.PodIPs = []corev1.PodIP{{IP: ip}}
	}
	return p
}

func testNS(name string, lbl map[string]string) *corev1.Namespace {
	l := map[string]string{"kubernetes.io/metadata.name": name}
	for k, v := range lbl {
		l[k] = v
	}
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: l}}
}

func testPolicy(ns, name string, sel map[string]string, spec func(*networkingv1.NetworkPolicySpec)) *networkingv1.NetworkPolicy {
	np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: sel}}}
	if spec != nil {
		spec(&np.Spec)
	}
	return np
}

func snapshot(policies ...*networkingv1.NetworkPolicy) Snapshot {
	return Snapshot{
		Node:       "n1",
		LocalCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")},
		Namespaces: []*corev1.Namespace{testNS("x", nil), testNS("y", map[string]string{"team": "y"})},
		Pods: []*corev1.Pod{
			testPod("x", "a", "n1", "10.244.1.2", map[string]string{"pod": "a"}, corev1.ContainerPort{Name: "serve-80-tcp", ContainerPort: 80}),
			testPod("x", "b", "n2", "10.244.2.2", map[string]string{"pod": "b"}, corev1.ContainerPort{Name: "serve-80-tcp", ContainerPort: 8080}),
			testPod("y", "a", "n1", "10.244.1.3", map[string]string{"pod": "a"}),
			testPod("y", "c", "n2", "10.244.2.3", map[string]string{"pod": "c"}),
			testPod("x", "pending", "n1", "", map[string]string{"pod": "a"}),
		},
		Policies: policies,
	}
}

// chain is a chain's rules past the "selected by" ones that open a pod's.
func chain(t *testing.T, rs Ruleset, name string) Chain {
	t.Helper()
	c := rawChain(t, rs, name)
	c.Rules = slices.DeleteFunc(slices.Clone(c.Rules), func(r Rule) bool { return r.Verdict == Continue })
	return c
}

func rawChain(t *testing.T, rs Ruleset, name string) Chain {
	t.Helper()
	i := slices.IndexFunc(rs.Chains, func(c Chain) bool { return c.Name == name })
	if i < 0 {
		t.Fatalf("no chain %q in %v", name, chainNames(rs))
	}
	return rs.Chains[i]
}

func chainNames(rs Ruleset) []string {
	var out []string
	for _, c := range rs.Chains {
		out = append(out, c.Name)
	}
	return out
}

func set(t *testing.T, rs Ruleset, name string) []netip.Addr {
	t.Helper()
	i := slices.IndexFunc(rs.Sets, func(s Set) bool { return s.Name == name })
	if i < 0 {
		t.Fatalf("no set %q", name)
	}
	return rs.Sets[i].Elems
}

func addrs(s ...string) []netip.Addr {
	var out []netip.Addr
	for _, a := range s {
		out = append(out, netip.MustParseAddr(a))
	}
	return out
}

func TestNoPolicyAllowsKnownPodsAndDropsUnknownAddresses(t *testing.T) {
	r := Compile(snapshot())
	if got := chainNames(r.Ruleset); !slices.Equal(got, BaseChains) {
		t.Fatalf("chains = %v, want the base chains alone", got)
	}
	if got, want := set(t, r.Ruleset, "known4"), addrs("10.244.1.2", "10.244.1.3"); !slices.Equal(got, want) {
		t.Errorf("known4 = %v, want the local pods' addresses %v", got, want)
	}
	base := rawChain(t, r.Ruleset, ChainForward)
	if len(base.Rules) != 5 || !base.Rules[0].Established ||
		base.Rules[1].Src.NotSet != "known4" || base.Rules[1].Verdict != Drop || base.Rules[2].Dst.NotSet != "known4" ||
		base.Rules[3].Src.VMap != JumpMap("eg", false) || base.Rules[4].Dst.VMap != JumpMap("in", false) ||
		base.Rules[3].Verdict != Continue || base.Rules[4].Verdict != Continue {
		t.Errorf("base chain = %+v, want established accept, drops of unknown local sources and destinations, then the (empty) jump maps by source and by destination", base.Rules)
	}
}

func TestDenyAllIngressIsolatesTheSelectedLocalPodsOnly(t *testing.T) {
	r := Compile(snapshot(testPolicy("x", "deny", nil, nil)))
	in := chain(t, r.Ruleset, "in:x/a")
	if len(in.Rules) != 1 || in.Rules[0].Verdict != Drop {
		t.Errorf("in:x/a = %+v, want a lone drop", in.Rules)
	}
	if slices.Contains(chainNames(r.Ruleset), "in:y/a") || slices.Contains(chainNames(r.Ruleset), "eg:x/a") {
		t.Errorf("chains = %v: a pod of another namespace, or egress, isolated", chainNames(r.Ruleset))
	}
	base := rawChain(t, r.Ruleset, ChainForward)
	last := base.Rules[len(base.Rules)-1]
	if last.Dst.VMap != JumpMap("in", false) || last.V6 {
		t.Errorf("base chain's last rule = %+v, want the IPv4 destination looked up in %s", last, JumpMap("in", false))
	}
	m := rawSet(t, r.Ruleset, JumpMap("in", false))
	if !slices.Equal(m.Elems, addrs("10.244.1.2")) || !slices.Equal(m.Jumps, []string{"in:x/a"}) {
		t.Errorf("%s = %v → %v, want 10.244.1.2 → in:x/a alone", m.Name, m.Elems, m.Jumps)
	}
	if s := r.Selected["x/a"]; !slices.Equal(s.Ingress, []string{"x/deny"}) || len(s.Egress) != 0 {
		t.Errorf("Selected[x/a] = %+v", s)
	}
	if first := rawChain(t, r.Ruleset, "in:x/a").Rules[0]; first.Comment != "selected by x/deny" || first.Verdict != Continue {
		t.Errorf("in:x/a opens with %+v, want the policy that selects it, with no verdict", first)
	}
}

func TestIngressFromSelectorsPortsAndBlocks(t *testing.T) {
	tcp, udp := corev1.ProtocolTCP, corev1.ProtocolUDP
	p80, named := intstr.FromInt32(80), intstr.FromString("serve-80-tcp")
	end := int32(90)
	np := testPolicy("x", "allow", map[string]string{"pod": "a"}, func(s *networkingv1.NetworkPolicySpec) {
		s.Ingress = []networkingv1.NetworkPolicyIngressRule{
			{From: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"pod": "b"}}}},
				Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &p80, EndPort: &end}}},
			{From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "y"}}}},
				Ports: []networkingv1.NetworkPolicyPort{{Port: &named}, {Protocol: &udp}}},
			{From: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/8", Except: []string{"10.244.2.0/24"}}}}},
		}
	})
	r := Compile(snapshot(np))
	in := chain(t, r.Ruleset, "in:x/a").Rules
	if len(in) != 5 {
		t.Fatalf("in:x/a has %d rules, want 4 allows and a drop: %+v", len(in), in)
	}
	if got := set(t, r.Ruleset, in[0].Src.Set); !slices.Equal(got, addrs("10.244.2.2")) {
		t.Errorf("rule 0's peers = %v, want x/b", got)
	}
	if in[0].Proto != unix.IPPROTO_TCP || in[0].PortLo != 80 || in[0].PortHi != 90 || in[0].Verdict != Return {
		t.Errorf("rule 0 = %+v, want tcp 80-90 return", in[0])
	}
	if got := set(t, r.Ruleset, in[1].Src.Set); !slices.Equal(got, addrs("10.244.1.3", "10.244.2.3")) {
		t.Errorf("rule 1's peers = %v, want namespace y's pods", got)
	}
	if in[1].PortLo != 80 || in[2].Proto != unix.IPPROTO_UDP || in[2].PortLo != 0 {
		t.Errorf("rules 1, 2 = %+v, %+v; want the named port resolved against x/a (80), then all of udp", in[1], in[2])
	}
	if in[3].Src.Prefix != netip.MustParsePrefix("10.0.0.0/8") || len(in[3].Src.Except) != 1 || in[3].Proto != 0 {
		t.Errorf("rule 3 = %+v, want the ipBlock with its except, any port", in[3])
	}
	if !strings.HasPrefix(in[0].Comment, "allow x/allow") || in[4].Verdict != Drop {
		t.Errorf("comments/verdicts: %q, last %+v", in[0].Comment, in[4])
	}
}

func TestEgressNamedPortIsEachDestinationsOwn(t *testing.T) {
	named := intstr.FromString("serve-80-tcp")
	np := testPolicy("x", "eg", map[string]string{"pod": "a"}, func(s *networkingv1.NetworkPolicySpec) {
		s.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
		s.Egress = []networkingv1.NetworkPolicyEgressRule{{Ports: []networkingv1.NetworkPolicyPort{{Port: &named}}}}
	})
	r := Compile(snapshot(np))
	eg := chain(t, r.Ruleset, "eg:x/a").Rules
	if len(eg) != 3 {
		t.Fatalf("eg:x/a = %+v, want one allow per port number and a drop", eg)
	}
	for i, want := range []struct {
		port uint16
		ip   string
	}{{80, "10.244.1.2"}, {8080, "10.244.2.2"}} {
		if eg[i].PortLo != want.port || !slices.Equal(set(t, r.Ruleset, eg[i].Dst.Set), addrs(want.ip)) {
			t.Errorf("rule %d = %+v, want port %d to %s", i, eg[i], want.port, want.ip)
		}
	}
	if slices.Contains(chainNames(r.Ruleset), "in:x/a") {
		t.Error("an egress-only policy isolated ingress")
	}
}

func TestBadPolicyFailsClosedAndSaysWhy(t *testing.T) {
	np := testPolicy("x", "bad", nil, func(s *networkingv1.NetworkPolicySpec) {
		s.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/33"}}}}}
	})
	r := Compile(snapshot(np))
	if len(r.Problems) != 1 || !strings.Contains(r.Problems[0].Err.Error(), `ipBlock.cidr "10.0.0.0/33"`) || r.Problems[0].Policy != "x/bad" {
		t.Fatalf("problems = %+v, want one naming x/bad's ipBlock.cidr and its value", r.Problems)
	}
	if in := chain(t, r.Ruleset, "in:x/a").Rules; len(in) != 1 || in[0].Verdict != Drop {
		t.Errorf("in:x/a = %+v, want the drop alone: a rule that cannot be read allows nothing", in)
	}
}

// An address the CNI plugin gave that no API pod holds (a CRI client other
// than kubelet made the pod) is dropped for UnmanagedGrace, then allowed
// like an unselected pod, unless a pod placed on the node still lacks its
// address (the address may be that pod's).
func TestUnmanagedAddressesAfterTheGrace(t *testing.T) {
	now := time.Now()
	s := snapshot(testPolicy("x", "deny", nil, nil))
	s.Now = now
	s.Allocations = []Allocation{
		{IP: netip.MustParseAddr("10.244.1.2"), At: now.Add(-time.Minute)},  // x/a's
		{IP: netip.MustParseAddr("10.244.1.9"), At: now.Add(-time.Minute)},  // nobody's, old
		{IP: netip.MustParseAddr("10.244.1.10"), At: now.Add(-time.Second)}, // nobody's, young
	}
	// x/pending, on n1, has no address yet.
	if got := set(t, compileBothWays(t, s).Ruleset, "known4"); !slices.Equal(got, addrs("10.244.1.2", "10.244.1.3")) {
		t.Errorf("known4 = %v while a local pod waits for its address; want the API pods' alone", got)
	}
	s.Pods = slices.DeleteFunc(slices.Clone(s.Pods), func(p *corev1.Pod) bool { return p.Name == "pending" })
	r := compileBothWays(t, s).Ruleset
	if got := set(t, r, "known4"); !slices.Equal(got, addrs("10.244.1.2", "10.244.1.3", "10.244.1.9")) {
		t.Errorf("known4 = %v; want the API pods' and the unmanaged address past the grace", got)
	}
	if slices.ContainsFunc(r.Chains, func(c Chain) bool { return strings.Contains(c.Name, "10.244.1.9") }) {
		t.Error("an unmanaged address has a policy chain")
	}
}

// compileBothWays compiles s, and s with its pods as twilld's informer
// records them: the two must be the same.
func compileBothWays(t *testing.T, s Snapshot) Result {
	t.Helper()
	want := Compile(s)
	if got := Compile(informerRecords{}.of(s)); !reflect.DeepEqual(got, want) {
		t.Fatalf("the compile of the informer's records differs from the pods':\n got  %+v\n want %+v", got, want)
	}
	return want
}

// TestIngressNamedPortIsEachSelectedPodsOwn: one policy selecting two pods
// that name different numbers "web" allows each pod's own number.
func TestIngressNamedPortIsEachSelectedPodsOwn(t *testing.T) {
	web := intstr.FromString("web")
	np := testPolicy("x", "web", nil, func(s *networkingv1.NetworkPolicySpec) {
		s.Ingress = []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{{Port: &web}}}}
	})
	s := Snapshot{Node: "n1", LocalCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")},
		Namespaces: []*corev1.Namespace{testNS("x", nil)},
		Pods: []*corev1.Pod{
			testPod("x", "a", "n1", "10.244.1.2", nil, corev1.ContainerPort{Name: "web", ContainerPort: 80}),
			testPod("x", "b", "n1", "10.244.1.3", nil, corev1.ContainerPort{Name: "web", ContainerPort: 8080}),
		},
		Policies: []*networkingv1.NetworkPolicy{np}}
	r := Compile(s)
	for pod, want := range map[string]uint16{"x/a": 80, "x/b": 8080} {
		if in := chain(t, r.Ruleset, "in:"+pod).Rules; len(in) != 2 || in[0].PortLo != want {
			t.Errorf("in:%s = %+v, want port %d allowed, then the drop", pod, in, want)
		}
	}
}

// rawSet is the set or map name of rs.
func rawSet(t *testing.T, rs Ruleset, name string) Set {
	t.Helper()
	for _, s := range rs.Sets {
		if s.Name == name {
			return s
		}
	}
	t.Fatalf("no set %s", name)
	return Set{}
}

// Rules that name the same peer, in any policy, look up one set: the
// table's elements grow with the peers named, not with the policies. A
// peer without a namespace selector is its policy's namespace's pods: the
// same pod selector in another namespace is another set.
func TestPoliciesNamingTheSamePeerShareItsSet(t *testing.T) {
	fromTeam := func(ns, name string) *networkingv1.NetworkPolicy {
		return testPolicy(ns, name, nil, func(s *networkingv1.NetworkPolicySpec) {
			s.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{
				{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "y"}}},
				{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"pod": "a"}}},
			}}}
		})
	}
	rs := Compile(snapshot(fromTeam("x", "one"), fromTeam("x", "two"), fromTeam("y", "three"))).Ruleset
	peers := func(name, policy string) (sets []string) {
		for _, r := range chain(t, rs, name).Rules {
			if r.Comment == "allow "+policy && r.Src.Set != "" {
				sets = append(sets, r.Src.Set)
			}
		}
		return sets
	}
	one, two, three := peers("in:x/a", "x/one"), peers("in:x/a", "x/two"), peers("in:y/a", "y/three")
	if len(one) != 2 || !slices.Equal(one, two) {
		t.Fatalf("x/one's peers look up %v, x/two's %v: want the same two sets", one, two)
	}
	if one[0] != three[0] || one[1] == three[1] {
		t.Errorf("x/one's sets %v, y/three's %v: want the namespace selector's shared, the pod selector's each its namespace's", one, three)
	}
	if got := set(t, rs, one[1]); !slices.Equal(got, addrs("10.244.1.2")) {
		t.Errorf("x's pod=a: %v, want x/a alone", got)
	}
	if got := set(t, rs, three[1]); !slices.Equal(got, addrs("10.244.1.3")) {
		t.Errorf("y's pod=a: %v, want y/a alone", got)
	}
}
