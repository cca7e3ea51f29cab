package kernelsync

import (
	"bytes"
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twill-net/twill/nl"
)

// NeighKernel is what a NeighSync reads, changes and follows.
type NeighKernel interface {
	nl.NeighTable
	nl.NeighWatcher
}

// NeighSync keeps the permanent neighbour entries of one device (or, with
// FDB, its forwarding entries: MAC -> remote) equal to a desired set. It is
// the neighbour face of the one sync engine (see ownedSet). Entries that
// are not permanent belong to the kernel and are left alone.
type NeighSync struct {
	NL            NeighKernel
	FDB           bool
	FullSyncEvery time.Duration
	// WatchedSyncEvery, when longer, replaces FullSyncEvery while Watch
	// follows the entries (subscribed, and the record verified).
	WatchedSyncEvery time.Duration

	link atomic.Int64 // the device's index
	once sync.Once
	set  ownedSet[neighKey, nl.Neigh]
}

// neighKey identifies an entry: its IP for neighbours, its MAC for FDB
// entries (one remote per MAC).
type neighKey struct {
	ip  [16]byte
	mac [6]byte
}

func (s *NeighSync) engine() *ownedSet[neighKey, nl.Neigh] {
	s.once.Do(func() {
		s.set.kind = neighKind{s: s}
		s.set.fullSyncEvery, s.set.watchedSyncEvery = s.FullSyncEvery, s.WatchedSyncEvery
	})
	return &s.set
}

// SetLink says which device the entries are on; a different device than
// before makes the next sync read the kernel.
func (s *NeighSync) SetLink(index int) {
	if s.link.Swap(int64(index)) != int64(index) {
		s.engine().Invalidate()
	}
}

// Prepare plans the change to the whole desired set (what desired emits),
// reading the kernel if needed, and changes nothing.
func (s *NeighSync) Prepare(desired func(emit func(nl.Neigh))) (*NeighChange, error) {
	c, err := s.engine().plan(desired)
	if err != nil {
		return nil, err
	}
	return &NeighChange{c}, nil
}

// PrepareUpdate plans a change of part of the desired set: upsert adds or
// changes entries, remove drops them; the rest stays desired.
func (s *NeighSync) PrepareUpdate(upsert, remove []nl.Neigh) (*NeighChange, error) {
	keys := make([]neighKey, len(remove))
	k := neighKind{s: s}
	for i, n := range remove {
		keys[i] = k.key(n)
	}
	c, err := s.engine().planUpdate(upsert, keys)
	if err != nil {
		return nil, err
	}
	return &NeighChange{c}, nil
}

// Sync makes the entries match the whole desired set.
func (s *NeighSync) Sync(desired func(emit func(nl.Neigh))) (SyncStats, error) {
	c, err := s.Prepare(desired)
	if err != nil {
		return SyncStats{}, err
	}
	return c.Apply()
}

// Invalidate forces the next sync to read the kernel.
func (s *NeighSync) Invalidate() { s.engine().Invalidate() }

// Observe checks a kernel event about a neighbour or FDB entry against the
// record and reports whether it contradicts it (an entry of twill's
// deleted, changed, or replaced by one that is not permanent), in which
// case the next sync reads the kernel. Entries that are not permanent are
// the kernel's own (resolved, multicast): where twill has none they come
// and go unremarked.
func (s *NeighSync) Observe(ev nl.NeighEvent) bool {
	if ev.FDB != s.FDB || int64(ev.Neigh.LinkIndex) != s.link.Load() {
		return false
	}
	e := s.engine()
	switch {
	case ev.Deleted && s.FDB:
		// Exactly twill's entry: an FDB entry that moved to a new remote
		// is deleted after the record has the new one.
		return e.observeGone(ev.Neigh)
	case ev.Deleted, !ev.Neigh.Permanent:
		// The kernel reports a deleted neighbour without its address or
		// state (marked failed first, in an event of its own), and the
		// kernel's own entries are not permanent: either says twill's
		// entry at that IP, if it had one there, is gone.
		return e.observe(ev.Neigh, true)
	default:
		return e.observe(ev.Neigh, false)
	}
}

// Verify reads the kernel's entries and reports whether they differ from
// the record, which is then dropped (see RouteSync.Verify).
func (s *NeighSync) Verify() bool { return s.engine().verify() }

// Watch follows the kernel's neighbour events until ctx ends, and pokes
// when one contradicts the record (an entry of twill's deleted or changed
// behind its back). Every (re)subscription checks the record against the
// kernel and pokes if they differ, then calls checked (see
// RouteSync.Watch). It is the neighbour (or FDB) part of a KernelWatcher.
func (s *NeighSync) Watch(ctx context.Context, log *slog.Logger, poke, checked func()) error {
	subscribe := s.NL.WatchNeighs
	what := "neighbour"
	if s.FDB {
		what = "fdb"
	}
	return watchRecord(ctx, log, what, subscribe, s.Verify, s.Observe, s.engine().watched.Store, poke, checked)
}

// NeighChange is a planned change of a NeighSync.
type NeighChange struct{ c *change[neighKey, nl.Neigh] }

// Upserts sets entries (and, for an FDB entry whose remote changed, first
// deletes the old one: to the kernel it is another entry).
func (c *NeighChange) Upserts() (SyncStats, error) { return c.c.upserts() }

// Deletes removes entries no desired one backs.
func (c *NeighChange) Deletes() (SyncStats, error) { return c.c.deletes() }

// Apply is Upserts, then Deletes.
func (c *NeighChange) Apply() (SyncStats, error) { return c.c.both() }

// Empty reports whether nothing changes.
func (c *NeighChange) Empty() bool { return c.c.empty() }

// neighKind is the engine's view of neighbour or FDB entries.
type neighKind struct{ s *NeighSync }

func (k neighKind) key(n nl.Neigh) neighKey {
	if k.s.FDB {
		var key neighKey
		copy(key.mac[:], n.HardwareAddr)
		return key
	}
	return neighKey{ip: n.IP.As16()}
}

func (k neighKind) same(a, b nl.Neigh) bool {
	return a.LinkIndex == b.LinkIndex && a.IP == b.IP && bytes.Equal(a.HardwareAddr, b.HardwareAddr) && a.Permanent == b.Permanent
}

// inPlace: a neighbour is replaced in place; an FDB entry with a new remote
// is a new entry (MAC + remote) to the kernel.
func (k neighKind) inPlace(have, want nl.Neigh) bool { return !k.s.FDB || have.IP == want.IP }

func (k neighKind) normalize(n nl.Neigh) nl.Neigh {
	n.LinkIndex, n.Permanent = int(k.s.link.Load()), true
	return n
}

func (k neighKind) list() ([]nl.Neigh, error) {
	link := int(k.s.link.Load())
	var (
		all []nl.Neigh
		err error
	)
	if k.s.FDB {
		all, err = k.s.NL.FDB(link)
	} else {
		all, err = k.s.NL.Neighs(link, nl.FamilyAll)
	}
	if err != nil {
		return nil, err
	}
	owned := all[:0]
	for _, n := range all {
		if n.Permanent {
			owned = append(owned, n)
		}
	}
	return owned, nil
}

func (k neighKind) apply(op nl.Op, ns []nl.Neigh) []error {
	if op == nl.OpAdd {
		op = nl.OpReplace // neighbour and FDB writes replace
	}
	ops := make([]nl.NeighOp, len(ns))
	for i, n := range ns {
		ops[i] = nl.NeighOp{Op: op, Neigh: n, FDB: k.s.FDB}
	}
	return k.s.NL.NeighBatch(ops)
}
