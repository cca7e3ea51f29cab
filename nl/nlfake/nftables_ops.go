package nlfake

import (
	"fmt"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/twill-net/twill/nl/nft"
)

func (t *fakeTable) chain(name string) int {
	return slices.IndexFunc(t.chains, func(c *fakeChain) bool { return c.chain.Name == name })
}

func (t *fakeTable) set(name string) int {
	return slices.IndexFunc(t.sets, func(s *fakeSet) bool { return s.set.Name == name })
}

// chainOp adds, flushes or deletes a chain. A chain's hook, type and
// priority are fixed once made (its policy may change); a chain that a
// rule or a verdict map's element still jumps to cannot be deleted.
func (t *fakeTable) chainOp(op nft.Op) error {
	name := op.Chain.Name
	i := t.chain(name)
	if op.Kind == nft.AddChain {
		if i < 0 {
			c := *op.Chain
			c.Table = nil
			t.chains = append(t.chains, &fakeChain{chain: c})
			return nil
		}
		have := &t.chains[i].chain
		if !sameHook(have, op.Chain) {
			return errno("chain "+name+": changing its hook, type or priority", unix.EOPNOTSUPP)
		}
		if op.Chain.Policy != nil {
			p := *op.Chain.Policy
			have.Policy = &p
		}
		return nil
	}
	if i < 0 {
		return errno("no chain "+name, unix.ENOENT)
	}
	t.chains[i].rules = nil
	if op.Kind == nft.FlushChain {
		return nil
	}
	if by := t.jumpsTo(name); by != "" {
		return errno("chain "+name+": "+by+" jumps to it", unix.EBUSY)
	}
	t.chains = slices.Delete(t.chains, i, i+1)
	return nil
}

func sameHook(a, b *nftables.Chain) bool {
	base := func(c *nftables.Chain) bool { return c.Hooknum != nil }
	if base(a) != base(b) {
		return false
	}
	if !base(a) {
		return true
	}
	return *a.Hooknum == *b.Hooknum && a.Type == b.Type && a.Priority != nil && b.Priority != nil && *a.Priority == *b.Priority
}

// jumpsTo names a rule or a verdict map that jumps (or goes) to chain.
func (t *fakeTable) jumpsTo(chain string) string {
	for _, c := range t.chains {
		for _, r := range c.rules {
			for _, e := range r.Exprs {
				if v, ok := e.(*expr.Verdict); ok && (v.Kind == expr.VerdictJump || v.Kind == expr.VerdictGoto) && v.Chain == chain {
					return "a rule of chain " + c.chain.Name
				}
			}
		}
	}
	for _, s := range t.sets {
		for _, el := range s.elems {
			if s.set.IsMap && el.Jump == chain {
				return "an element of map " + s.set.Name
			}
		}
	}
	return ""
}

// addRule appends a rule. Its chain, the sets it looks up and the chains
// it jumps to must exist.
func (tx *fakeTx) addRule(t *fakeTable, r *nftables.Rule) error {
	if r.Chain == nil {
		return errno("a rule with no chain", unix.EINVAL)
	}
	i := t.chain(r.Chain.Name)
	if i < 0 {
		return errno("no chain "+r.Chain.Name, unix.ENOENT)
	}
	for _, e := range r.Exprs {
		switch e := e.(type) {
		case *expr.Lookup:
			if t.set(e.SetName) < 0 {
				return errno("rule in chain "+r.Chain.Name+": no set "+e.SetName, unix.ENOENT)
			}
		case *expr.Verdict:
			if (e.Kind == expr.VerdictJump || e.Kind == expr.VerdictGoto) && t.chain(e.Chain) < 0 {
				return errno("rule in chain "+r.Chain.Name+": no chain "+e.Chain, unix.ENOENT)
			}
		}
	}
	tx.handle++
	rr := *r
	rr.Handle = tx.handle
	rr.Table, rr.Chain = nil, nil
	rr.Exprs = slices.Clone(r.Exprs)
	t.chains[i].rules = append(t.chains[i].rules, &rr)
	return nil
}

