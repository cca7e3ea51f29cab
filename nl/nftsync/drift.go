package nftsync

import (
	"bytes"
	"fmt"
	"maps"
	"slices"

	"github.com/twill-net/twill/nl/nft"
)

// Drift says how the kernel's table differs from the desired one, each
// difference in words: what is missing, what is there but not wanted,
// what is there but wrong.
type Drift struct {
	Missing, Extra, Wrong []string
}

// Clean says the table is as desired.
func (d Drift) Clean() bool { return len(d.Missing)+len(d.Extra)+len(d.Wrong) == 0 }

// Drift reads the kernel's table and says how it differs from want,
// without changing anything.
func (e *Engine) Drift(want Table) (Drift, error) {
	have, err := e.read()
	if err != nil {
		return Drift{}, err
	}
	var d Drift
	if !have.Exists {
		d.Missing = append(d.Missing, e.What())
		return d, nil
	}
	pre := "chain " + nft.FamilyName(e.Family) + " " + e.Name + " "
	wanted := map[string]bool{}
	for _, c := range want.Chains {
		wanted[c.Name] = true
		h := have.Chains[c.Name]
		if h == nil {
			d.Missing = append(d.Missing, pre+c.Name)
			continue
		}
		if c.Hook != nil && hookDef(h.Chain) != hookDef(c.Hook) {
			d.Wrong = append(d.Wrong, fmt.Sprintf("%s%s: %s, want %s", pre, c.Name, hookDef(h.Chain), hookDef(c.Hook)))
		}
		st, err := render(c)
		if err != nil {
			return Drift{}, err
		}
		diffRules(&d, c.Name, st, h.Rules)
	}
	for _, name := range have.Order {
		if !wanted[name] {
			d.Extra = append(d.Extra, pre+name)
		}
	}
	diffSets(&d, want, have)
	return d, nil
}

// diffRules compares one chain's rules by comment, then their order.
func diffRules(d *Drift, chain string, want, got []RuleState) {
	clean := d.Clean()
	seen := map[string]bool{}
	for _, wr := range want {
		i := slices.IndexFunc(got, func(gr RuleState) bool { return gr.Comment == wr.Comment })
		switch {
		case i < 0:
			d.Missing = append(d.Missing, fmt.Sprintf("rule in %s: %s", chain, wr.Comment))
		case !bytes.Equal(got[i].FP, wr.FP):
			d.Wrong = append(d.Wrong, fmt.Sprintf("rule in %s (handle %d): %s: altered", chain, got[i].Handle, wr.Comment))
		}
		seen[wr.Comment] = true
	}
	for _, gr := range got {
		if !seen[gr.Comment] {
			c := gr.Comment
			if c == "" {
				c = "no comment"
			}
			d.Extra = append(d.Extra, fmt.Sprintf("rule in %s (handle %d): %s", chain, gr.Handle, c))
		}
		seen[gr.Comment] = false // a second rule with the same comment is extra
	}
	if clean && d.Clean() && !slices.EqualFunc(want, got, func(a, b RuleState) bool { return a.Comment == b.Comment }) {
		d.Wrong = append(d.Wrong, fmt.Sprintf("rules in %s: out of order", chain))
	}
}

// diffSets compares the sets: missing, extra, of another kind, or with
// elements missing, extra or jumping elsewhere.
func diffSets(d *Drift, want Table, have *State) {
	wanted := map[string]bool{}
	for _, s := range want.Sets {
		wanted[s.Name] = true
		h := have.Sets[s.Name]
		if h == nil {
			d.Missing = append(d.Missing, "set "+s.Name)
			continue
		}
		if h.Set.IsMap != s.Map || !s.Map && h.Set.KeyType.Name != s.KeyType.Name {
			d.Wrong = append(d.Wrong, "set "+s.Name+": of another type")
			continue
		}
		var missing, wrong int
		in := map[string]bool{}
		for _, el := range s.Elems {
			in[string(el.Key)] = true
			jump, ok := h.Elems[string(el.Key)]
			switch {
			case !ok:
				missing++
			case jump != el.Target():
				wrong++
			}
		}
		extra := 0
		for key := range h.Elems {
			if !in[key] {
				extra++
			}
		}
		if missing > 0 {
			d.Missing = append(d.Missing, fmt.Sprintf("set %s: %d elements", s.Name, missing))
		}
		if extra > 0 {
			d.Extra = append(d.Extra, fmt.Sprintf("set %s: %d elements", s.Name, extra))
		}
		if wrong > 0 {
			d.Wrong = append(d.Wrong, fmt.Sprintf("set %s: %d elements jump elsewhere", s.Name, wrong))
		}
	}
	for _, name := range slices.Sorted(maps.Keys(have.Sets)) {
		if !wanted[name] {
			d.Extra = append(d.Extra, "set "+name)
		}
	}
}
