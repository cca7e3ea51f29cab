package policy

import (
	"crypto/sha256"
	"encoding/hex"
	"maps"
	"net/netip"
	"slices"
)

// The compiler's output: the chains and sets of table inet twill-policy,
// with the jumps that send each pod's traffic to its chains.

// denyComment names the final drop of a pod's chain: the metrics count it
// against the policies that select the pod in that direction.
func denyComment(dir, podKey string) string {
	if dir == "in" {
		return "deny ingress " + podKey
	}
	return "deny egress " + podKey
}

// LogPrefix is a log rule's prefix for what its comment would say, cut
// to the kernel's 127 bytes.
func LogPrefix(what string) string {
	p := "twill " + what
	if len(p) > 127 {
		p = p[:127]
	}
	return p
}

// logAllowed ends the base chain with the rules that log the new
// connections it let through to or from the local pods whose namespace
// asked for it (or every local pod, with Snapshot.LogAllowed): one in
// c.sample, at most AllowedLogRate a second per direction and family.
func (c *compiler) logAllowed(base *Chain, v4, v6 bool) {
	sets := map[bool]*Set{false: {Name: "log-allowed4"}, true: {Name: "log-allowed6", V6: true}}
	for _, s := range sets {
		if k, ok := c.kept[s.Name]; ok {
			*s = k
		}
	}
	for _, p := range c.local {
		if c.kept != nil {
			break // the sets are the last compile's
		}
		if !c.logAllowedAll && !c.logNS[p.ns] {
			continue
		}
		for _, ip := range p.ips {
			sets[ip.Is6()].Elems = append(sets[ip.Is6()].Elems, ip)
		}
	}
	for _, fam := range []struct{ on, v6 bool }{{v4, false}, {v6, true}} {
		s := sets[fam.v6]
		if !fam.on || len(s.Elems) == 0 {
			continue
		}
		if c.kept == nil { // a kept set is sorted, and read by the last compile's readers
			slices.SortFunc(s.Elems, netip.Addr.Compare)
			s.Elems = slices.Compact(s.Elems)
		}
		c.sets[s.Name] = *s
		base.Rules = append(base.Rules,
			Rule{V6: fam.v6, Src: Addr{Set: s.Name}, Sample: c.sample, Limit: AllowedLogRate, Log: LogPrefix("allow egress"), Verdict: Continue},
			Rule{V6: fam.v6, Dst: Addr{Set: s.Name}, Sample: c.sample, Limit: AllowedLogRate, Log: LogPrefix("allow ingress"), Verdict: Continue})
	}
}

// globalSets are the sets made of every local pod: Compiler keeps them
// when no local pod changed its addresses or chains.
var globalSets = []string{"known4", "known6", "log-allowed4", "log-allowed6",
	JumpMap("eg", false), JumpMap("eg", true), JumpMap("in", false), JumpMap("in", true),
	RestMap("eg", false), RestMap("eg", true), RestMap("in", false), RestMap("in", true)}

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
func (c *compiler) unmanagedAddrs() []netip.Addr {
	if !c.unmanagedRead {
		c.unmanaged, c.unmanagedRead = c.findUnmanaged(), true
	}
	return c.unmanaged
}

