package backend

import (
	"bytes"
	"errors"
	"sync"
	"time"

	"github.com/twill-net/twill/backend/nl"
)

// NeighSync keeps the permanent neighbour entries (or, with FDB, the
// forwarding entries) of one device equal to a desired set, the way
// RouteSync does for routes: a record of the kernel replaced by a dump when
// invalidated, after FullSyncEvery, or after a failure; a desired set kept
// between calls and updated in place; changes in batches. Entries that are
// not permanent belong to the kernel and are left alone.
type NeighSync struct {
	NL            *nl.Handle
	FDB           bool
	FullSyncEvery time.Duration

	mu       sync.Mutex
	known    map[neighKey]nl.Neigh // guarded by mu; nil until read
	link     int                   // guarded by mu; device the record is for
	lastDump time.Time             // guarded by mu

	// Used only by Plan, which callers do not run concurrently.
	desired map[neighKey]*stampedNeigh
	gen     uint64
}

// neighKey identifies an entry: its IP for neighbours, its MAC for FDB
// entries (one remote per MAC).
type neighKey struct {
	ip  [16]byte
	mac [6]byte
}

type stampedNeigh struct {
	n   nl.Neigh
	gen uint64
}

func (s *NeighSync) key(n nl.Neigh) neighKey {
	if s.FDB {
		var k neighKey
		copy(k.mac[:], n.HardwareAddr)
		return k
	}
	return neighKey{ip: n.IP.As16()}
}

func sameNeigh(a, b nl.Neigh) bool {
	return a.LinkIndex == b.LinkIndex && a.IP == b.IP && bytes.Equal(a.HardwareAddr, b.HardwareAddr) && a.Permanent == b.Permanent
}

// NeighPlan is the changes to make.
type NeighPlan struct {
	Set, Delete []nl.Neigh
}

// Plan computes the changes for link given the entries desired emits (the
// whole desired set); it reads the kernel when the record cannot be trusted.
func (s *NeighSync) Plan(link int, desired func(emit func(nl.Neigh))) (NeighPlan, error) {
	if s.desired == nil {
		s.desired = map[neighKey]*stampedNeigh{}
	}
	s.gen++
	gen := s.gen
	desired(func(n nl.Neigh) { s.upsert(link, n, gen) })
	for k, e := range s.desired {
		if e.gen != gen {
			delete(s.desired, k)
		}
	}
	return s.plan(link, nil)
}

// PlanUpdate is Plan for part of the desired set: upsert adds or changes
// entries, remove drops them (by key), the rest stays as desired before.
// While the record is trusted only the changed keys are compared with it.
func (s *NeighSync) PlanUpdate(link int, upsert, remove []nl.Neigh) (NeighPlan, error) {
	if s.desired == nil {
		s.desired = map[neighKey]*stampedNeigh{}
	}
	s.gen++
	keys := make([]neighKey, 0, len(upsert)+len(remove))
	for _, n := range remove {
		k := s.key(n)
		delete(s.desired, k)
		keys = append(keys, k)
	}
	for _, n := range upsert {
		keys = append(keys, s.upsert(link, n, s.gen))
	}
	return s.plan(link, keys)
}

func (s *NeighSync) upsert(link int, n nl.Neigh, gen uint64) neighKey {
	n.LinkIndex, n.Permanent = link, true
	k := s.key(n)
	if e, ok := s.desired[k]; ok {
		if !sameNeigh(e.n, n) {
			e.n = n
		}
		e.gen = gen
		return k
	}
	s.desired[k] = &stampedNeigh{n: n, gen: gen}
	return k
}

// plan diffs the desired set (only keys, when given and the record is
// trusted) against the record, reading the kernel first when needed.
func (s *NeighSync) plan(link int, keys []neighKey) (NeighPlan, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.known == nil || s.link != link || (s.FullSyncEvery > 0 && time.Since(s.lastDump) >= s.FullSyncEvery) {
		var (
			have []nl.Neigh
			err  error
		)
		if s.FDB {
			have, err = s.NL.FDB(link)
		} else {
			have, err = s.NL.Neighs(link, nl.FamilyAll)
		}
		if err != nil {
			return NeighPlan{}, err
		}
		s.known = make(map[neighKey]nl.Neigh, len(have))
		for _, n := range have {
			if n.Permanent {
				s.known[s.key(n)] = n
			}
		}
		s.link, s.lastDump = link, time.Now()
		keys = nil
	}
	var p NeighPlan
	diffKey := func(k neighKey) bool { // reports whether the entry is exactly as desired
		e, want := s.desired[k]
		have, ok := s.known[k]
		switch {
		case want && (!ok || !sameNeigh(have, e.n)):
			if ok && s.FDB && have.IP != e.n.IP {
				// A changed remote is a different entry to the kernel
				// (MAC + dst): delete the old one so exactly one remains.
				p.Delete = append(p.Delete, have)
			}
			p.Set = append(p.Set, e.n)
		case !want && ok:
			p.Delete = append(p.Delete, have)
		case want:
			return true
		}
		return false
	}
	if keys != nil {
		for _, k := range keys {
			diffKey(k)
		}
		return p, nil
	}
	matched := 0
	for k := range s.desired {
		if diffKey(k) {
			matched++
		}
	}
	if matched == len(s.known) {
		return p, nil // every kernel entry is desired as it is: nothing to delete
	}
	for k, have := range s.known {
		if _, ok := s.desired[k]; !ok {
			p.Delete = append(p.Delete, have)
		}
	}
	return p, nil
}

// Apply carries out one part of a plan and updates the record.
func (s *NeighSync) Apply(op nl.Op, entries []nl.Neigh) (int, error) {
	if len(entries) == 0 {
		return 0, nil
	}
	ops := make([]nl.NeighOp, len(entries))
	for i, n := range entries {
		n.Permanent = true
		ops[i] = nl.NeighOp{Op: op, Neigh: n, FDB: s.FDB}
	}
	var errs []error
	done := 0
	results := s.NL.NeighBatch(ops)
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, err := range results {
		if err != nil {
			errs = append(errs, err)
			continue
		}
		done++
		if s.known == nil {
			continue
		}
		n := ops[i].Neigh
		if op == nl.OpDel {
			if have, ok := s.known[s.key(n)]; ok && sameNeigh(have, n) {
				delete(s.known, s.key(n))
			}
		} else {
			s.known[s.key(n)] = n
		}
	}
	if len(errs) > 0 {
		s.known = nil
	}
	return done, errors.Join(errs...)
}

// Invalidate forces the next Plan to read the kernel.
func (s *NeighSync) Invalidate() {
	s.mu.Lock()
	s.known = nil
	s.mu.Unlock()
}
