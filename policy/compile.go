package policy

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/twill-net/twill/policy/cnpapi"
)

// Snapshot is what Compile reads: the informers' state and this node.
type Snapshot struct {
	Node string
	// LocalCIDRs are this node's pod CIDRs: an address in them that no
	// known local pod holds is dropped.
	LocalCIDRs []netip.Prefix
	Pods       []*corev1.Pod
	// podRecords are the pod informer's, beside Pods: read as they came,
	// for Node.
	podRecords []*podRecord
	Namespaces []*corev1.Namespace
	Policies   []*networkingv1.NetworkPolicy
	// ClusterPolicies are the ClusterNetworkPolicies (Admin and Baseline
	// tiers); Nodes the cluster's Nodes (their addresses are a nodes
	// peer's).
	ClusterPolicies []*cnpapi.ClusterNetworkPolicy
	Nodes           []*corev1.Node
	// ClusterPolicyErrors are the ClusterNetworkPolicies the source could
	// not read: Compile reports them with its own problems.
	ClusterPolicyErrors []Problem
	// LogDenied logs the packets an isolated pod's chain drops, rate
	// limited, to NFLOG group LogGroup (--network-policy-log-denied).
	LogDenied bool
	// LogAllowed logs the new connections of every local pod, allowed,
	// one in LogSample (0 or 1: each), rate limited; without it, those
	// of the pods whose namespace has LogAllowedAnnotation "true".
	LogAllowed bool
	LogSample  uint32
	// LogOff writes no log rule at all (the verdict log cannot read).
	LogOff bool
	// Allocations are the addresses the CNI plugin gave on this node, and
	// when; Now is the time to age them against.
	Allocations []Allocation
	Now         time.Time
}

// LogAllowedAnnotation, "true" on a namespace, logs the new connections
// its pods on the node make and take, allowed (sampled, rate limited).
const LogAllowedAnnotation = "twill.io/log-allowed"

// Allocation is an address the CNI plugin gave a pod on this node.
type Allocation struct {
	IP netip.Addr
	At time.Time
}

// UnmanagedGrace is how long an allocated address no API pod holds stays
// dropped. Past it, while every pod the apiserver places on the node has
// its address reported, the address is a pod no policy can select (one a
// CRI client other than kubelet made) and is allowed, as an unselected
// pod is.
const UnmanagedGrace = 10 * time.Second

// Problem is a policy Compile could not fully apply, and why. Its part that
// cannot be applied allows nothing (policy fails closed).
type Problem struct {
	Policy string // namespace/name
	Err    error
}

// pod is a pod as Compile needs it.
type pod struct {
	key    string // namespace/name
	ns     string
	labels labels.Set
	ips    []netip.Addr
	local  bool
	ports  map[string][]namedPort // container port name → its ports
	mark   uint64                 // Compiler's, while it sorts
}

type namedPort struct {
	proto uint8
	port  uint16
}

// Selection says which policies select a pod, in each direction: what
// `twillctl status` and the metrics read.
type Selection struct {
	Ingress, Egress []string // namespace/name, sorted
	// ClusterIngress and ClusterEgress are the ClusterNetworkPolicies
	// (ClusterPolicyPrefix + name), in the order they are evaluated.
	ClusterIngress, ClusterEgress []string `json:",omitempty"`
}

// Result is Compile's output.
type Result struct {
	Ruleset  Ruleset
	Selected map[string]Selection // local pod namespace/name → policies
	Problems []Problem
}

// Compile computes the policy table for the local pods of s.Node.
func Compile(s Snapshot) Result {
	c := newCompiler(s, nil)
	c.compile(s, true)
	return c.result()
}

// compile works out the chains of c.targets; check reports the problems of
// every ClusterNetworkPolicy, whether or not it selects a target.
func (c *compiler) compile(s Snapshot, check bool) {
	if check {
		for _, p := range c.policies {
			c.addPolicy(p)
		}
	} else { // a step: the policies of the targets' namespaces select them
		for ns := range c.targetsNS {
			i, _ := slices.BinarySearchFunc(c.policies, ns, func(p *networkingv1.NetworkPolicy, ns string) int { return strings.Compare(p.Namespace, ns) })
			for ; i < len(c.policies) && c.policies[i].Namespace == ns; i++ {
				c.addPolicy(c.policies[i])
			}
		}
	}
	c.problems = append(c.problems, s.ClusterPolicyErrors...)
	c.addClusterPolicies(s.ClusterPolicies, check)
	c.problems = uniqueProblems(c.problems)
}

