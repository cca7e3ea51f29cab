package policy

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/twill-net/twill/policy/cnpapi"
)

// ClusterNetworkPolicy's two tiers around NetworkPolicy. A local pod's
// chain for one direction, when a ClusterNetworkPolicy selects it there:
//
//	in:ns/pod
//	  <Admin tier rules, by priority, then name, then rule order>
//	    Accept: return (allowed in this direction), Deny: drop,
//	    Pass: goto in+:ns/pod
//	  goto in+:ns/pod              (inline instead when no rule passes)
//	in+:ns/pod
//	  <NetworkPolicy allow rules; drop>   when a NetworkPolicy isolates it
//	  <Baseline tier rules>               otherwise; Pass is return
//	  (end: return, the default allow)
//
// A rule twill cannot read in full fails closed as the API says: an
// Accept matches nothing it did not read, a Deny or a Pass denies all.

// ClusterPolicyPrefix names a ClusterNetworkPolicy where a NetworkPolicy
// is named namespace/name (comments, metrics, problems): no namespace
// has a capital letter.
const ClusterPolicyPrefix = "ClusterNetworkPolicy/"

// RestChainName is the chain a local pod's Admin tier goes on to (by a
// Pass, or at its end) when it has a Pass rule.
func RestChainName(dir, podKey string) string { return ChainName(dir+"+", podKey) }

// tierRule is one ClusterNetworkPolicy rule, compiled for one pod.
type tierRule struct {
	action cnpapi.Action
	rules  []Rule // Verdict left to the chain's assembly (Goto's target)
}

// clusterPolicy is a ClusterNetworkPolicy as the compiler orders it.
type clusterPolicy struct {
	p    *cnpapi.ClusterNetworkPolicy
	name string // ClusterPolicyPrefix + name
	sel  matcher
	ok   bool // its subject could be read
	// unknown are its rules that hold a field twill does not know ("in0",
	// "eg2"), each with the field's path.
	unknown map[string]string
}

func (c *compiler) clusterPolicies(ps []*cnpapi.ClusterNetworkPolicy) []clusterPolicy {
	out := make([]clusterPolicy, 0, len(ps))
	for _, p := range ps {
		cp := clusterPolicy{p: p, name: ClusterPolicyPrefix + p.Name, ok: true}
		var err error
		switch s := p.Spec.Subject; {
		case s.Namespaces != nil && s.Pods == nil:
			cp.sel, err = selectorMatcher(s.Namespaces, nil)
		case s.Pods != nil && s.Namespaces == nil:
			cp.sel, err = selectorMatcher(&s.Pods.NamespaceSelector, &s.Pods.PodSelector)
		default:
			err = fmt.Errorf("spec.subject: exactly one of namespaces and pods must be set")
		}
		if err == nil && p.Spec.Tier != cnpapi.Admin && p.Spec.Tier != cnpapi.Baseline {
			err = fmt.Errorf("spec.tier %q: want Admin or Baseline", p.Spec.Tier)
		}
		if err == nil {
			cp.unknown, err = unknownRules(p.Unknown)
		}
		if err != nil {
			// Fail closed: it selects nothing it might not mean, and its
			// status says why.
			c.problems = append(c.problems, Problem{cp.name, err})
			cp.ok = false
		}
		out = append(out, cp)
	}
	slices.SortFunc(out, func(a, b clusterPolicy) int {
		if a.p.Spec.Priority != b.p.Spec.Priority {
			return int(a.p.Spec.Priority - b.p.Spec.Priority)
		}
		return strings.Compare(a.p.Name, b.p.Name)
	})
	return out
}

// unknownRules sorts the fields Decode did not know: in a rule, the rule
// fails closed; elsewhere in the spec, the policy is refused whole.
func unknownRules(paths []string) (map[string]string, error) {
	out := map[string]string{}
	for _, p := range paths {
		var dir string
		var i int
		switch {
		case scanRule(p, "spec.ingress[%d]", &i):
			dir = "in"
		case scanRule(p, "spec.egress[%d]", &i):
			dir = "eg"
		case strings.HasPrefix(p, "spec.") || p == "spec":
			return nil, fmt.Errorf("%s: a field twill does not know (a newer ClusterNetworkPolicy API?): the policy is not enforced", p)
		default:
			continue // status, metadata: not the policy's
		}
		if _, ok := out[fmt.Sprint(dir, i)]; !ok {
			out[fmt.Sprint(dir, i)] = p
		}
	}
	return out, nil
}

