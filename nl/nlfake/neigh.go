package nlfake

import (
	"bytes"
	"net/netip"
	"slices"
	"sort"

	"github.com/twill-net/twill/nl"
)

// Neighs lists a link's neighbour entries.
func (k *Kernel) Neighs(index int, family nl.Family) ([]nl.Neigh, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.initLocked()
	var out []nl.Neigh
	for _, n := range k.neighs[index] {
		if family == nl.FamilyAll || (family == nl.FamilyV4) == n.IP.Is4() {
			out = append(out, n)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].IP.Less(out[j].IP) })
	return out, nil
}

// FDB lists a link's forwarding entries.
func (k *Kernel) FDB(index int) ([]nl.Neigh, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.initLocked()
	var out []nl.Neigh
	for _, n := range k.fdb[index] {
		out = append(out, n)
	}
	sort.Slice(out, func(i, j int) bool { return bytes.Compare(out[i].HardwareAddr, out[j].HardwareAddr) < 0 })
	return out, nil
}

// NeighBatch applies neighbour and FDB changes, one error each. Setting an
// FDB entry replaces the remote of its MAC, as NLM_F_REPLACE does on a VXLAN
// device; deleting one needs its remote to match.
func (k *Kernel) NeighBatch(ops []nl.NeighOp) []error {
	errs := make([]error, len(ops))
	for i, op := range ops {
		errs[i] = k.neigh(op)
	}
	return errs
}

// NeighDel deletes a neighbour (or with fdb, an FDB) entry behind twill's
// back, in tests.
func (k *Kernel) NeighDel(n nl.Neigh, fdb bool) error {
	return k.neigh(nl.NeighOp{Op: nl.OpDel, Neigh: n, FDB: fdb})
}

func (k *Kernel) neigh(op nl.NeighOp) error {
	if err := k.fail("neigh"); err != nil {
		return err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.initLocked()
	n := op.Neigh
	if _, err := k.linkLocked(n.LinkIndex); err != nil {
		return err
	}
	if op.FDB {
		var mac [6]byte
		copy(mac[:], n.HardwareAddr)
		t := k.fdb[n.LinkIndex]
		if t == nil {
			t = map[[6]byte]nl.Neigh{}
			k.fdb[n.LinkIndex] = t
		}
		if op.Op == nl.OpDel {
			if have, ok := t[mac]; ok && have.IP == n.IP {
				delete(t, mac)
				k.emitNeighLocked(nl.NeighEvent{Deleted: true, FDB: true, Neigh: have})
			}
			return nil
		}
		n.HardwareAddr = slices.Clone(n.HardwareAddr)
		if have, ok := t[mac]; !ok || !sameNeigh(have, n) {
			t[mac] = n
			k.emitNeighLocked(nl.NeighEvent{FDB: true, Neigh: n})
		}
		return nil
	}
	t := k.neighs[n.LinkIndex]
	if t == nil {
		t = map[netip.Addr]nl.Neigh{}
		k.neighs[n.LinkIndex] = t
	}
	if op.Op == nl.OpDel {
		if have, ok := t[n.IP]; ok {
			delete(t, n.IP)
			k.emitNeighLocked(nl.NeighEvent{Deleted: true, Neigh: have})
		}
		return nil
	}
	n.HardwareAddr = slices.Clone(n.HardwareAddr)
	if have, ok := t[n.IP]; !ok || !sameNeigh(have, n) {
		t[n.IP] = n
		k.emitNeighLocked(nl.NeighEvent{Neigh: n})
	}
	return nil
}

// sameNeigh reports whether writing b over a changes nothing.
func sameNeigh(a, b nl.Neigh) bool {
	return a.LinkIndex == b.LinkIndex && a.IP == b.IP && bytes.Equal(a.HardwareAddr, b.HardwareAddr) && a.Permanent == b.Permanent
}

// Rules lists the policy rules.
func (k *Kernel) Rules(family nl.Family) ([]nl.Rule, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	var out []nl.Rule
	for _, r := range k.rules {
		v4 := !(r.Src.IsValid() && r.Src.Addr().Is6()) && !(r.Dst.IsValid() && r.Dst.Addr().Is6())
		if family == nl.FamilyAll || (family == nl.FamilyV4) == v4 {
			out = append(out, r)
		}
	}
	return out, nil
}

// RuleAdd adds a rule; an identical one present is fine.
func (k *Kernel) RuleAdd(r nl.Rule) error {
	if err := k.fail("rule add"); err != nil {
		return err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, have := range k.rules {
		if have.Same(r) {
			return nil
		}
	}
	k.rules = append(k.rules, r)
	return nil
}

// RuleDel deletes a rule; an absent one is fine.
func (k *Kernel) RuleDel(r nl.Rule) error {
	if err := k.fail("rule del"); err != nil {
		return err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.rules = slices.DeleteFunc(k.rules, func(have nl.Rule) bool { return have.Same(r) })
	return nil
}