type compiler struct {
	nsLabels      map[string]labels.Set
	pods          []*pod // sorted by key
	nsPods        map[string][]*pod
	nsOrder       []string // the namespaces of pods, sorted
	local         []*pod
	localNS       map[string][]*pod // local pods by namespace
	policies      []*networkingv1.NetworkPolicy
	cidrs         []netip.Prefix
	logDenied     bool
	logAllowedAll bool
	logNS         map[string]bool // namespaces with LogAllowedAnnotation
	sample        uint32
	allocations   []Allocation
	now           time.Time
	waiting       bool // a pod placed on the node has no address reported yet

	nodes []*corev1.Node

	// targets are the local pods whose chains this compile works out: all
	// of them, or, for Compiler, those that changed; targetsNS by
	// namespace. chains are the local pods' chains, by pod key.
	targets   []*pod
	targetsNS map[string][]*pod
	chains    map[string][]Chain
	deps
	// store is every set made since the last full compile (Compiler):
	// sets holds those the table's rules read.
	store map[string]Set
	// globals are this compile's sets of every local pod (globalSets);
	// kept, when set, the last compile's, which this one keeps.
	globals, kept map[string]Set
	// clusterIn are the ClusterNetworkPolicies read, clusterParsed as
	// the compiler orders them (kept by a step while the same).
	clusterIn     []*cnpapi.ClusterNetworkPolicy
	clusterParsed []clusterPolicy
	// selectedOut is Result.Selected: a map no compile writes to once
	// returned, kept while no selection changes.
	selectedOut map[string]Selection
	// unmanaged are the allocated addresses no pod holds, once read.
	unmanaged     []netip.Addr
	unmanagedRead bool

	ingress, egress map[string][][]Rule // local pod key → allow rules, by policy
	// admin and baseline are the ClusterNetworkPolicy rules of each local
	// pod and direction ("ns/pod in"), in the order they are evaluated.
	admin, baseline map[string][]tierRule
	// adminBy are the Admin tier's policies of each local pod and
	// direction, in order; adminOwn says which pods' Admin rules are their
	// own (a named port), and so not in a shared chain.
	adminBy  map[string][]string
	adminOwn map[string]bool
	// shared are the Admin tier's chains that local pods share (by name),
	// and sharedOf the one each local pod goes to, by direction.
	shared   map[string]*sharedChain
	sharedOf map[string][2]string
	// sharedBefore is, during a step, sharedOf of the local pods that
	// changed, before.
	sharedBefore  map[string][2]string
	selected      map[string]*Selection
	sets          map[string]Set
	peerCache     map[ruleID][]peer
	selectors     map[*networkingv1.NetworkPolicy]parsedSelector
	selectorCache map[string][]peer // by set name (matcher.setName)
	problems      []Problem
}