func scanRule(path, format string, i *int) bool {
	n, err := fmt.Sscanf(path, format, i)
	return err == nil && n == 1
}

// selectorMatcher matches the pods of the namespaces nsSel selects that
// podSel (nil: all) selects.
func selectorMatcher(nsSel, podSel *metav1.LabelSelector) (matcher, error) {
	m := matcher{podSel: labels.Everything()}
	var err error
	if m.nsSel, err = metav1.LabelSelectorAsSelector(nsSel); err != nil {
		return m, fmt.Errorf("namespaceSelector: %w", err)
	}
	if podSel != nil {
		if m.podSel, err = metav1.LabelSelectorAsSelector(podSel); err != nil {
			return m, fmt.Errorf("podSelector: %w", err)
		}
	}
	return m, nil
}

func (m matcher) matches(c *compiler, p *pod) bool {
	return (m.nsSel == nil && m.ns == p.ns || m.nsSel != nil && m.nsSel.Matches(c.nsLabels[p.ns])) && m.podSel.Matches(p.labels)
}

// addClusterPolicies compiles every ClusterNetworkPolicy for the local
// pods its subject selects, into c.admin and c.baseline.
func (c *compiler) addClusterPolicies(ps []*cnpapi.ClusterNetworkPolicy, check bool) {
	defer func() { c.owner = "" }()
	if c.clusterParsed == nil {
		c.clusterParsed = c.clusterPolicies(ps)
	}
	c.clusterIn = ps
	for _, cp := range c.clusterParsed {
		if !cp.ok {
			continue
		}
		if check {
			c.checkClusterPolicy(cp)
		}
		c.owner = cp.name
		tier := c.admin
		if cp.p.Spec.Tier == cnpapi.Baseline {
			tier = c.baseline
		}
		for _, p := range c.targets {
			if !cp.sel.matches(c, p) {
				continue
			}
			c.compiled(p.key, cp.name)
			for _, dir := range []string{"in", "eg"} {
				// The same for every pod when no named port makes them
				// differ: worked out once (and kept by Compiler's steps).
				rules, ok := c.deps.clusterRules[cp.name+" "+dir]
				if !ok {
					rules = c.clusterRules(cp, dir, p)
					if !cp.namedIngress() || dir == "eg" {
						c.deps.clusterRules[cp.name+" "+dir] = rules
					}
				}
				if len(rules) == 0 {
					continue
				}
				key := p.key + " " + dir
				tier[key] = append(tier[key], rules...)
				if cp.p.Spec.Tier == cnpapi.Admin {
					c.adminBy[key] = append(c.adminBy[key], cp.name)
					if cp.namedIngress() && dir == "in" {
						c.adminOwn[key] = true
					}
				}
				s := c.selected[p.key]
				if s == nil {
					s = &Selection{}
					c.selected[p.key] = s
				}
				if dir == "in" {
					s.ClusterIngress = append(s.ClusterIngress, cp.name)
				} else {
					s.ClusterEgress = append(s.ClusterEgress, cp.name)
				}
			}
		}
	}
}

// checkClusterPolicy reports every problem of a policy's rules, whether or
// not it selects a local pod: each node's twilld then says the same of it
// (its status is one node's). The rules are compiled for no pod, on a copy
// whose sets are thrown away.
func (c *compiler) checkClusterPolicy(cp clusterPolicy) {
	v := *c
	v.sets, v.problems, v.deps, v.selectorCache = map[string]Set{}, nil, newDeps(), map[string][]peer{}
	for _, dir := range []string{"in", "eg"} {
		v.clusterRules(cp, dir, &pod{})
	}
	c.problems = append(c.problems, v.problems...)
}

// uniqueProblems drops the repeats of a problem (a policy's rules are
// compiled for each pod it selects), keeping the first of each.
func uniqueProblems(ps []Problem) []Problem {
	seen := map[string]bool{}
	out := ps[:0]
	for _, p := range ps {
		key := p.Policy + "\x00" + p.Err.Error()
		if !seen[key] {
			seen[key] = true
			out = append(out, p)
		}
	}
	return out
}

func (cp clusterPolicy) namedIngress() bool {
	for _, r := range cp.p.Spec.Ingress {
		for _, pr := range r.Protocols {
			if pr.DestinationNamedPort != "" {
				return true
			}
		}
	}
	return false
}

// cnpRule names one rule of a ClusterNetworkPolicy: its sets' names.
type cnpRule struct {
	policy string // ClusterPolicyPrefix + name
	dir    string
	index  int
}

