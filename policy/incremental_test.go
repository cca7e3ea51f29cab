package policy

import (
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/twill-net/twill/policy/cnpapi"
)

// world is a small cluster a fuzzer changes one object at a time, as the
// informers see it: a changed object is a new one with a new
// ResourceVersion.
type world struct {
	rv       int
	pods     [12]*corev1.Pod
	ns       [3]*corev1.Namespace
	nodes    [2]*corev1.Node
	policies [6]bool
	cnps     [4]bool
	// allocs are the CNI plugin's allocations on n1, by the address's
	// last byte: aged past UnmanagedGrace or not.
	allocs map[byte]bool
}

func (w *world) version() string {
	w.rv++
	return fmt.Sprint(w.rv)
}

var worldNS = []string{"x", "y", "z"}

// worldPolicies cover each kind of peer and port: pod and namespace
// selectors, an ipBlock, named ports both ways, egress alone.
var worldPolicies = []func() *networkingv1.NetworkPolicy{
	func() *networkingv1.NetworkPolicy {
		return testPolicy("x", "from-role", map[string]string{"app": "a0"}, func(sp *networkingv1.NetworkPolicySpec) {
			sp.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{
				{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"role": "r0"}}},
				{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "t1"}},
					PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"role": "r1"}}}}}}
		})
	},
	func() *networkingv1.NetworkPolicy {
		p80 := intstr.FromString("http")
		return testPolicy("y", "named-in", nil, func(sp *networkingv1.NetworkPolicySpec) {
			sp.Ingress = []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{}}},
				Ports: []networkingv1.NetworkPolicyPort{{Port: &p80}}}}
		})
	},
	func() *networkingv1.NetworkPolicy {
		http := intstr.FromString("http")
		return testPolicy("x", "named-out", map[string]string{"role": "r2"}, func(sp *networkingv1.NetworkPolicySpec) {
			sp.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
			sp.Egress = []networkingv1.NetworkPolicyEgressRule{{
				To:    []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "a1"}}}},
				Ports: []networkingv1.NetworkPolicyPort{{Port: &http}}}}
		})
	},
	func() *networkingv1.NetworkPolicy {
		return testPolicy("z", "egress-and-block", map[string]string{"app": "a1"}, func(sp *networkingv1.NetworkPolicySpec) {
			sp.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}
			sp.Egress = []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{
				{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/8", Except: []string{"10.244.2.0/24"}}},
				{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "t0"}}}}}}
		})
	},
	func() *networkingv1.NetworkPolicy {
		http := intstr.FromString("http")
		return testPolicy("y", "named-out-anywhere", map[string]string{"app": "a0"}, func(sp *networkingv1.NetworkPolicySpec) {
			sp.Egress = []networkingv1.NetworkPolicyEgressRule{{Ports: []networkingv1.NetworkPolicyPort{{Port: &http}}}}
		})
	},
	func() *networkingv1.NetworkPolicy {
		return testPolicy("x", "bad-peer", map[string]string{"role": "r1"}, func(sp *networkingv1.NetworkPolicySpec) {
			sp.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{
				{PodSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "x", Operator: "Bogus"}}}}}}}
		})
	},
}

