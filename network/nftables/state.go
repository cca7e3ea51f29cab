package nftables

import (
	"bytes"
	"fmt"
	"slices"

	"github.com/google/nftables"

	"github.com/twill-net/twill/network"
)

// chainState is one chain of twill's table, as wanted or as read back.
type chainState struct {
	Name  string
	Def   string // type, hook, priority and policy, as nft would print them
	Rules []ruleState
}

// ruleState is one rule: its comment names it, its expressions are what
// it does.
type ruleState struct {
	Comment string
	Exprs   []byte
	Handle  uint64 // read back only
}

func chainDef(c *nftables.Chain) string {
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

// wantChain is a chain to write and the rules it holds.
type wantChain struct {
	chain *nftables.Chain
	rules []*nftables.Rule
	state chainState
}

// desired renders the rules of every family into twill's chains.
func desired(networks []network.NetworkPair, ipMasq bool) ([]wantChain, error) {
	var want []wantChain
	for _, c := range baseChains() {
		want = append(want, wantChain{chain: c, state: chainState{Name: c.Name, Def: chainDef(c)}})
	}
	for _, np := range networks {
		for _, r := range network.DesiredRules(np.Cluster, np.Local, ipMasq) {
			i := slices.IndexFunc(want, func(w wantChain) bool { return w.chain.Name == chainFor(r.Table) })
			if i < 0 {
				return nil, fmt.Errorf("rule %q: no nftables chain for iptables table %q", r.Comment, r.Table)
			}
			es := ruleExprs(r)
			fp, err := fingerprint(es)
			if err != nil {
				return nil, fmt.Errorf("rule %q: %w", r.Comment, err)
			}
			// Each family has its own rule under the same comment.
			name := r.Comment + " (" + family(np) + ")"
			want[i].rules = append(want[i].rules, &nftables.Rule{Table: want[i].chain.Table, Chain: want[i].chain, Exprs: es, UserData: comment(name)})
			want[i].state.Rules = append(want[i].state.Rules, ruleState{Comment: name, Exprs: fp})
		}
	}
	return want, nil
}

func family(np network.NetworkPair) string {
	if np.Cluster.Addr().Is6() {
		return "ipv6"
	}
	return "ipv4"
}

// diff says how got (the kernel's chains of twill's table; exists says
// whether the table itself exists) differs from want.
func diff(want []chainState, got []chainState, exists bool) network.RuleDrift {
	var d network.RuleDrift
	if !exists {
		d.Missing = append(d.Missing, "table inet "+TableName)
		return d
	}
	byName := map[string]chainState{}
	for _, c := range got {
		byName[c.Name] = c
	}
	for _, w := range want {
		g, ok := byName[w.Name]
		delete(byName, w.Name)
		if !ok {
			d.Missing = append(d.Missing, fmt.Sprintf("chain inet %s %s", TableName, w.Name))
			continue
		}
		if g.Def != w.Def {
			d.Wrong = append(d.Wrong, fmt.Sprintf("chain inet %s %s: %s, want %s", TableName, w.Name, g.Def, w.Def))
		}
		diffRules(&d, w, g)
	}
	for name := range byName {
		d.Extra = append(d.Extra, fmt.Sprintf("chain inet %s %s", TableName, name))
	}
	slices.Sort(d.Extra)
	return d
}

// diffRules compares one chain's rules by comment, then their order.
func diffRules(d *network.RuleDrift, w, g chainState) {
	clean := d.Clean()
	seen := map[string]bool{}
	for _, wr := range w.Rules {
		i := slices.IndexFunc(g.Rules, func(gr ruleState) bool { return gr.Comment == wr.Comment })
		switch {
		case i < 0:
			d.Missing = append(d.Missing, fmt.Sprintf("rule in %s: %s", w.Name, wr.Comment))
		case !bytes.Equal(g.Rules[i].Exprs, wr.Exprs):
			d.Wrong = append(d.Wrong, fmt.Sprintf("rule in %s (handle %d): %s: altered", w.Name, g.Rules[i].Handle, wr.Comment))
		}
		seen[wr.Comment] = true
	}
	for _, gr := range g.Rules {
		if !seen[gr.Comment] {
			c := gr.Comment
			if c == "" {
				c = "no comment"
			}
			d.Extra = append(d.Extra, fmt.Sprintf("rule in %s (handle %d): %s", w.Name, gr.Handle, c))
		}
		seen[gr.Comment] = false // a second rule with the same comment is extra
	}
	if clean && d.Clean() && !slices.EqualFunc(w.Rules, g.Rules, func(a, b ruleState) bool { return a.Comment == b.Comment }) {
		d.Wrong = append(d.Wrong, fmt.Sprintf("rules in %s: out of order", w.Name))
	}
}