func (id cnpRule) name() string {
	h := sha256.Sum256([]byte(id.policy))
	return fmt.Sprintf("c%s%d-%s", id.dir, id.index, hex.EncodeToString(h[:5]))
}

func (id cnpRule) field() string { return fmt.Sprintf("spec.%s[%d]", dirField(id.dir), id.index) }

func (id cnpRule) problem(c *compiler, format string, args ...any) {
	c.problems = append(c.problems, Problem{id.policy, fmt.Errorf(id.field()+"."+format, args...)})
}

// clusterRules compiles one policy's rules in one direction for target.
func (c *compiler) clusterRules(cp clusterPolicy, dir string, target *pod) []tierRule {
	var out []tierRule
	n := len(cp.p.Spec.Ingress)
	if dir == "eg" {
		n = len(cp.p.Spec.Egress)
	}
	for i := range n {
		id := cnpRule{policy: cp.name, dir: dir, index: i}
		var action cnpapi.Action
		var peers []peer
		var named []string
		var ports []port
		var failed bool
		if dir == "in" {
			r := cp.p.Spec.Ingress[i]
			action = r.Action
			peers, failed = c.ingressPeers(id, r.From)
			ports, named, failed = c.clusterPorts(id, r.Protocols, failed)
			ports = append(ports, c.namedTargetPorts(named, target)...)
			named = nil
		} else {
			r := cp.p.Spec.Egress[i]
			action = r.Action
			peers, failed = c.egressPeers(id, r.To, action)
			ports, named, failed = c.clusterPorts(id, r.Protocols, failed)
			if len(named) > 0 {
				out = append(out, tierRule{action, c.namedClusterEgress(id, r.To, named)})
			}
		}
		if f, ok := cp.unknown[fmt.Sprint(dir, i)]; ok {
			c.problems = append(c.problems, Problem{cp.name, fmt.Errorf("%s: a field twill does not know (a newer ClusterNetworkPolicy API?): the rule fails closed", f)})
			failed = true
			if action == cnpapi.Accept {
				continue // matches nothing
			}
		}
		if action != cnpapi.Accept && action != cnpapi.Deny && action != cnpapi.Pass {
			id.problem(c, "action %q: want Accept, Deny or Pass", action)
			failed, action = true, cnpapi.Deny
		}
		if failed && action != cnpapi.Accept {
			// The API's fail-closed reading of a Deny or a Pass it cannot
			// read in full: deny all.
			out = append(out, tierRule{cnpapi.Deny, []Rule{c.tierRule(id, peer{any: true}, port{any: true})}})
			continue
		}
		tr := tierRule{action: action}
		for _, pe := range peers {
			for _, pt := range ports {
				tr.rules = append(tr.rules, c.tierRule(id, pe, pt))
			}
		}
		if len(tr.rules) > 0 {
			out = append(out, tr)
		}
	}
	return out
}

// tierRule matches one peer on one port; its verdict is tierRules'.
func (c *compiler) tierRule(id cnpRule, pe peer, pt port) Rule {
	r := Rule{Counter: true, Why: id.policy + " " + id.field()}
	r.match(pe, pt, id.dir == "eg")
	return r
}

// ingressPeers reads a rule's from: pods by their namespaces, or by their
// namespaces and their own labels. A peer with no field it knows makes
// the rule fail closed.
func (c *compiler) ingressPeers(id cnpRule, from []cnpapi.IngressPeer) (out []peer, failed bool) {
	var ms []matcher
	for j, pr := range from {
		m, ok := c.cnpMatcher(id, "from", j, pr.Namespaces, pr.Pods)
		if !ok {
			failed = true
			continue
		}
		ms = append(ms, m)
	}
	return c.matcherPeers(id.name(), ms), failed
}

// cnpMatcher reads a peer's namespaces and pods (field[j] of the rule), or
// says why it cannot.
func (c *compiler) cnpMatcher(id cnpRule, field string, j int, ns *metav1.LabelSelector, pods *cnpapi.NamespacedPod) (matcher, bool) {
	m, err := peerSelector(ns, pods)
	if err != nil {
		id.problem(c, "%s[%d]: %v", field, j, err)
		return m, false
	}
	return m, true
}

func peerSelector(ns *metav1.LabelSelector, pods *cnpapi.NamespacedPod) (matcher, error) {
	switch {
	case ns != nil && pods == nil:
		return selectorMatcher(ns, nil)
	case pods != nil && ns == nil:
		return selectorMatcher(&pods.NamespaceSelector, &pods.PodSelector)
	}
	return matcher{}, fmt.Errorf("exactly one of namespaces, pods, networks, nodes must be set")
}