// worldCNPs cover both tiers, the three actions, pods, namespaces, nodes
// and networks peers, and named ports.
var worldCNPs = []func() *cnpapi.ClusterNetworkPolicy{
	func() *cnpapi.ClusterNetworkPolicy {
		return testCNP("admin-pods", cnpapi.Admin, 5, func(s *cnpapi.Spec) {
			s.Subject = cnpapi.Subject{Pods: &cnpapi.NamespacedPod{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "a0"}}}}
			s.Ingress = []cnpapi.IngressRule{{Action: cnpapi.Deny, From: []cnpapi.IngressPeer{{Pods: &cnpapi.NamespacedPod{
				PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"role": "r2"}}}}}},
				{Action: cnpapi.Pass, From: []cnpapi.IngressPeer{{Namespaces: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "t0"}}}}}}
		})
	},
	func() *cnpapi.ClusterNetworkPolicy {
		return testCNP("admin-nodes", cnpapi.Admin, 7, func(s *cnpapi.Spec) {
			s.Subject = cnpapi.Subject{Namespaces: &metav1.LabelSelector{}}
			s.Egress = []cnpapi.EgressRule{{Action: cnpapi.Accept, To: []cnpapi.EgressPeer{{Nodes: &metav1.LabelSelector{
				MatchLabels: map[string]string{"zone": "a"}}}, {Networks: []string{"192.0.2.0/24"}}}}}
		})
	},
	func() *cnpapi.ClusterNetworkPolicy {
		return testCNP("baseline-named", cnpapi.Baseline, 3, func(s *cnpapi.Spec) {
			s.Subject = cnpapi.Subject{Namespaces: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "t1"}}}
			s.Egress = []cnpapi.EgressRule{{Action: cnpapi.Deny, Protocols: []cnpapi.Protocol{{DestinationNamedPort: "http"}},
				To: []cnpapi.EgressPeer{{Pods: &cnpapi.NamespacedPod{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"role": "r0"}}}}}}}
			s.Ingress = []cnpapi.IngressRule{{Action: cnpapi.Accept, Protocols: []cnpapi.Protocol{{DestinationNamedPort: "http"}},
				From: []cnpapi.IngressPeer{{Namespaces: &metav1.LabelSelector{}}}}}
		})
	},
	func() *cnpapi.ClusterNetworkPolicy {
		return testCNP("baseline-roles", cnpapi.Baseline, 9, func(s *cnpapi.Spec) {
			s.Subject = cnpapi.Subject{Pods: &cnpapi.NamespacedPod{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"role": "r1"}}}}
			s.Ingress = []cnpapi.IngressRule{{Action: cnpapi.Accept, Protocols: []cnpapi.Protocol{tcp(80)}, From: []cnpapi.IngressPeer{{Pods: &cnpapi.NamespacedPod{
				NamespaceSelector: metav1.LabelSelector{MatchLabels: map[string]string{"team": "t1"}},
				PodSelector:       metav1.LabelSelector{MatchLabels: map[string]string{"app": "a1"}}}}}}}
		})
	},
}

func newWorld() *world {
	w := &world{allocs: map[byte]bool{}}
	for i := range w.ns {
		w.setNS(i, byte(i))
	}
	for i := range w.nodes {
		w.setNode(i, byte(i))
	}
	return w
}

func (w *world) setNS(i int, b byte) {
	n := testNS(worldNS[i], map[string]string{"team": fmt.Sprint("t", b%3)})
	if b%2 == 1 {
		n.Annotations = map[string]string{LogAllowedAnnotation: "true"}
	}
	n.ResourceVersion = w.version()
	w.ns[i] = n
}

func (w *world) setNode(i int, b byte) {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprint("n", i+1), Labels: map[string]string{"zone": string(rune('a' + b%2))},
		ResourceVersion: w.version()}}
	n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: fmt.Sprintf("192.168.0.%d", 1+i+2*int(b%3))}}
	w.nodes[i] = n
}

// setPod makes pod slot i from b: its namespace, node, labels, address
// (one of four of its own: no two pods share one) and named port.
func (w *world) setPod(i int, b []byte) {
	at := func(k int) byte { return b[k%len(b)] }
	node := 1 + int(at(1))%2
	ip := fmt.Sprintf("10.244.%d.%d", node, 10+i*4+int(at(2))%4)
	var ports []corev1.ContainerPort
	if at(3)%3 > 0 {
		ports = append(ports, corev1.ContainerPort{Name: "http", ContainerPort: 80 * int32(at(3)%3)})
	}
	p := testPod(worldNS[int(at(0))%3], fmt.Sprint("p", i), fmt.Sprint("n", node), ip,
		map[string]string{"app": fmt.Sprint("a", at(4)%2), "role": fmt.Sprint("r", at(5)%3)}, ports...)
	if at(6)%5 == 0 {
		p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: fmt.Sprintf("fd00:10:%d::%x", node, 10+i*4+int(at(2))%4)})
	}
	p.ResourceVersion = w.version()
	w.pods[i] = p
}

// change applies one change read from b, and returns the bytes left.
func (w *world) change(b []byte) []byte {
	op, arg, rest := b[0]%8, int(b[1]), b[2:]
	switch op {
	case 0, 1:
		w.setPod(arg%len(w.pods), append([]byte{b[0] / 8}, rest...))
		rest = rest[min(len(rest), 3):]
	case 2:
		w.pods[arg%len(w.pods)] = nil
	case 3: // a status update: a new version, the same pod
		if p := w.pods[arg%len(w.pods)]; p != nil {
			q := p.DeepCopy()
			q.ResourceVersion = w.version()
			w.pods[arg%len(w.pods)] = q
		}
	case 4:
		w.policies[arg%len(w.policies)] = !w.policies[arg%len(w.policies)]
	case 5:
		w.cnps[arg%len(w.cnps)] = !w.cnps[arg%len(w.cnps)]
	case 6:
		w.setNS(arg%len(w.ns), b[0]/8)
	case 7:
		if b[0]/8%2 == 0 {
			w.setNode(arg%len(w.nodes), b[0]/8)
			break
		}
		// An allocation comes, ages or goes: it may be a pod's address.
		a := byte(10 + arg%52)
		if aged, ok := w.allocs[a]; ok && aged {
			delete(w.allocs, a)
		} else {
			w.allocs[a] = ok
		}
	}
	return rest
}

