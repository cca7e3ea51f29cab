package nftsync

import (
	"bytes"
	"fmt"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
)

// State is a table as the kernel holds it, or as the engine last wrote it.
type State struct {
	Exists bool
	Chains map[string]*ChainState
	Order  []string // the chains' names, in the kernel's order
	Sets   map[string]*SetState
}

// ChainState is a chain and its rules.
type ChainState struct {
	Chain *nftables.Chain
	Rules []RuleState
	src   any // in a written table's model: what its rules were rendered from
}

// RuleState is one rule: its comment names it, its fingerprint is what it
// does.
type RuleState struct {
	Handle  uint64 // read back only
	Comment string
	FP      []byte
	Packets uint64 // its counter's, read back only
}

// SetState is a set, or a verdict map, and its elements: key → the
// element's nft.Elem.Target ("" in a set).
type SetState struct {
	Set   *nftables.Set
	Elems map[string]string
	src   any // in a written table's model: what its elements were made from
}

func newState() *State {
	return &State{Chains: map[string]*ChainState{}, Sets: map[string]*SetState{}}
}

// Read returns the table as the kernel holds it now.
func (e *Engine) Read() (*State, error) { return e.read() }

func (e *Engine) read() (*State, error) {
	t, err := e.Kernel.Table(e.Family, e.Name)
	if err != nil {
		return nil, err
	}
	s := newState()
	if t == nil {
		return s, nil
	}
	s.Exists = true
	for _, c := range t.Chains {
		cs := &ChainState{Chain: c.Chain, Rules: make([]RuleState, 0, len(c.Rules))}
		for _, r := range c.Rules {
			rs := RuleState{Handle: r.Handle}
			rs.Comment, _ = userdata.GetString(r.UserData, userdata.TypeComment)
			if rs.FP, err = Fingerprint(r.Exprs); err != nil {
				rs.FP = []byte("unreadable: " + err.Error()) // equals no wanted rule
			}
			for _, x := range r.Exprs {
				if c, ok := x.(*expr.Counter); ok {
					rs.Packets = c.Packets
				}
			}
			cs.Rules = append(cs.Rules, rs)
		}
		s.Chains[c.Chain.Name] = cs
		s.Order = append(s.Order, c.Chain.Name)
	}
	for _, st := range t.Sets {
		ss := &SetState{Set: st.Set, Elems: make(map[string]string, len(st.Elems))}
		for _, el := range st.Elems {
			ss.Elems[string(el.Key)] = el.Target()
		}
		s.Sets[st.Set.Name] = ss
	}
	return s, nil
}

// render renders a wanted chain's rules into their states: comments and
// fingerprints, what the model keeps of them.
func render(c Chain) ([]RuleState, error) {
	if c.Rules == nil {
		return []RuleState{}, nil
	}
	rules, err := c.Rules()
	if err != nil {
		return nil, fmt.Errorf("rendering chain %s: %w", c.Name, err)
	}
	st := make([]RuleState, len(rules))
	for i, r := range rules {
		fp, err := Fingerprint(r.Exprs)
		if err != nil {
			return nil, fmt.Errorf("rendering chain %s rule %d (%s): %w", c.Name, i, r.Comment, err)
		}
		st[i] = RuleState{Comment: r.Comment, FP: fp}
	}
	return st, nil
}

// SameRules says whether got holds want's rules, in order.
func SameRules(got, want []RuleState) bool {
	return FirstDifference(got, want) < 0
}

// FirstDifference is the index of the first rule in which got and want
// differ (len of the shorter when one is the other's start), -1 when equal.
func FirstDifference(got, want []RuleState) int {
	for i := range min(len(got), len(want)) {
		if got[i].Comment != want[i].Comment || !bytes.Equal(got[i].FP, want[i].FP) {
			return i
		}
	}
	if len(got) != len(want) {
		return min(len(got), len(want))
	}
	return -1
}

// hookDef is a base chain's type, hook, priority and policy, as nft
// would print them.
func hookDef(c *nftables.Chain) string {
	hook, prio, policy := "none", "none", "accept"
	if c.Hooknum != nil {
		hook = fmt.Sprint(*c.Hooknum)
	}
	if c.Priority != nil {
		prio = fmt.Sprint(*c.Priority)
	}
	if c.Policy != nil && *c.Policy == nftables.ChainPolicyDrop {
		policy = "drop"
	}
	return fmt.Sprintf("type %s hook %s priority %s policy %s", c.Type, hook, prio, policy)
}

// hooksDiffer says whether a wanted base chain is missing or hooked
// otherwise, or a wanted regular chain is a base chain: the table is
// written afresh (a chain's hook cannot change).
func (e *Engine) hooksDiffer(have *State, want Table) bool {
	for _, c := range want.Chains {
		h := have.Chains[c.Name]
		switch {
		case c.Hook != nil && h == nil:
			return true
		case h == nil:
		case (c.Hook == nil) != (h.Chain.Hooknum == nil):
			return true
		case c.Hook != nil && hookDef(h.Chain) != hookDef(c.Hook):
			return true
		}
	}
	return false
}

// setTypesDiffer says whether a set the kernel holds is of another kind
// or key type than wanted (a set cannot change either). The library reads
// a verdict map's key type as "verdict": a map's kind is compared alone.
func setTypesDiffer(have *State, want Table) bool {
	for _, s := range want.Sets {
		if k := have.Sets[s.Name]; k != nil && (k.Set.IsMap != s.Map || !s.Map && k.Set.KeyType.Name != s.KeyType.Name) {
			return true
		}
	}
	return false
}