// newCompiler reads s; pods, when set, keeps what it read of each pod for
// the next compile.
func newCompiler(s Snapshot, pods *podCache) *compiler {
	c := &compiler{nsLabels: map[string]labels.Set{}, cidrs: s.LocalCIDRs, logDenied: s.LogDenied, allocations: s.Allocations, now: s.Now,
		ingress: map[string][][]Rule{}, egress: map[string][][]Rule{}, nodes: s.Nodes,
		admin: map[string][]tierRule{}, baseline: map[string][]tierRule{}, adminBy: map[string][]string{}, adminOwn: map[string]bool{},
		shared: map[string]*sharedChain{}, sharedOf: map[string][2]string{},
		selected: map[string]*Selection{}, sets: map[string]Set{}, peerCache: map[ruleID][]peer{}, selectorCache: map[string][]peer{}, localNS: map[string][]*pod{},
		chains: map[string][]Chain{}, deps: newDeps(), selectors: map[*networkingv1.NetworkPolicy]parsedSelector{}}
	c.logAllowedAll, c.sample, c.logNS = s.LogAllowed && !s.LogOff, s.LogSample, map[string]bool{}
	c.logDenied = s.LogDenied && !s.LogOff
	for _, n := range s.Namespaces {
		c.nsLabels[n.Name] = labels.Set(n.Labels)
		if n.Annotations[LogAllowedAnnotation] == "true" && !s.LogOff {
			c.logNS[n.Name] = true
		}
	}
	c.pods = make([]*pod, 0, len(s.Pods)+len(s.podRecords))
	for _, p := range s.Pods {
		if pp := pods.podOf(p, s.Node); pp != nil {
			c.pods = append(c.pods, pp)
		} else if waitsForAddress(p, s.Node) {
			c.waiting = true
		}
	}
	for _, r := range s.podRecords {
		if r.pod != nil {
			c.pods = append(c.pods, r.pod)
		} else if r.waiting {
			c.waiting = true
		}
	}
	c.pods = pods.sorted(c.pods)
	c.nsPods = map[string][]*pod{}
	// Sorted by key, a namespace's pods are one run of c.pods.
	for i := 0; i < len(c.pods); {
		ns, j := c.pods[i].ns, i
		for j < len(c.pods) && c.pods[j].ns == ns {
			j++
		}
		c.nsOrder, c.nsPods[ns] = append(c.nsOrder, ns), c.pods[i:j:j]
		for _, p := range c.pods[i:j] {
			if p.local {
				c.local = append(c.local, p)
				c.localNS[ns] = append(c.localNS[ns], p)
			}
		}
		i = j
	}
	c.targets, c.targetsNS = c.local, c.localNS
	c.policies = pods.sortedPolicies(s.Policies)
	return c
}

func sortPods(ps []*pod) {
	slices.SortFunc(ps, func(a, b *pod) int { return strings.Compare(a.key, b.key) })
}

func sortPolicies(ps []*networkingv1.NetworkPolicy) []*networkingv1.NetworkPolicy {
	ps = slices.Clone(ps)
	slices.SortFunc(ps, func(a, b *networkingv1.NetworkPolicy) int {
		if a.Namespace != b.Namespace { // as namespace/name: no namespace holds a "/"
			return strings.Compare(a.Namespace, b.Namespace)
		}
		return strings.Compare(a.Name, b.Name)
	})
	return ps
}

// podOf keeps the pods policy applies to: on the pod network (not
// hostNetwork), with an address, not finished.
func podOf(p *corev1.Pod, node string) *pod {
	if p.Spec.HostNetwork || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed || p.DeletionTimestamp != nil && len(p.Status.PodIPs) == 0 {
		return nil
	}
	out := &pod{key: p.Namespace + "/" + p.Name, ns: p.Namespace, labels: labels.Set(p.Labels), local: p.Spec.NodeName == node && node != ""}
	for _, ip := range p.Status.PodIPs {
		if a, err := netip.ParseAddr(ip.IP); err == nil {
			out.ips = append(out.ips, a.Unmap())
		}
	}
	if len(out.ips) == 0 {
		if a, err := netip.ParseAddr(p.Status.PodIP); err == nil {
			out.ips = append(out.ips, a.Unmap())
		}
	}
	if len(out.ips) == 0 {
		return nil
	}
	for _, ctr := range p.Spec.Containers {
		for _, cp := range ctr.Ports {
			if cp.Name == "" {
				continue
			}
			if out.ports == nil {
				out.ports = map[string][]namedPort{}
			}
			out.ports[cp.Name] = append(out.ports[cp.Name], namedPort{protoNum(cp.Protocol), uint16(cp.ContainerPort)})
		}
	}
	return out
}

func protoNum(p corev1.Protocol) uint8 {
	switch p {
	case corev1.ProtocolUDP:
		return unix.IPPROTO_UDP
	case corev1.ProtocolSCTP:
		return unix.IPPROTO_SCTP
	}
	return unix.IPPROTO_TCP // the API's default
}