// delRule deletes the rule with r's handle from r's chain.
func (t *fakeTable) delRule(r *nftables.Rule) error {
	if r.Chain == nil {
		return errno("a rule with no chain", unix.EINVAL)
	}
	i := t.chain(r.Chain.Name)
	if i < 0 {
		return errno("no chain "+r.Chain.Name, unix.ENOENT)
	}
	c := t.chains[i]
	j := slices.IndexFunc(c.rules, func(have *nftables.Rule) bool { return have.Handle == r.Handle })
	if j < 0 {
		return errno(fmt.Sprintf("chain %s: no rule with handle %d", r.Chain.Name, r.Handle), unix.ENOENT)
	}
	c.rules = slices.Delete(slices.Clone(c.rules), j, j+1)
	return nil
}

// setOp adds or deletes a set, or its elements.
func (t *fakeTable) setOp(op nft.Op) error {
	name := op.Set.Name
	i := t.set(name)
	switch {
	case op.Kind == nft.AddSet && i < 0:
		s := *op.Set
		s.Table = nil
		t.sets = append(t.sets, &fakeSet{set: s, elems: map[string]nft.Elem{}})
		return t.addElems(t.sets[len(t.sets)-1], op.Elems)
	case i < 0:
		return errno("no set "+name, unix.ENOENT)
	}
	s := t.sets[i]
	switch op.Kind {
	case nft.AddSet:
		if s.set.IsMap != op.Set.IsMap || s.set.KeyType.Name != op.Set.KeyType.Name {
			return errno("set "+name+" exists, of another type", unix.EEXIST)
		}
		return t.addElems(s, op.Elems)
	case nft.AddElems:
		return t.addElems(s, op.Elems)
	case nft.DelElems:
		for _, e := range op.Elems {
			if _, ok := s.elems[string(e.Key)]; !ok {
				return errno(fmt.Sprintf("set %s: no element %x", name, e.Key), unix.ENOENT)
			}
			delete(s.elems, string(e.Key))
		}
		return nil
	case nft.DelSet:
		if by := t.looksUp(name); by != "" {
			return errno("set "+name+": "+by+" looks it up", unix.EBUSY)
		}
		t.sets = slices.Delete(t.sets, i, i+1)
		return nil
	}
	return errno(fmt.Sprintf("operation %d", op.Kind), unix.EINVAL)
}

// addElems adds elements of the set's key length; an element already
// there must jump (or go) where it did.
func (t *fakeTable) addElems(s *fakeSet, elems []nft.Elem) error {
	for _, e := range elems {
		if n := s.set.KeyType.Bytes; n != 0 && uint32(len(e.Key)) != n {
			return errno(fmt.Sprintf("set %s: a key of %d bytes, want %d", s.set.Name, len(e.Key), n), unix.EINVAL)
		}
		if s.set.IsMap && t.chain(e.Jump) < 0 {
			return errno("map "+s.set.Name+": no chain "+e.Jump, unix.ENOENT)
		}
		had, ok := s.elems[string(e.Key)]
		switch {
		case !ok:
			s.elems[string(e.Key)] = nft.Elem{Jump: e.Jump, Goto: e.Goto}
		case had.Target() != e.Target():
			return errno(fmt.Sprintf("map %s: element %x exists with another jump", s.set.Name, e.Key), unix.EEXIST)
		}
	}
	return nil
}

// looksUp names a rule that looks set up.
func (t *fakeTable) looksUp(set string) string {
	for _, c := range t.chains {
		for _, r := range c.rules {
			for _, e := range r.Exprs {
				if l, ok := e.(*expr.Lookup); ok && l.SetName == set {
					return "a rule of chain " + c.chain.Name
				}
			}
		}
	}
	return ""
}

// check refuses, at commit, a base chain with no hook's type: the kernel
// refuses one as it is made.
func (tx *fakeTx) check() error {
	for _, t := range tx.tables {
		for _, c := range t.chains {
			if c.chain.Hooknum != nil && (c.chain.Type == "" || c.chain.Priority == nil) {
				return errno("base chain "+c.chain.Name+" has no type or priority", unix.EINVAL)
			}
		}
	}
	return nil
}
