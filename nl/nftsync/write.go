package nftsync

import (
	"fmt"
	"slices"

	"github.com/google/nftables"

	"github.com/twill-net/twill/nl/nft"
)

// writer queues one transaction and models the table it leaves.
type writer struct {
	e     *Engine
	want  Table
	batch *nft.Batch
	ch    Changes
	model *State
}

func (e *Engine) writer(want Table) *writer {
	m := newState()
	m.Exists = true
	return &writer{e: e, want: want, batch: &nft.Batch{}, model: m}
}

func (w *writer) kchain(c Chain) *nftables.Chain {
	if c.Hook == nil {
		return &nftables.Chain{Table: w.e.table(), Name: c.Name}
	}
	k := *c.Hook
	k.Table, k.Name = w.e.table(), c.Name
	return &k
}

func (w *writer) kset(s Set) *nftables.Set {
	k := &nftables.Set{Table: w.e.table(), Name: s.Name, KeyType: s.KeyType, IsMap: s.Map}
	if s.Map {
		k.DataType = nftables.TypeVerdict
	}
	return k
}

// all queues the table afresh: created if missing so that deleting it
// cannot fail, deleted, and written: sets, then every chain, then the
// verdict maps that jump to chains, then the rules that name sets and
// maps.
func (w *writer) all() error {
	t := w.e.table()
	w.batch.AddTable(t)
	w.batch.DelTable(t)
	w.batch.AddTable(t)
	w.ch.Full = true
	w.addSets(false)
	kcs := make([]*nftables.Chain, len(w.want.Chains))
	for i, c := range w.want.Chains {
		kcs[i] = w.kchain(c)
		w.batch.AddChain(kcs[i])
	}
	w.addSets(true)
	for i, c := range w.want.Chains {
		st, err := render(c)
		if err != nil {
			return err
		}
		w.addRules(kcs[i], c)
		w.model.Chains[c.Name] = &ChainState{Chain: kcs[i], Rules: st, src: c.Src}
		w.ch.Chains++
	}
	return nil
}

func (w *writer) addSets(maps bool) {
	for _, s := range w.want.Sets {
		if s.Map != maps {
			continue
		}
		k := w.kset(s)
		w.batch.AddSet(k, s.Elems)
		w.ch.Sets++
		elems := make(map[string]string, len(s.Elems))
		for _, el := range s.Elems {
			elems[string(el.Key)] = el.Target()
		}
		w.model.Sets[s.Name] = &SetState{Set: k, Elems: elems, src: s.Src}
	}
}

// addRules queues chain c's rules, rendered again as the batch is
// applied: the batch holds no rule's expressions until then, and each
// chain's only while it is written.
func (w *writer) addRules(kc *nftables.Chain, c Chain) {
	if c.Rules == nil {
		return
	}
	w.batch.AddRules(kc, func() ([]*nftables.Rule, error) {
		rules, err := c.Rules()
		if err != nil {
			return nil, fmt.Errorf("rendering chain %s: %w", c.Name, err)
		}
		out := make([]*nftables.Rule, len(rules))
		for i, r := range rules {
			out[i] = &nftables.Rule{Table: kc.Table, Chain: kc, Exprs: r.Exprs, UserData: Comment(r.Comment)}
		}
		return out, nil
	})
}

// diff queues what differs from have: sets and their elements first (a
// rule may name a new set), then the missing regular chains, then the
// verdict maps that jump to them, then the regular chains' rules (a rule
// may jump to a chain, or look up a map, written after it), then the base
// chains; last, what is no longer wanted (a chain once no map jumps to
// it, a set once no rule names it).
func (w *writer) diff(have *State) error {
	w.diffSets(have, false)
	for _, c := range w.want.Chains {
		if c.Hook == nil && have.Chains[c.Name] == nil {
			w.batch.AddChain(w.kchain(c))
		}
	}
	w.diffSets(have, true)
	for i := len(w.want.Chains) - 1; i >= 0; i-- {
		if c := w.want.Chains[i]; c.Hook == nil {
			if err := w.diffChain(have, c); err != nil {
				return err
			}
		}
	}
	for _, c := range w.want.Chains {
		if c.Hook != nil {
			if err := w.diffChain(have, c); err != nil {
				return err
			}
		}
	}
	w.deleteExtra(have)
	return nil
}