func (c *compiler) findUnmanaged() []netip.Addr {
	if c.waiting || len(c.allocations) == 0 {
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

// result is the table: the targets' chains worked out, the other local
// pods' kept from the compile before (Compiler).
func (c *compiler) result() Result {
	for _, p := range c.targets {
		c.chains[p.key] = append(c.podChains("eg", p), c.podChains("in", p)...)
	}
	shared := c.sharedChains()
	for _, name := range globalSets {
		delete(c.sets, name) // the last compile's, when kept
	}
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
	chains := make([]Chain, 0, 2*len(c.local)+len(shared))
	chains = append(chains, shared...)
	jumpMaps := addJumpMaps(&base, v4, v6)
	for _, p := range c.local {
		chains = append(chains, c.chains[p.key]...)
	}
	restMaps := restMapsOf(shared, v4, v6)
	if c.kept == nil { // else the maps are the last compile's
		c.fillJumps(jumpMaps)
		c.fillRest(restMaps)
	}
	// The input hook sees a local pod's packets to its own node: the
	// egress maps alone, after what conntrack already let through.
	input := Chain{Name: ChainInput, Rules: []Rule{{Established: true, Verdict: Accept}}}
	if v6 {
		// A pod's neighbour solicitations and advertisements to its node:
		// without them no IPv6 packet reaches it, or leaves it.
		input.Rules = append(input.Rules, Rule{V6: true, NeighbourDiscovery: true, Verdict: Accept})
	}
	for _, r := range base.Rules {
		if r.Src.VMap != "" {
			input.Rules = append(input.Rules, r)
		}
	}
	c.logAllowed(&base, v4, v6)
	for _, m := range append(slices.Collect(maps.Values(jumpMaps)), slices.Collect(maps.Values(restMaps))...) {
		if k, ok := c.kept[m.Name]; ok {
			c.sets[m.Name] = k
			continue
		}
		sortJumps(m)
		c.sets[m.Name] = *m
	}
	c.globals = map[string]Set{}
	for _, name := range globalSets {
		if s, ok := c.sets[name]; ok {
			c.globals[name] = s
		}
	}
	// The pods' chains stay in the pods' order (not sorted by name: 4.6
	// ms a change of 13,000 chains, BenchmarkCompilerChange).
	rs.Chains = append([]Chain{base, input}, chains...)
	for _, name := range slices.Sorted(maps.Keys(c.sets)) {
		rs.Sets = append(rs.Sets, c.sets[name])
	}
	if c.selectedOut == nil {
		c.selectedOut = make(map[string]Selection, len(c.selected))
		for k, s := range c.selected {
			c.selectedOut[k] = *s
		}
	}
	// The targets' rules by policy are in their chains now: the next
	// compile, which keeps c, needs them no more.
	c.ingress, c.egress, c.admin, c.baseline, c.adminBy, c.adminOwn = nil, nil, nil, nil, nil, nil
	return Result{Ruleset: rs, Selected: c.selectedOut, Problems: c.problems}
}

// fillJumps sends each local pod's addresses to its chains, in each
// direction it has one.
func (c *compiler) fillJumps(jumpMaps map[string]*Set) {
	for _, dir := range []string{"eg", "in"} {
		for _, p := range c.local {
			if !c.hasChain(dir, p) {
				continue
			}
			name := ChainName(dir, p.key)
			for _, ip := range p.ips {
				if m := jumpMaps[JumpMap(dir, ip.Is6())]; m != nil {
					m.Elems, m.Jumps = append(m.Elems, ip), append(m.Jumps, name)
				}
			}
		}
	}
}

// hasChain says whether a policy of any tier selects p in direction dir.
func (c *compiler) hasChain(dir string, p *pod) bool {
	s := c.selected[p.key]
	if s == nil {
		return false
	}
	if dir == "in" {
		return len(s.Ingress) > 0 || len(s.ClusterIngress) > 0
	}
	return len(s.Egress) > 0 || len(s.ClusterEgress) > 0
}

// podChains is a local pod's chain for one direction (none when no
// policy selects it there), and its Admin tier's rest chain when a Pass
// rule needs one.
func (c *compiler) podChains(dir string, p *pod) []Chain {
	if !c.hasChain(dir, p) {
		return nil
	}
	s := c.selected[p.key]
	by, allow := s.Ingress, c.ingress[p.key]
	if dir == "eg" {
		by, allow = s.Egress, c.egress[p.key]
	}
	admin, baseline := c.admin[p.key+" "+dir], c.baseline[p.key+" "+dir]
	// The chain opens with the policies that select the pod, for
	// twillctl status; each counts the pod's new connections.
	cluster := s.ClusterIngress
	if dir == "eg" {
		cluster = s.ClusterEgress
	}
	name, restName := ChainName(dir, p.key), RestChainName(dir, p.key)
	shares := c.sharesAdmin(p.key)[dirIndex(dir)]
	if shares {
		// The Admin tier is in a chain the pods it selects share: this
		// chain lists the other policies, and goes there.
		cluster = notIn(cluster, c.adminBy[p.key+" "+dir])
	}
	selectedBy := make([]Rule, 0, len(by)+len(cluster)+1)
	for _, pol := range append(slices.Clone(by), cluster...) {
		selectedBy = append(selectedBy, Rule{Counter: true, Verdict: Continue, Comment: SelectedBy + pol})
	}
	// After the Admin tier: NetworkPolicy when one isolates the pod,
	// else the Baseline tier.
	var rest []Rule
	if len(by) > 0 {
		n := 2
		for _, a := range allow {
			n += len(a)
		}
		rest = make([]Rule, 0, n)
		for _, a := range allow {
			rest = append(rest, a...)
		}
		if c.logDenied {
			rest = append(rest, Rule{Verdict: Continue, Limit: LogRate, Log: LogPrefix(denyComment(dir, p.key))},
				Rule{Verdict: Continue, Limit: LogRate, LimitOver: true, Counter: true, Comment: UnloggedPrefix + denyComment(dir, p.key)})
		}
		rest = append(rest, Rule{Counter: true, Verdict: Drop, Comment: denyComment(dir, p.key)})
	} else {
		rest = tierRules(baseline, "")
	}
	if shares {
		shared := c.sharedOf[p.key]
		shared[dirIndex(dir)] = c.sharedAdmin(dir, p, admin)
		c.sharedOf[p.key] = shared
		rules := append(selectedBy, Rule{Verdict: Goto, Target: shared[dirIndex(dir)], Comment: AdminTier + shared[dirIndex(dir)]})
		return []Chain{{Name: name, Rules: rules}, {Name: restName, Rules: rest}}
	}
	if !passes(admin) {
		return []Chain{{Name: name, Rules: slices.Concat(selectedBy, tierRules(admin, ""), rest)}}
	}
	rules := slices.Concat(selectedBy, tierRules(admin, restName), []Rule{{Verdict: Goto, Target: restName}})
	return []Chain{{Name: name, Rules: rules}, {Name: restName, Rules: rest}}
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
	if c.kept != nil {
		for _, s := range known {
			if k, ok := c.kept[s.Name]; ok {
				*s = k
				c.sets[s.Name] = k
			}
		}
		return known
	}
	for _, p := range c.local {
		for _, ip := range p.ips {
			known[ip.Is6()].Elems = append(known[ip.Is6()].Elems, ip)
		}
	}
	for _, ip := range c.unmanagedAddrs() {
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