func (w *world) snapshot() Snapshot {
	now := time.Date(2026, 11, 28, 0, 0, 0, 0, time.UTC)
	s := Snapshot{Node: "n1", LocalCIDRs: []netip.Prefix{mustPrefix("10.244.1.0/24"), mustPrefix("fd00:10:1::/64")}, LogDenied: true, Now: now}
	for a, aged := range w.allocs {
		at := now.Add(-time.Second)
		if aged {
			at = now.Add(-2 * UnmanagedGrace)
		}
		s.Allocations = append(s.Allocations, Allocation{IP: netip.AddrFrom4([4]byte{10, 244, 1, a}), At: at})
	}
	for _, p := range w.pods {
		if p != nil {
			s.Pods = append(s.Pods, p)
		}
	}
	s.Namespaces, s.Nodes = w.ns[:], w.nodes[:]
	for i, on := range w.policies {
		if on {
			p := worldPolicies[i]()
			p.ResourceVersion = fmt.Sprint("p", i) // the same policy each time
			s.Policies = append(s.Policies, p)
		}
	}
	for i, on := range w.cnps {
		if on {
			p := worldCNPs[i]()
			p.ResourceVersion = fmt.Sprint("c", i)
			s.ClusterPolicies = append(s.ClusterPolicies, p)
		}
	}
	return s
}

// FuzzIncrementalIsFull: after any sequence of changes, Compiler's result
// is Compile's of the same snapshot.
func FuzzIncrementalIsFull(f *testing.F) {
	f.Add([]byte{4, 0, 0, 1, 1, 0, 0, 0, 0, 1, 2, 1, 1, 1, 0, 2, 9, 1, 3, 2, 8, 1, 1, 0, 1})
	f.Add([]byte{4, 2, 5, 2, 0, 3, 2, 1, 1, 1, 1, 8, 5, 0, 2, 0, 3, 1, 1, 9, 0, 0, 6, 1, 7, 0})
	f.Add([]byte{5, 0, 5, 1, 5, 3, 0, 0, 0, 0, 0, 0, 0, 8, 1, 1, 1, 1, 1, 3, 0, 7, 1, 8, 0, 0, 0, 0, 2, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		w := newWorld()
		var k, kr Compiler // kr compiles the pods as twilld's informer records them
		records := informerRecords{}
		for step := 0; len(data) >= 2 && step < 64; step++ {
			data = w.change(data)
			s := w.snapshot()
			got, want := k.Compile(s), Compile(s)
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("step %d (incremental %v): the compile differs from Compile's:\n got  %+v\n want %+v", step, k.Incremental, got, want)
			}
			if got := kr.Compile(records.of(s)); !reflect.DeepEqual(got, want) {
				t.Fatalf("step %d (incremental %v): the compile of the informer's records differs from Compile's:\n got  %+v\n want %+v", step, kr.Incremental, got, want)
			}
		}
	})
}

// informerRecords records pods as the pod informer does (recordPod), each
// object once: the same object keeps its record.
type informerRecords map[*corev1.Pod]*podRecord

// of is s with its pods recorded, as Informers.Snapshot gives it.
func (m informerRecords) of(s Snapshot) Snapshot {
	recorded := s
	recorded.Pods, recorded.podRecords = nil, nil
	for _, p := range s.Pods {
		r, ok := m[p]
		if !ok {
			o, _ := recordPod(s.Node)(p)
			r = o.(*podRecord)
			m[p] = r
		}
		recorded.podRecords = append(recorded.podRecords, r)
	}
	return recorded
}

