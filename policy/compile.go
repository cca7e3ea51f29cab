package policy

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
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
)

// Snapshot is what Compile reads: the informers' state and this node.
type Snapshot struct {
	Node string
	// LocalCIDRs are this node's pod CIDRs: an address in them that no
	// known local pod holds is dropped.
	LocalCIDRs []netip.Prefix
	Pods       []*corev1.Pod
	Namespaces []*corev1.Namespace
	Policies   []*networkingv1.NetworkPolicy
	// LogDenied logs the packets an isolated pod's chain drops, rate
	// limited (--network-policy-log-denied).
	LogDenied bool
	// Allocations are the addresses the CNI plugin gave on this node, and
	// when; Now is the time to age them against.
	Allocations []Allocation
	Now         time.Time
}

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
}

type namedPort struct {
	proto uint8
	port  uint16
}

// Selection says which policies select a pod, in each direction: what
// `twillctl status` and the metrics read.
type Selection struct {
	Ingress, Egress []string // namespace/name, sorted
}

// Result is Compile's output.
type Result struct {
	Ruleset  Ruleset
	Selected map[string]Selection // local pod namespace/name → policies
	Problems []Problem
}

// Compile computes the policy table for the local pods of s.Node.
func Compile(s Snapshot) Result {
	c := newCompiler(s)
	for _, p := range c.policies {
		c.addPolicy(p)
	}
	return c.result()
}

type compiler struct {
	nsLabels    map[string]labels.Set
	pods        []*pod // sorted by key
	nsPods      map[string][]*pod
	nsOrder     []string // the namespaces of pods, sorted
	local       []*pod
	localNS     map[string][]*pod // local pods by namespace
	policies    []*networkingv1.NetworkPolicy
	cidrs       []netip.Prefix
	logDenied   bool
	allocations []Allocation
	now         time.Time
	waiting     bool // a pod placed on the node has no address reported yet

	ingress, egress map[string][][]Rule // local pod key → allow rules, by policy
	selected        map[string]*Selection
	sets            map[string]Set
	peerCache       map[ruleID][]peer
	problems        []Problem
}