func (c *compiler) matcherPeers(base string, ms []matcher) []peer {
	if len(ms) == 0 {
		return nil
	}
	if p, ok := c.clusterCache[base]; ok { // the same rule, for another pod
		c.usePeers(p)
		return p
	}
	// A set per selector, as NetworkPolicy's peers: the rules of any
	// policy that name the same pods share its sets.
	var out []peer
	for _, m := range ms {
		for _, p := range c.selectorSets(m) {
			if !slices.ContainsFunc(out, func(q peer) bool { return q.addr.Set == p.addr.Set }) {
				out = append(out, p)
			}
		}
	}
	c.clusterCache[base] = out
	return out
}

// egressPeers reads a rule's to: pods, networks, nodes. domainNames
// is not enforced: an Accept's matches nothing (the API allows it only
// in Accept rules), and the policy's status says so.
func (c *compiler) egressPeers(id cnpRule, to []cnpapi.EgressPeer, action cnpapi.Action) (out []peer, failed bool) {
	var ms []matcher
	var nodes []netip.Addr
	for j, pr := range to {
		set := 0
		for _, b := range []bool{pr.Namespaces != nil, pr.Pods != nil, pr.Nodes != nil, pr.Networks != nil, pr.DomainNames != nil} {
			if b {
				set++
			}
		}
		switch {
		case set != 1:
			id.problem(c, "to[%d]: exactly one of namespaces, pods, networks, nodes, domainNames must be set", j)
			failed = true
		case pr.DomainNames != nil:
			id.problem(c, "to[%d].domainNames: not supported by twill: this peer matches nothing", j)
			failed = failed || action != cnpapi.Accept
		case pr.Networks != nil:
			nets, err := c.networks(pr.Networks)
			if err != nil {
				id.problem(c, "to[%d].networks%v", j, err)
				failed = true
			}
			out = append(out, nets...)
		case pr.Nodes != nil:
			sel, err := metav1.LabelSelectorAsSelector(pr.Nodes)
			if err != nil {
				id.problem(c, "to[%d].nodes: %v", j, err)
				failed = true
				continue
			}
			nodes = append(nodes, c.nodeAddrs(sel)...)
		default:
			m, ok := c.cnpMatcher(id, "to", j, pr.Namespaces, pr.Pods)
			if !ok {
				failed = true
				continue
			}
			ms = append(ms, m)
		}
	}
	if len(nodes) > 0 {
		out = append(out, c.addrSets(id.name()+"-n", nodes, nil)...)
	}
	return append(c.matcherPeers(id.name(), ms), out...), failed
}

// networks reads CIDRs: a peer each, in the families the node uses.
func (c *compiler) networks(cidrs []string) ([]peer, error) {
	v4, v6 := c.families()
	var out []peer
	for k, s := range cidrs {
		pfx, err := netip.ParsePrefix(s)
		if err != nil {
			a, aerr := netip.ParseAddr(s) // the API takes a lone address too
			if aerr != nil {
				return nil, fmt.Errorf("[%d] %q: %w", k, s, err)
			}
			pfx = netip.PrefixFrom(a, a.BitLen())
		}
		pfx = pfx.Masked()
		if pfx.Addr().Is6() && !v6 || pfx.Addr().Is4() && !v4 {
			continue
		}
		out = append(out, peer{v6: pfx.Addr().Is6(), addr: Addr{Prefix: pfx}})
	}
	return out, nil
}

// nodeAddrs are the addresses of the Nodes sel selects, as their status
// lists them.
func (c *compiler) nodeAddrs(sel labels.Selector) []netip.Addr {
	var out []netip.Addr
	for _, n := range c.nodes {
		if !sel.Matches(labels.Set(n.Labels)) {
			continue
		}
		for _, a := range n.Status.Addresses {
			if ip, err := netip.ParseAddr(a.Address); err == nil {
				out = append(out, ip.Unmap())
			}
		}
	}
	return out
}

