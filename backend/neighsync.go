package backend

import (
	"bytes"
	"errors"
	"net"
	"sync"
	"time"

	"github.com/twill-net/twill/internal/nl"
)

// NeighSync keeps the permanent neighbour entries (or, with FDB, the
// forwarding entries) of one device equal to a desired set, the way
// RouteSync does for routes: a record of the kernel replaced by a dump when
// invalidated, after FullSyncEvery, or after a failure; changes in batches.
// Entries that are not permanent belong to the kernel and are left alone.
type NeighSync struct {
	NL            *nl.Handle
	FDB           bool
	FullSyncEvery time.Duration

	mu       sync.Mutex
	known    map[string]nl.Neigh // guarded by mu; nil until read
	link     int                 // guarded by mu; device the record is for
	lastDump time.Time           // guarded by mu
}

// key identifies an entry: its IP for neighbours, its MAC for FDB entries
// (one remote per MAC).
func (s *NeighSync) key(n nl.Neigh) string {
	if s.FDB {
		return string(n.HardwareAddr)
	}
	return n.IP.String()
}

func sameNeigh(a, b nl.Neigh) bool {
	return a.IP == b.IP && bytes.Equal(a.HardwareAddr, b.HardwareAddr) && a.Permanent == b.Permanent
}

// NeighPlan is the changes Sync will make.
type NeighPlan struct {
	Set, Delete []nl.Neigh
}

// Plan computes the changes for link given the desired entries; it reads
// the kernel when the record cannot be trusted.
func (s *NeighSync) Plan(link int, desired map[string]nl.Neigh) (NeighPlan, error) {
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
		s.known = make(map[string]nl.Neigh, len(have))
		for _, n := range have {
			if n.Permanent {
				s.known[s.key(n)] = n
			}
		}
		s.link, s.lastDump = link, time.Now()
	}
	var p NeighPlan
	for k, want := range desired {
		if have, ok := s.known[k]; !ok || !sameNeigh(have, want) {
			p.Set = append(p.Set, want)
		}
	}
	for k, have := range s.known {
		want, ok := desired[k]
		if !ok {
			p.Delete = append(p.Delete, have)
			continue
		}
		// A changed FDB remote is a different entry to the kernel (MAC +
		// dst); delete the old one so exactly one remains.
		if s.FDB && have.IP != want.IP {
			p.Delete = append(p.Delete, have)
		}
	}
	return p, nil
}

// Apply carries out the given part of a plan and updates the record.
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

// MACKey is the key of an FDB entry for mac.
func MACKey(mac net.HardwareAddr) string { return string(mac) }