func newCompiler(s Snapshot) *compiler {
	c := &compiler{nsLabels: map[string]labels.Set{}, cidrs: s.LocalCIDRs, logDenied: s.LogDenied, allocations: s.Allocations, now: s.Now,
		ingress: map[string][][]Rule{}, egress: map[string][][]Rule{},
		selected: map[string]*Selection{}, sets: map[string]Set{}, peerCache: map[ruleID][]peer{}, localNS: map[string][]*pod{}}
	for _, n := range s.Namespaces {
		c.nsLabels[n.Name] = labels.Set(n.Labels)
	}
	for _, p := range s.Pods {
		if pp := podOf(p, s.Node); pp != nil {
			c.pods = append(c.pods, pp)
		} else if p.Spec.NodeName == s.Node && !p.Spec.HostNetwork && len(p.Status.PodIPs) == 0 && p.Status.PodIP == "" &&
			p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed && p.DeletionTimestamp == nil {
			c.waiting = true
		}
	}
	slices.SortFunc(c.pods, func(a, b *pod) int { return strings.Compare(a.key, b.key) })
	c.nsPods = map[string][]*pod{}
	for _, p := range c.pods {
		if p.local {
			c.local = append(c.local, p)
			c.localNS[p.ns] = append(c.localNS[p.ns], p)
		}
		if len(c.nsPods[p.ns]) == 0 {
			c.nsOrder = append(c.nsOrder, p.ns)
		}
		c.nsPods[p.ns] = append(c.nsPods[p.ns], p)
	}
	c.policies = slices.Clone(s.Policies)
	slices.SortFunc(c.policies, func(a, b *networkingv1.NetworkPolicy) int {
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	return c
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
	sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
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
	for _, p := range c.localNS[np.Namespace] {
		if !sel.Matches(p.labels) {
			continue
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

// ruleID names one rule of one policy; its sets are named from it, so that
// a change of who matches rewrites set elements, not rules.
type ruleID struct {
	policy *networkingv1.NetworkPolicy
	dir    string // "in" or "eg"
	index  int
}

func (id ruleID) name() string {
	h := sha256.Sum256([]byte(id.policy.Namespace + "/" + id.policy.Name))
	return fmt.Sprintf("%s%d-%s", id.dir, id.index, hex.EncodeToString(h[:5]))
}

func (id ruleID) policyName() string { return id.policy.Namespace + "/" + id.policy.Name }

// peer is one source (ingress) or destination (egress) a rule allows.
type peer struct {
	any  bool
	v6   bool
	addr Addr
}

// port is one destination port range a rule allows.
type port struct {
	any    bool
	proto  uint8
	lo, hi uint16
}

func (c *compiler) families() (v4, v6 bool) {
	if len(c.cidrs) == 0 {
		return true, true
	}
	for _, p := range c.cidrs {
		if p.Addr().Is4() {
			v4 = true
		} else {
			v6 = true
		}
	}
	return v4, v6
}

// peers is what a rule's from (or to) allows: everything when empty, else
// a set per family of the pods its selectors match, and its ipBlocks.
func (c *compiler) peers(np *networkingv1.NetworkPolicy, id ruleID, list []networkingv1.NetworkPolicyPeer) []peer {
	// Every pod a policy selects shares its rules' peers: work them out once.
	if p, ok := c.peerCache[id]; ok {
		return p
	}
	p := c.computePeers(np, id, list)
	c.peerCache[id] = p
	return p
}

func (c *compiler) computePeers(np *networkingv1.NetworkPolicy, id ruleID, list []networkingv1.NetworkPolicyPeer) []peer {
	if len(list) == 0 {
		return []peer{{any: true}}
	}
	var matchers []matcher
	var out []peer
	for i, pr := range list {
		if pr.IPBlock != nil {
			out = append(out, c.ipBlock(id, i, pr.IPBlock)...)
			continue
		}
		m, err := c.peerMatcher(np, pr)
		if err != nil {
			c.problems = append(c.problems, Problem{id.policyName(), fmt.Errorf("spec.%s[%d] peer %d: %w", dirField(id.dir), id.index, i, err)})
			continue
		}
		matchers = append(matchers, m)
	}
	if len(matchers) == 0 {
		return out
	}
	var ips []netip.Addr
	c.eachMatching(matchers, func(p *pod) { ips = append(ips, p.ips...) })
	return append(c.addrSets(id.name(), ips), out...)
}

func dirField(dir string) string {
	if dir == "in" {
		return "ingress"
	}
	return "egress"
}

// addrSets adds a set per family in use named base-4 and base-6 holding
// ips, and returns a peer for each.
func (c *compiler) addrSets(base string, ips []netip.Addr) []peer {
	v4, v6 := c.families()
	var out []peer
	for _, fam := range []struct {
		on bool
		v6 bool
		sf string
	}{{v4, false, "-4"}, {v6, true, "-6"}} {
		if !fam.on {
			continue
		}
		s := Set{Name: base + fam.sf, V6: fam.v6}
		for _, ip := range ips {
			if ip.Is6() == fam.v6 {
				s.Elems = append(s.Elems, ip)
			}
		}
		slices.SortFunc(s.Elems, netip.Addr.Compare)
		s.Elems = slices.Compact(s.Elems)
		c.sets[s.Name] = s
		out = append(out, peer{v6: fam.v6, addr: Addr{Set: s.Name}})
	}
	return out
}

func (c *compiler) ipBlock(id ruleID, i int, b *networkingv1.IPBlock) []peer {
	pfx, err := netip.ParsePrefix(b.CIDR)
	if err != nil {
		c.problems = append(c.problems, Problem{id.policyName(), fmt.Errorf("spec.%s[%d] peer %d: ipBlock.cidr %q: %w", dirField(id.dir), id.index, i, b.CIDR, err)})
		return nil
	}
	pfx = pfx.Masked()
	v4, v6 := c.families()
	if pfx.Addr().Is6() && !v6 || pfx.Addr().Is4() && !v4 {
		return nil
	}
	a := Addr{Prefix: pfx}
	for _, e := range b.Except {
		ep, err := netip.ParsePrefix(e)
		if err == nil && ep.Addr().Is6() != pfx.Addr().Is6() {
			err = fmt.Errorf("not of the family of cidr %s", pfx)
		}
		if err != nil {
			c.problems = append(c.problems, Problem{id.policyName(), fmt.Errorf("spec.%s[%d] peer %d: ipBlock.except %q: %w", dirField(id.dir), id.index, i, e, err)})
			return nil // fail closed: allow nothing rather than too much
		}
		a.Except = append(a.Except, ep.Masked())
	}
	return []peer{{v6: pfx.Addr().Is6(), addr: a}}
}

// matcher is a pod- and/or namespace-selector peer.
type matcher struct {
	ns     string          // the policy's own namespace, when nsSel is nil
	nsSel  labels.Selector // nil: ns alone
	podSel labels.Selector
}

// peerMatcher reads a pod- and/or namespace-selector peer.
func (c *compiler) peerMatcher(np *networkingv1.NetworkPolicy, pr networkingv1.NetworkPolicyPeer) (matcher, error) {
	m := matcher{ns: np.Namespace, podSel: labels.Everything()}
	var err error
	if pr.PodSelector != nil {
		if m.podSel, err = metav1.LabelSelectorAsSelector(pr.PodSelector); err != nil {
			return m, fmt.Errorf("podSelector: %w", err)
		}
	}
	if pr.NamespaceSelector != nil {
		if m.nsSel, err = metav1.LabelSelectorAsSelector(pr.NamespaceSelector); err != nil {
			return m, fmt.Errorf("namespaceSelector: %w", err)
		}
	}
	return m, nil
}

// eachMatching calls f for each pod any of ms matches: a namespace's
// labels are matched once, and only its pods' labels after that.
func (c *compiler) eachMatching(ms []matcher, f func(*pod)) {
	var pods []labels.Selector
	for _, ns := range c.nsOrder {
		pods = pods[:0]
		for _, m := range ms {
			if m.nsSel == nil && m.ns == ns || m.nsSel != nil && m.nsSel.Matches(c.nsLabels[ns]) {
				pods = append(pods, m.podSel)
			}
		}
		if len(pods) == 0 {
			continue
		}
		for _, p := range c.nsPods[ns] {
			if slices.ContainsFunc(pods, func(sel labels.Selector) bool { return sel.Matches(p.labels) }) {
				f(p)
			}
		}
	}
}

// targetPorts resolves a rule's ports; a named one against target (the
// selected pod, for ingress). A name target does not have allows nothing.
func (c *compiler) targetPorts(id ruleID, ports []networkingv1.NetworkPolicyPort, target *pod) []port {
	if len(ports) == 0 {
		return []port{{any: true}}
	}
	var out []port
	for i, p := range ports {
		proto := protoNum(corev1.ProtocolTCP)
		if p.Protocol != nil {
			proto = protoNum(*p.Protocol)
		}
		switch {
		case p.Port == nil:
			out = append(out, port{proto: proto})
		case p.Port.Type == 1: // a name
			if target == nil {
				continue
			}
			for _, n := range target.ports[p.Port.StrVal] {
				if n.proto == proto {
					out = append(out, port{proto: proto, lo: n.port, hi: n.port})
				}
			}
		default:
			lo := p.Port.IntVal
			hi := lo
			if p.EndPort != nil {
				hi = *p.EndPort
			}
			if lo < 1 || lo > 65535 || hi < lo || hi > 65535 {
				c.problems = append(c.problems, Problem{id.policyName(), fmt.Errorf("spec.%s[%d].ports[%d]: port %d endPort %d: want 1-65535, endPort ≥ port", dirField(id.dir), id.index, i, lo, hi)})
				continue
			}
			out = append(out, port{proto: proto, lo: uint16(lo), hi: uint16(hi)})
		}
	}
	return out
}

// namedEgress allows a named destination port: the peers that give the
// name to a port number form one set per number.
func (c *compiler) namedEgress(np *networkingv1.NetworkPolicy, id ruleID, to []networkingv1.NetworkPolicyPeer, p networkingv1.NetworkPolicyPort) []Rule {
	proto := protoNum(corev1.ProtocolTCP)
	if p.Protocol != nil {
		proto = protoNum(*p.Protocol)
	}
	var matchers []matcher
	for _, pr := range to {
		if pr.IPBlock != nil {
			continue // an address block has no port names
		}
		if m, err := c.peerMatcher(np, pr); err == nil {
			matchers = append(matchers, m)
		}
	}
	byPort := map[uint16][]netip.Addr{}
	add := func(pp *pod) {
		for _, n := range pp.ports[p.Port.StrVal] {
			if n.proto == proto {
				byPort[n.port] = append(byPort[n.port], pp.ips...)
			}
		}
	}
	if len(to) == 0 {
		for _, pp := range c.pods {
			add(pp)
		}
	} else {
		c.eachMatching(matchers, add)
	}
	var out []Rule
	for _, num := range slices.Sorted(maps.Keys(byPort)) {
		base := fmt.Sprintf("%s-n%d-%d", id.name(), proto, num)
		for _, pe := range c.addrSets(base, byPort[num]) {
			out = append(out, c.allow(id, pe, port{proto: proto, lo: num, hi: num}, true))
		}
	}
	return out
}

// allow is the rule letting one peer through on one port: back to the
// base chain, counted for the policy.
func (c *compiler) allow(id ruleID, pe peer, pt port, egress bool) Rule {
	r := Rule{V6: pe.v6, Counter: true, Verdict: Return, Comment: "allow " + id.policyName()}
	if !pe.any {
		if egress {
			r.Dst = pe.addr
		} else {
			r.Src = pe.addr
		}
	}
	if !pt.any {
		r.Proto, r.PortLo, r.PortHi = pt.proto, pt.lo, pt.hi
	}
	return r
}

// SelectedBy opens the comment of a pod chain's first rules, one per
// policy that selects the pod in the chain's direction.
const SelectedBy = "selected by "

// denyComment names the final drop of a pod's chain: the metrics count it
// against the policies that select the pod in that direction.
func denyComment(dir, podKey string) string {
	if dir == "in" {
		return "deny ingress " + podKey
	}
	return "deny egress " + podKey
}

// ChainName is a local pod's chain for one direction ("in" or "eg"); a
// name too long for the kernel (256 bytes) is shortened with a hash.
func ChainName(dir, podKey string) string {
	n := dir + ":" + podKey
	if len(n) <= 200 {
		return n
	}
	h := sha256.Sum256([]byte(podKey))
	return n[:180] + "~" + hex.EncodeToString(h[:8])
}

// unmanaged are the allocated addresses past UnmanagedGrace that no pod
// holds, when no pod placed on the node lacks its address (the address
// might be its).
func (c *compiler) unmanaged() []netip.Addr {
	if c.waiting {
		return nil
	}
	held := map[netip.Addr]bool{}
	for _, p := range c.pods {
		for _, ip := range p.ips {
			held[ip] = true
		}
	}
	var out []netip.Addr
	for _, a := range c.allocations {
		if ip := a.IP.Unmap(); !held[ip] && c.now.Sub(a.At) >= UnmanagedGrace {
			out = append(out, ip)
		}
	}
	return out
}

func (c *compiler) result() Result {
	v4, v6 := c.families()
	known := c.knownSets(v4, v6)
	base := Chain{Name: ChainForward, Rules: []Rule{{Established: true, Verdict: Accept}}}
	for _, cidr := range c.cidrs {
		set := known[cidr.Addr().Is6()].Name
		base.Rules = append(base.Rules,
			Rule{V6: cidr.Addr().Is6(), Src: Addr{Prefix: cidr.Masked(), NotSet: set}, Counter: true, Verdict: Drop, Comment: "unknown source"},
			Rule{V6: cidr.Addr().Is6(), Dst: Addr{Prefix: cidr.Masked(), NotSet: set}, Counter: true, Verdict: Drop, Comment: "unknown destination"})
	}
	rs := Ruleset{}
	var chains []Chain
	jumpMaps := addJumpMaps(&base, v4, v6)
	for _, dir := range []string{"eg", "in"} {
		for _, p := range c.local {
			allow := c.ingress[p.key]
			if dir == "eg" {
				allow = c.egress[p.key]
			}
			s := c.selected[p.key]
			if s == nil || dir == "in" && len(s.Ingress) == 0 || dir == "eg" && len(s.Egress) == 0 {
				continue
			}
			name := ChainName(dir, p.key)
			// The chain opens with the policies that select the pod, for
			// twillctl status; each counts the pod's new connections.
			by := s.Ingress
			if dir == "eg" {
				by = s.Egress
			}
			n := len(by) + 2
			for _, a := range allow {
				n += len(a)
			}
			rules := make([]Rule, 0, n)
			for _, pol := range by {
				rules = append(rules, Rule{Counter: true, Verdict: Continue, Comment: SelectedBy + pol})
			}
			for _, a := range allow {
				rules = append(rules, a...)
			}
			if c.logDenied {
				rules = append(rules, Rule{Verdict: Continue, Log: "twill-policy " + denyComment(dir, p.key) + ": "})
			}
			ch := Chain{Name: name, Rules: append(rules, Rule{Counter: true, Verdict: Drop, Comment: denyComment(dir, p.key)})}
			chains = append(chains, ch)
			for _, ip := range p.ips {
				if m := jumpMaps[JumpMap(dir, ip.Is6())]; m != nil {
					m.Elems, m.Jumps = append(m.Elems, ip), append(m.Jumps, name)
				}
			}
		}
	}
	for _, m := range jumpMaps {
		sortJumps(m)
		c.sets[m.Name] = *m
	}
	slices.SortFunc(chains, func(a, b Chain) int { return strings.Compare(a.Name, b.Name) })
	rs.Chains = append([]Chain{base}, chains...)
	for _, name := range slices.Sorted(maps.Keys(c.sets)) {
		rs.Sets = append(rs.Sets, c.sets[name])
	}
	sel := map[string]Selection{}
	for k, s := range c.selected {
		sel[k] = *s
	}
	return Result{Ruleset: rs, Selected: sel, Problems: c.problems}
}

// sortJumps sorts a verdict map's elements by address, each keeping its
// chain. An address is in at most one local pod.
func sortJumps(m *Set) {
	idx := make([]int, len(m.Elems))
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(a, b int) int { return m.Elems[a].Compare(m.Elems[b]) })
	elems, jumps := make([]netip.Addr, 0, len(idx)), make([]string, 0, len(idx))
	for n, i := range idx {
		if n > 0 && m.Elems[i] == elems[len(elems)-1] {
			continue
		}
		elems, jumps = append(elems, m.Elems[i]), append(jumps, m.Jumps[i])
	}
	m.Elems, m.Jumps = elems, jumps
}

// addJumpMaps adds to base the lookups of the verdict maps, one per
// direction and family in use, that send a pod's packets to its chain in
// one lookup however many pods the node has, and returns the maps, empty.
// Egress first: a packet between two local pods passes its source's
// egress chain, then its destination's ingress chain.
func addJumpMaps(base *Chain, v4, v6 bool) map[string]*Set {
	jumpMaps := map[string]*Set{}
	for _, dir := range []string{"eg", "in"} {
		for _, fam := range []struct{ on, v6 bool }{{v4, false}, {v6, true}} {
			if !fam.on {
				continue
			}
			name := JumpMap(dir, fam.v6)
			jumpMaps[name] = &Set{Name: name, V6: fam.v6, VMap: true}
			r := Rule{V6: fam.v6, Verdict: Continue}
			if dir == "eg" {
				r.Src = Addr{VMap: name}
			} else {
				r.Dst = Addr{VMap: name}
			}
			base.Rules = append(base.Rules, r)
		}
	}
	return jumpMaps
}

// knownSets adds known4 and known6 (the families in use): the local
// pods' addresses and the unmanaged ones come of age. Both are returned,
// by family.
func (c *compiler) knownSets(v4, v6 bool) map[bool]*Set {
	known := map[bool]*Set{false: {Name: "known4"}, true: {Name: "known6", V6: true}}
	for _, p := range c.local {
		for _, ip := range p.ips {
			known[ip.Is6()].Elems = append(known[ip.Is6()].Elems, ip)
		}
	}
	for _, ip := range c.unmanaged() {
		known[ip.Is6()].Elems = append(known[ip.Is6()].Elems, ip)
	}
	for _, s := range []*Set{known[false], known[true]} {
		if s.V6 && !v6 || !s.V6 && !v4 {
			continue
		}
		slices.SortFunc(s.Elems, netip.Addr.Compare)
		s.Elems = slices.Compact(s.Elems)
		c.sets[s.Name] = *s
	}
	return known
}
