package policy

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// A rule's two sides, as the compiler works them out: the peers a policy
// names (pods by selector, namespaces, IP blocks, as address sets) and the
// ports (numbered, or named and resolved per pod).

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
		c.usePeers(p)
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
	var sel, out []peer
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
		for _, p := range c.selectorSets(m) {
			if !slices.ContainsFunc(sel, func(q peer) bool { return q.addr.Set == p.addr.Set }) { // the same peer twice in one rule
				sel = append(sel, p)
			}
		}
	}
	return append(sel, out...)
}

// selectorSets is a set per family of the pods m matches, named from m's
// selectors (and, for a peer with no namespace selector, the policy's
// namespace): every rule that names the same peer, in any policy, shares
// its sets, so their elements grow with the peers named, not with the
// policies that name them; and a change of who matches rewrites elements,
// not rules.
func (c *compiler) selectorSets(m matcher) []peer {
	name := m.setName()
	if p, ok := c.selectorCache[name]; ok {
		c.usePeers(p)
		return p
	}
	ms := []matcher{m}
	var ips []netip.Addr
	c.eachMatching(ms, func(p *pod) { ips = append(ips, p.ips...) })
	p := c.addrSets(name, ips, ms)
	c.selectorCache[name] = p
	return p
}

// setName names the sets of the pods m matches.
func (m matcher) setName() string {
	key := "namespace " + m.ns
	if m.nsSel != nil {
		key = "namespaceSelector " + m.nsSel.String()
	}
	h := sha256.Sum256([]byte(key + "\x00podSelector " + m.podSel.String()))
	return "sel-" + hex.EncodeToString(h[:6])
}

func dirField(dir string) string {
	if dir == "in" {
		return "ingress"
	}
	return "egress"
}

// addrSets adds a set per family in use named base-4 and base-6 holding
// ips, and returns a peer for each. from, when set, are the matchers of
// the pods ips are of: a change of pods that any matches changes the sets.
func (c *compiler) addrSets(base string, ips []netip.Addr, from []matcher) []peer {
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
		c.madeSet(s.Name, from)
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
	c.namedFrom(fmt.Sprint(id.name(), " ", proto), []string{p.Port.StrVal}, matchers, len(to) == 0)
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
		for _, pe := range c.addrSets(base, byPort[num], nil) {
			out = append(out, c.allow(id, pe, port{proto: proto, lo: num, hi: num}, true))
		}
	}
	return out
}

// allow is the rule letting one peer through on one port: back to the
// base chain, counted for the policy.
func (c *compiler) allow(id ruleID, pe peer, pt port, egress bool) Rule {
	r := Rule{Counter: true, Verdict: Return, Comment: "allow " + id.policyName(),
		Why: fmt.Sprintf("%s spec.%s[%d]", id.policyName(), dirField(id.dir), id.index)}
	r.match(pe, pt, egress)
	return r
}

// match makes r match one peer (the destination when egress, else the
// source) on one port.
func (r *Rule) match(pe peer, pt port, egress bool) {
	r.V6 = pe.v6
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
}
