package policy

import (
	"net/netip"
)

// Evaluate runs a packet through a Ruleset as the kernel runs it through
// table inet twill-policy: the same rules, the same order, the same
// sets. It is what `twillctl policy explain` and the verdict log use to
// say which rule decided, so that neither is a second implementation of
// the policy.

// Packet is what the table matches a packet on.
type Packet struct {
	Src, Dst    netip.Addr
	Proto       uint8  // IPPROTO_TCP, UDP, SCTP (0: none of them)
	Port        uint16 // destination port
	Established bool   // conntrack says established or related
}

// Step is a rule that matched a packet and ended a chain or the table's
// walk: an allow (Return) out of a pod's chain, or the final Accept or
// Drop.
type Step struct {
	Chain string
	// Entry is the pod chain the base chain sent the packet to, that
	// led to Chain (itself, its rest chain, or a shared Admin chain).
	Entry   string
	Comment string
	Why     string
	Verdict Verdict
}

// Trace is what the table does with a packet.
type Trace struct {
	Allowed bool
	// Steps are the rules that decided, in order: each pod chain's
	// allowing rule, then the drop if one dropped it. None: no rule
	// decided, the base chain's policy (accept) did.
	Steps []Step
	// Isolated are the pod chains the packet went through ("eg:ns/pod",
	// "in:ns/pod").
	Isolated []string
}

// maxJumps bounds a walk: the compiler's chains jump one level deep.
const maxJumps = 8

// Evaluate walks p through rs from the base chain.
func Evaluate(rs Ruleset, p Packet) Trace {
	chains := make(map[string]Chain, len(rs.Chains))
	for _, c := range rs.Chains {
		chains[c.Name] = c
	}
	sets := make(map[string]Set, len(rs.Sets))
	for _, s := range rs.Sets {
		sets[s.Name] = s
	}
	w := walker{chains: chains, sets: sets, p: p}
	v := w.chain(ChainForward, 0)
	w.t.Allowed = v != Drop
	return w.t
}

type walker struct {
	chains map[string]Chain
	sets   map[string]Set
	p      Packet
	t      Trace
	entry  string // the pod chain being walked (Step.Entry)
}

func (w *walker) step(chain string, r Rule, v Verdict) {
	w.t.Steps = append(w.t.Steps, Step{Chain: chain, Entry: w.entry, Comment: r.Comment, Why: r.Why, Verdict: v})
}

// chain runs one chain and says how it ended: Accept or Drop (final), or
// Return (back to the caller; at the end of the base chain, its policy).
func (w *walker) chain(name string, depth int) Verdict {
	if depth > maxJumps {
		return Drop
	}
	if !IsBase(name) && !IsShared(name) {
		w.t.Isolated = append(w.t.Isolated, name)
	}
	for _, r := range w.chains[name].Rules {
		ok, jump, goes := w.match(r)
		if !ok {
			continue
		}
		switch {
		case jump != "" && goes:
			return w.goTo(name, r, jump, depth)
		case jump != "":
			if IsBase(name) {
				w.entry = jump
			}
			if v := w.chain(jump, depth+1); v == Accept || v == Drop {
				return v
			}
		}
		switch r.Verdict {
		case Accept, Drop, Return:
			w.step(name, r, r.Verdict)
			return r.Verdict
		case Jump:
			if v := w.chain(r.Target, depth+1); v == Accept || v == Drop {
				return v
			}
		case Goto:
			return w.goTo(name, r, r.Target, depth)
		}
	}
	return Return
}

// goTo goes on in chain target, from rule r of chain name: its end is
// name's.
func (w *walker) goTo(name string, r Rule, target string, depth int) Verdict {
	if r.Why != "" { // a Pass, not the Admin tier's end
		w.step(name, r, Goto)
	}
	return w.chain(target, depth+1)
}

// match says whether r matches the packet, the chain a verdict map in it
// sends the packet to, and whether it goes there (goto) rather than
// jumps.
func (w *walker) match(r Rule) (bool, string, bool) {
	p := w.p
	if r.Established && !p.Established || r.NeighbourDiscovery {
		return false, "", false // (a Packet is TCP, UDP or SCTP)
	}
	if r.Proto != 0 {
		if p.Proto != r.Proto {
			return false, "", false
		}
		if r.PortLo != 0 && (p.Port < r.PortLo || p.Port > r.PortHi) {
			return false, "", false
		}
	}
	if r.Src.empty() && r.Dst.empty() {
		return true, "", false
	}
	if r.V6 != p.Src.Is6() {
		return false, "", false
	}
	okS, jS := w.addr(r.Src, p.Src)
	okD, jD := w.addr(r.Dst, p.Dst)
	if !okS || !okD {
		return false, "", false
	}
	// At most one of them is a verdict map.
	return true, jS + jD, w.sets[r.Src.VMap+r.Dst.VMap].Goto
}

func (w *walker) addr(a Addr, ip netip.Addr) (bool, string) {
	if a.Prefix.IsValid() && !a.Prefix.Contains(ip) {
		return false, ""
	}
	for _, e := range a.Except {
		if e.Contains(ip) {
			return false, ""
		}
	}
	if a.Set != "" && w.index(a.Set, ip) < 0 {
		return false, ""
	}
	if a.NotSet != "" && w.index(a.NotSet, ip) >= 0 {
		return false, ""
	}
	if a.VMap != "" {
		i := w.index(a.VMap, ip)
		if i < 0 {
			return false, ""
		}
		return true, w.sets[a.VMap].jump(i)
	}
	return true, ""
}

// index is ip's place in the named set, or -1.
func (w *walker) index(set string, ip netip.Addr) int {
	s, ok := w.sets[set]
	if !ok {
		return -1
	}
	lo, hi := 0, len(s.Elems)
	for lo < hi { // Elems are sorted
		m := (lo + hi) / 2
		switch c := s.Elems[m].Compare(ip); {
		case c == 0:
			return m
		case c < 0:
			lo = m + 1
		default:
			hi = m
		}
	}
	return -1
}
