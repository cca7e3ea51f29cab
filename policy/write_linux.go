package policy

import (
	"bytes"
	"fmt"
	"net/netip"
	"slices"

	"github.com/google/nftables"
)

// writeAll queues the table afresh: created if missing so that deleting it
// cannot fail, deleted, and written.
func writeAll(conn *nftables.Conn, rs Ruleset) (Changes, error) {
	conn.AddTable(table())
	conn.DelTable(table())
	conn.AddTable(table())
	ch := Changes{Full: true}
	// Sets, then every chain, then the verdict maps that jump to chains,
	// then the rules that name sets and maps.
	addSets := func(vmaps bool) error {
		for _, s := range rs.Sets {
			if s.VMap != vmaps {
				continue
			}
			if err := conn.AddSet(kernelSet(s), elements(s)); err != nil {
				return fmt.Errorf("adding set %s: %w", s.Name, err)
			}
			ch.Sets++
		}
		return nil
	}
	if err := addSets(false); err != nil {
		return Changes{}, err
	}
	kcs := make([]*nftables.Chain, len(rs.Chains))
	for i, c := range rs.Chains {
		kcs[i] = kernelChain(c.Name)
		conn.AddChain(kcs[i])
	}
	if err := addSets(true); err != nil {
		return Changes{}, err
	}
	for i, c := range rs.Chains {
		if err := addRules(conn, kcs[i], c); err != nil {
			return Changes{}, err
		}
		ch.Chains++
	}
	return ch, nil
}

func addRules(conn *nftables.Conn, kc *nftables.Chain, c Chain) error {
	want, err := wantRules(c)
	if err != nil {
		return err
	}
	for _, w := range want {
		w.rule.Chain = kc
		conn.AddRule(w.rule)
	}
	return nil
}

// writeDiff queues what differs: sets and their elements first (a rule
// may name a new set), then the pods' chains (the missing ones created
// before any is written), then the verdict maps that
// jump to them, then the base chains that look the maps up; last, what is
// no longer wanted (a chain once no map jumps to it, a set once no rule
// names it).
func writeDiff(conn *nftables.Conn, ks kernelState, rs Ruleset) (Changes, error) {
	var ch Changes
	wantSet := map[string]bool{}
	if err := writeSets(conn, ks, rs, false, &ch, wantSet); err != nil {
		return Changes{}, err
	}
	wantChain := map[string]bool{}
	// Every missing chain first: a rule may jump or go to one that sorts
	// after its own (in:<pod> goes to in+:<pod>).
	for _, c := range rs.Chains {
		if _, ok := ks.chains[c.Name]; !ok && !IsBase(c.Name) {
			conn.AddChain(kernelChain(c.Name))
		}
	}
	for i := len(rs.Chains) - 1; i >= 0; i-- {
		if IsBase(rs.Chains[i].Name) {
			continue
		}
		if err := writeChain(conn, ks, rs.Chains[i], &ch); err != nil {
			return Changes{}, err
		}
		wantChain[rs.Chains[i].Name] = true
	}
	if err := writeSets(conn, ks, rs, true, &ch, wantSet); err != nil {
		return Changes{}, err
	}
	for _, c := range rs.Chains {
		if !IsBase(c.Name) {
			continue
		}
		if err := writeChain(conn, ks, c, &ch); err != nil {
			return Changes{}, err
		}
		wantChain[c.Name] = true
	}
	deleteChains(conn, ks, wantChain, &ch)
	for name, k := range ks.sets {
		if !wantSet[name] {
			conn.DelSet(k.set)
			ch.Del++
		}
	}
	return ch, nil
}

// writeSets queues the sets (or, with vmaps, the verdict maps) that are
// missing and the elements that differ, and marks them wanted. An element
// whose jump changed is deleted, then added.
func writeSets(conn *nftables.Conn, ks kernelState, rs Ruleset, vmaps bool, ch *Changes, wantSet map[string]bool) error {
	for _, s := range rs.Sets {
		if s.VMap != vmaps {
			continue
		}
		wantSet[s.Name] = true
		k := ks.sets[s.Name]
		if k == nil {
			if err := conn.AddSet(kernelSet(s), elements(s)); err != nil {
				return fmt.Errorf("adding set %s: %w", s.Name, err)
			}
			ch.Sets++
			continue
		}
		var add, del []nftables.SetElement
		in := make(map[netip.Addr]string, len(s.Elems))
		for i, a := range s.Elems {
			in[a] = s.jump(i)
			if jump, ok := k.elems[a]; !ok || jump != s.jump(i) {
				add = append(add, element(a, s.VMap, s.jump(i)))
			}
		}
		for a, jump := range k.elems {
			if want, ok := in[a]; !ok || want != jump {
				del = append(del, element(a, false, ""))
			}
		}
		ks := kernelSet(s)
		if len(del) > 0 {
			if err := conn.SetDeleteElements(ks, del); err != nil {
				return fmt.Errorf("deleting from set %s: %w", s.Name, err)
			}
		}
		if len(add) > 0 {
			if err := conn.SetAddElements(ks, add); err != nil {
				return fmt.Errorf("adding to set %s: %w", s.Name, err)
			}
		}
		ch.Elems += len(add) + len(del)
	}
	return nil
}

// writeChain queues a chain if it is missing or differs: created, or
// flushed, then its rules.
func writeChain(conn *nftables.Conn, ks kernelState, c Chain, ch *Changes) error {
	got, exists := ks.chains[c.Name]
	if last, ok := ks.rules[c.Name]; ok && slices.EqualFunc(last, c.Rules, sameRule) {
		return nil
	}
	want, err := wantRules(c)
	if err != nil {
		return err
	}
	if exists && ks.rules == nil && sameRulesFP(got, want) {
		return nil
	}
	kc := kernelChain(c.Name)
	if exists {
		conn.FlushChain(kc)
	} else {
		conn.AddChain(kc)
	}
	for _, w := range want {
		w.rule.Chain = kc
		conn.AddRule(w.rule)
	}
	ch.Chains++
	return nil
}

// deleteChains queues the deletion of the chains no longer wanted,
// flushed first: one may jump to another.
func deleteChains(conn *nftables.Conn, ks kernelState, wantChain map[string]bool, ch *Changes) {
	var extra []string
	for name := range ks.chains {
		if !wantChain[name] {
			extra = append(extra, name)
			conn.FlushChain(&nftables.Chain{Table: table(), Name: name})
		}
	}
	for _, name := range extra {
		conn.DelChain(&nftables.Chain{Table: table(), Name: name})
		ch.Del++
	}
}

func sameRulesFP(got []kernelRule, want []wantRule) bool {
	if len(got) != len(want) {
		return false
	}
	for i := range want {
		if !bytes.Equal(got[i].fp, want[i].fp) || got[i].comment != want[i].cmt {
			return false
		}
	}
	return true
}