// diffChain queues a chain's rules when they differ from have's: the
// chain flushed (or made, for a missing base chain), then its rules.
func (w *writer) diffChain(have *State, c Chain) error {
	h := have.Chains[c.Name]
	if h != nil && w.e.Same != nil && h.src != nil && w.e.Same(h.src, c.Src) {
		w.model.Chains[c.Name] = h // the same rules: its source is as good as c's
		return nil
	}
	st, err := render(c)
	if err != nil {
		return err
	}
	if h != nil && SameRules(h.Rules, st) {
		w.model.Chains[c.Name] = &ChainState{Chain: h.Chain, Rules: st, src: c.Src}
		return nil
	}
	kc := w.kchain(c)
	switch {
	case h != nil:
		w.batch.FlushChain(kc)
	case c.Hook != nil:
		w.batch.AddChain(kc)
	}
	w.addRules(kc, c)
	w.model.Chains[c.Name] = &ChainState{Chain: kc, Rules: st, src: c.Src}
	w.ch.Chains++
	return nil
}

// diffSets queues the sets (or, with maps, the verdict maps) that are
// missing and the elements that differ. An element whose jump changed is
// deleted, then added.
func (w *writer) diffSets(have *State, maps bool) {
	for _, s := range w.want.Sets {
		if s.Map != maps {
			continue
		}
		h := have.Sets[s.Name]
		if h != nil && w.e.SameSet != nil && h.src != nil && w.e.SameSet(h.src, s.Src) {
			w.model.Sets[s.Name] = &SetState{Set: h.Set, Elems: h.Elems, src: s.Src}
			continue
		}
		k := w.kset(s)
		if h == nil {
			w.batch.AddSet(k, s.Elems)
			w.ch.Sets++
			h = &SetState{Elems: map[string]string{}}
		}
		in := make(map[string]string, len(s.Elems))
		var add, del []nft.Elem
		for _, el := range s.Elems {
			in[string(el.Key)] = el.Target()
			if jump, ok := h.Elems[string(el.Key)]; !ok || jump != el.Target() {
				add = append(add, el)
			}
		}
		for key, jump := range h.Elems {
			if want, ok := in[key]; !ok || want != jump {
				del = append(del, nft.Elem{Key: []byte(key)})
			}
		}
		w.model.Sets[s.Name] = &SetState{Set: k, Elems: in, src: s.Src}
		if h.Set == nil { // made above, with its elements
			continue
		}
		if len(del) > 0 {
			w.batch.DelElems(k, del)
		}
		if len(add) > 0 {
			w.batch.AddElems(k, add)
		}
		w.ch.Elems += len(add) + len(del)
	}
}

// deleteExtra queues the deletion of what is no longer wanted: the extra
// chains flushed first (one may jump to another), then the extra verdict
// maps (which may jump to them), the chains, and the extra sets.
func (w *writer) deleteExtra(have *State) {
	t := w.e.table()
	var chains, sets []string
	for name := range have.Chains {
		if w.model.Chains[name] == nil {
			chains = append(chains, name)
		}
	}
	slices.Sort(chains)
	for _, name := range chains {
		w.batch.FlushChain(&nftables.Chain{Table: t, Name: name})
	}
	var extra []string
	for name := range have.Sets {
		if w.model.Sets[name] == nil {
			extra = append(extra, name)
		}
	}
	slices.Sort(extra)
	for _, name := range extra {
		if have.Sets[name].Set.IsMap {
			w.batch.DelSet(&nftables.Set{Table: t, Name: name})
			w.ch.Del++
		} else {
			sets = append(sets, name)
		}
	}
	for _, name := range chains {
		w.batch.DelChain(&nftables.Chain{Table: t, Name: name})
		w.ch.Del++
	}
	for _, name := range sets {
		w.batch.DelSet(&nftables.Set{Table: t, Name: name})
		w.ch.Del++
	}
}