// clusterPorts reads a rule's protocols: numbered ones, and the names of
// named ones (resolved per pod by the caller). None is any port.
func (c *compiler) clusterPorts(id cnpRule, ps []cnpapi.Protocol, failed bool) (out []port, named []string, _ bool) {
	if len(ps) == 0 {
		return []port{{any: true}}, nil, failed
	}
	for k, p := range ps {
		set := 0
		var proto uint8
		var pm *cnpapi.PortMatch
		for _, x := range []struct {
			m     *cnpapi.PortMatch
			proto uint8
		}{{p.TCP, unix.IPPROTO_TCP}, {p.UDP, unix.IPPROTO_UDP}, {p.SCTP, unix.IPPROTO_SCTP}} {
			if x.m != nil {
				set++
				proto, pm = x.proto, x.m
			}
		}
		if p.DestinationNamedPort != "" {
			set++
		}
		if set != 1 {
			id.problem(c, "protocols[%d]: exactly one of tcp, udp, sctp, destinationNamedPort must be set", k)
			failed = true
			continue
		}
		if p.DestinationNamedPort != "" {
			named = append(named, p.DestinationNamedPort)
			continue
		}
		pt, err := portOf(proto, pm.DestinationPort)
		if err != nil {
			id.problem(c, "protocols[%d].%s.destinationPort%v", k, ProtoName(proto), err)
			failed = true
			continue
		}
		out = append(out, pt)
	}
	return out, named, failed
}

func portOf(proto uint8, p *cnpapi.Port) (port, error) {
	if p == nil {
		return port{proto: proto}, nil
	}
	lo, hi := p.Number, p.Number
	field := fmt.Sprintf(".number %d", p.Number)
	if p.Range != nil {
		if p.Number != 0 {
			return port{}, fmt.Errorf(": exactly one of number and range must be set")
		}
		lo, hi = p.Range.Start, p.Range.End
		field = fmt.Sprintf(".range %d-%d", lo, hi)
	}
	if lo < 1 || hi > 65535 || hi < lo {
		return port{}, fmt.Errorf("%s: want 1-65535, start ≤ end", field)
	}
	return port{proto: proto, lo: uint16(lo), hi: uint16(hi)}, nil
}

// namedTargetPorts resolves named ports against the pod they go to.
func (c *compiler) namedTargetPorts(names []string, target *pod) []port {
	var out []port
	for _, n := range names {
		for _, np := range target.ports[n] {
			out = append(out, port{proto: np.proto, lo: np.port, hi: np.port})
		}
	}
	return out
}

// namedClusterEgress matches a named destination port: the pods of the
// rule's pod peers that give the name to a port, one set per protocol
// and number.
func (c *compiler) namedClusterEgress(id cnpRule, to []cnpapi.EgressPeer, names []string) []Rule {
	var ms []matcher
	for _, pr := range to {
		if pr.Namespaces == nil && pr.Pods == nil {
			continue // addresses have no port names
		}
		if m, err := peerSelector(pr.Namespaces, pr.Pods); err == nil {
			ms = append(ms, m)
		}
	}
	byPort := map[namedPort][]netip.Addr{}
	c.namedFrom(id.name(), names, ms, false)
	c.eachMatching(ms, func(pp *pod) {
		for _, n := range names {
			for _, np := range pp.ports[n] {
				byPort[np] = append(byPort[np], pp.ips...)
			}
		}
	})
	keys := slices.SortedFunc(maps.Keys(byPort), func(a, b namedPort) int {
		if a.proto != b.proto {
			return int(a.proto) - int(b.proto)
		}
		return int(a.port) - int(b.port)
	})
	var out []Rule
	for _, np := range keys {
		base := fmt.Sprintf("%s-n%d-%d", id.name(), np.proto, np.port)
		for _, pe := range c.addrSets(base, byPort[np], nil) {
			out = append(out, c.tierRule(id, pe, port{proto: np.proto, lo: np.port, hi: np.port}))
		}
	}
	return out
}

// tierRules lays out a tier's rules with their verdicts: Accept returns
// (allowed in this direction), Deny drops, Pass goes to rest (the Admin
// tier's) or returns (the Baseline tier's: the default allows).
func tierRules(trs []tierRule, rest string) []Rule {
	var out []Rule
	for _, tr := range trs {
		for _, r := range tr.rules {
			name, _, _ := strings.Cut(r.Why, " ")
			switch tr.action {
			case cnpapi.Accept:
				r.Verdict, r.Comment = Return, "allow "+name
			case cnpapi.Deny:
				r.Verdict, r.Comment = Drop, "deny "+name
			case cnpapi.Pass:
				r.Verdict, r.Comment = Return, "pass "+name
				if rest != "" {
					r.Verdict, r.Target = Goto, rest
				}
			}
			out = append(out, r)
		}
	}
	return out
}

func passes(trs []tierRule) bool {
	return slices.ContainsFunc(trs, func(tr tierRule) bool { return tr.action == cnpapi.Pass && len(tr.rules) > 0 })
}