// types says which directions a policy isolates (the API's defaulting:
// Ingress always, Egress when it has egress rules).
func types(p *networkingv1.NetworkPolicy) (in, eg bool) {
	if len(p.Spec.PolicyTypes) == 0 {
		return true, len(p.Spec.Egress) > 0
	}
	for _, t := range p.Spec.PolicyTypes {
		switch t {
		case networkingv1.PolicyTypeIngress:
			in = true
		case networkingv1.PolicyTypeEgress:
			eg = true
		}
	}
	return in, eg
}

func (c *compiler) addPolicy(np *networkingv1.NetworkPolicy) {
	name := np.Namespace + "/" + np.Name
	sel, err := c.podSelector(np)
	if err != nil {
		c.problems = append(c.problems, Problem{name, fmt.Errorf("spec.podSelector: %w", err)})
		sel = labels.Everything() // isolate what it may mean to select, allow nothing it says
	}
	in, eg := types(np)
	var egress, ingress []Rule
	// Ingress rules differ between the pods a policy selects only by its
	// named ports, which each pod resolves on its own.
	shared := !slices.ContainsFunc(np.Spec.Ingress, func(r networkingv1.NetworkPolicyIngressRule) bool {
		return slices.ContainsFunc(r.Ports, func(pt networkingv1.NetworkPolicyPort) bool {
			return pt.Port != nil && pt.Port.Type == intstr.String
		})
	})
	c.owner = name
	defer func() { c.owner = "" }()
	for _, p := range c.targetsNS[np.Namespace] {
		if !sel.Matches(p.labels) {
			continue
		}
		if in || eg {
			c.compiled(p.key, name)
		}
		s := c.selected[p.key]
		if s == nil {
			s = &Selection{}
			c.selected[p.key] = s
		}
		if in {
			s.Ingress = append(s.Ingress, name)
			if ingress == nil || !shared {
				ingress = c.ingressRules(np, p)
			}
			c.ingress[p.key] = append(c.ingress[p.key], ingress)
		}
		if eg {
			s.Egress = append(s.Egress, name)
			if egress == nil {
				egress = c.egressRules(np) // the same for every pod it selects
			}
			c.egress[p.key] = append(c.egress[p.key], egress)
		}
	}
}

// podSelector is np's, parsed once for as long as np is (Compiler).
func (c *compiler) podSelector(np *networkingv1.NetworkPolicy) (labels.Selector, error) {
	if p, ok := c.selectors[np]; ok {
		return p.sel, p.err
	}
	sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
	c.selectors[np] = parsedSelector{sel, err}
	return sel, err
}

type parsedSelector struct {
	sel labels.Selector
	err error
}

func (c *compiler) ingressRules(np *networkingv1.NetworkPolicy, target *pod) []Rule {
	var out []Rule
	for i, r := range np.Spec.Ingress {
		id := ruleID{policy: np, dir: "in", index: i}
		ports := c.targetPorts(id, r.Ports, target)
		for _, peer := range c.peers(np, id, r.From) {
			for _, pm := range ports {
				out = append(out, c.allow(id, peer, pm, false))
			}
		}
	}
	return out
}

func (c *compiler) egressRules(np *networkingv1.NetworkPolicy) []Rule {
	out := []Rule{}
	for i, r := range np.Spec.Egress {
		id := ruleID{policy: np, dir: "eg", index: i}
		named, numbered := splitNamed(r.Ports)
		if len(r.Ports) == 0 || len(numbered) > 0 {
			ports := c.targetPorts(id, numbered, nil)
			for _, peer := range c.peers(np, id, r.To) {
				for _, pm := range ports {
					out = append(out, c.allow(id, peer, pm, true))
				}
			}
		}
		// A named port is the destination pod's: each port it names is a
		// set of the peers that give the name to that port.
		for _, np1 := range named {
			out = append(out, c.namedEgress(np, id, r.To, np1)...)
		}
	}
	return out
}

func splitNamed(ports []networkingv1.NetworkPolicyPort) (named []networkingv1.NetworkPolicyPort, numbered []networkingv1.NetworkPolicyPort) {
	for _, p := range ports {
		if p.Port != nil && p.Port.Type == 1 { // intstr.String
			named = append(named, p)
		} else {
			numbered = append(numbered, p)
		}
	}
	return named, numbered
}

// SelectedBy opens the comment of a pod chain's first rules, one per
// policy that selects the pod in the chain's direction.
const SelectedBy = "selected by "
