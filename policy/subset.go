package policy

import (
	"slices"
	"strings"
)

// SubsetPath is where twilld serves a NodeView, given pod= and ip=
// parameters (GET, beside /metrics).
const SubsetPath = "/policy/ruleset"

// NodeView is what a node's twilld says of its table for some pods: the
// Subset it last wrote, and what of it the kernel's table does not hold
// (Table.Drifted).
type NodeView struct {
	Ruleset Ruleset
	Drifted []string `json:",omitempty"`
	// DriftErr says why the kernel's table could not be compared.
	DriftErr string `json:",omitempty"`
}

// Subset is the part of a Ruleset that decides for the given local pods
// (namespace/name) and addresses: their chains, without the rules that only
// log, and the sets those chains read; the jump maps and known sets, cut
// to the addresses. It leaves out what depends on twilld's flags or the
// node's own files (logging, the base chain, the CNI plugin's allocations),
// so that two twillds given the same apiserver state agree on it: what
// `twillctl policy explain` compares with the node's.
func (rs Ruleset) Subset(pods []string, ips []string) Ruleset {
	var out Ruleset
	used := map[string]bool{}
	mine := func(c Chain) bool { // a pod's chain, or its rest chain after the Admin tier
		_, key, _ := strings.Cut(c.Name, ":")
		return !IsBase(c.Name) && !IsShared(c.Name) && slices.Contains(pods, key) &&
			(c.Name == ChainName(c.Name[:2], key) || c.Name == RestChainName(c.Name[:2], key))
	}
	shared := map[string]bool{} // the shared Admin chains the pods go to
	for _, c := range rs.Chains {
		if mine(c) {
			for _, r := range c.Rules {
				if r.Verdict == Goto && IsShared(r.Target) {
					shared[r.Target] = true
				}
			}
		}
	}
	for _, c := range rs.Chains {
		if !mine(c) && !shared[c.Name] {
			continue
		}
		kept := Chain{Name: c.Name}
		for _, r := range c.Rules {
			if r.Log != "" || r.LimitOver {
				continue
			}
			for _, n := range []string{r.Src.Set, r.Dst.Set, r.Src.NotSet, r.Dst.NotSet} {
				used[n] = n != ""
			}
			kept.Rules = append(kept.Rules, r)
		}
		out.Chains = append(out.Chains, kept)
	}
	for _, s := range rs.Sets {
		switch {
		case used[s.Name]:
			out.Sets = append(out.Sets, s)
		case s.VMap || strings.HasPrefix(s.Name, "known"):
			cut := Set{Name: s.Name, V6: s.V6, VMap: s.VMap}
			for i, a := range s.Elems {
				if slices.Contains(ips, a.String()) {
					cut.Elems = append(cut.Elems, a)
					if s.VMap {
						cut.Jumps = append(cut.Jumps, s.jump(i))
					}
				}
			}
			out.Sets = append(out.Sets, cut)
		}
	}
	return out
}