// TestIncrementalOnPodChanges: a change of pods alone is compiled
// incrementally, and gives Compile's table; a change of a policy is not.
func TestIncrementalOnPodChanges(t *testing.T) {
	w := newWorld()
	for i := range w.policies {
		w.policies[i] = i != 5 // not the one with a problem
	}
	w.cnps = [4]bool{true, true, false, true}
	for i := range w.pods {
		w.setPod(i, []byte{byte(i), byte(i / 3), 0, 0, byte(i), byte(i / 2), 1})
	}
	var k Compiler
	k.Compile(w.snapshot())
	incremental := 0
	for i := range 40 {
		w.setPod(i%len(w.pods), []byte{byte(i), byte(i / 3), byte(i), 0, byte(i / 2), byte(i / 5), 1})
		s := w.snapshot()
		if got, want := k.Compile(s), Compile(s); !reflect.DeepEqual(got, want) {
			t.Fatalf("change %d (incremental %v): the compile differs from Compile's:\n got  %+v\n want %+v", i, k.Incremental, got, want)
		}
		if k.Incremental {
			incremental++
		}
	}
	if incremental < 20 {
		t.Fatalf("%d of 40 pod changes compiled incrementally, want most", incremental)
	}
	w.policies[0] = false
	if k.Compile(w.snapshot()); k.Incremental {
		t.Fatal("a policy's deletion was compiled incrementally")
	}
}

// TestIncrementalThroughStatusUpdates: twilld writes a
// ClusterNetworkPolicy's status, a new ResourceVersion of the same spec:
// the next change of pods is still compiled incrementally. A new
// generation is not.
func TestIncrementalThroughStatusUpdates(t *testing.T) {
	w := newWorld()
	w.cnps[0] = true
	for i := range 4 {
		w.setPod(i, []byte{0, 0, byte(i), 0, 0, byte(i)})
	}
	s := w.snapshot()
	cnp := s.ClusterPolicies[0]
	cnp.UID, cnp.Generation, cnp.ResourceVersion = "u1", 1, "10"
	var k Compiler
	k.Compile(s)
	for i, tc := range []struct {
		rv          string
		generation  int64
		incremental bool
	}{{"11", 1, true}, {"12", 2, false}} {
		w.setPod(0, []byte{0, 0, byte(i + 1), 0, 0, byte(i + 1)})
		s = w.snapshot()
		next := *cnp // a new object, as the informer gives it
		next.ResourceVersion, next.Generation = tc.rv, tc.generation
		s.ClusterPolicies[0] = &next
		if got, want := k.Compile(s), Compile(s); !reflect.DeepEqual(got, want) {
			t.Fatalf("resourceVersion %s, generation %d: the compile differs from Compile's", tc.rv, tc.generation)
		}
		if k.Incremental != tc.incremental {
			t.Errorf("resourceVersion %s, generation %d: incremental %v, want %v", tc.rv, tc.generation, k.Incremental, tc.incremental)
		}
	}
}

// TestIncrementalKeepsAnAddressAnotherPodHolds: a deleted pod's object
// can still list the address the CNI plugin has given to a new pod. When
// the old object goes, the peer set keeps the address: the new pod holds
// it, and the same selector matches it.
func TestIncrementalKeepsAnAddressAnotherPodHolds(t *testing.T) {
	fromWeb := testPolicy("x", "from-web", map[string]string{"pod": "a"}, func(sp *networkingv1.NetworkPolicySpec) {
		sp.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{
			MatchLabels: map[string]string{"role": "web"}}}}}}
	})
	s := snapshot(fromWeb)
	old := testPod("x", "old", "n2", "10.244.2.9", map[string]string{"role": "web"})
	old.ResourceVersion = "1"
	fresh := testPod("x", "fresh", "n2", "10.244.2.9", map[string]string{"role": "web"})
	fresh.ResourceVersion = "2"
	s.Pods = append(s.Pods, old, fresh)
	for _, o := range []metav1.Object{s.Namespaces[0], s.Namespaces[1], fromWeb} {
		o.SetResourceVersion("1")
	}
	for _, p := range s.Pods {
		if p.ResourceVersion == "" {
			p.ResourceVersion = "1"
		}
	}
	var k Compiler
	k.Compile(s)
	s.Pods = slices.DeleteFunc(slices.Clone(s.Pods), func(p *corev1.Pod) bool { return p == old })
	got, want := k.Compile(s), Compile(s)
	if !k.Incremental {
		t.Fatal("a pod's deletion compiled in full")
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("the compile differs from Compile's:\n got  %+v\n want %+v", got.Ruleset.Sets, want.Ruleset.Sets)
	}
	if tr := Evaluate(got.Ruleset, Packet{Src: netip.MustParseAddr("10.244.2.9"), Dst: netip.MustParseAddr("10.244.1.2"), Proto: unix.IPPROTO_TCP, Port: 80}); !tr.Allowed {
		t.Errorf("x/fresh (role=web, 10.244.2.9) cannot reach x/a once x/old, which listed its address, is gone: %+v", tr)
	}
}
