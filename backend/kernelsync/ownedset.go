package kernelsync

import (
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twill-net/twill/nl"
)

// ownedSet is the one sync engine behind RouteSync, NeighSync and
// RuleSync: it keeps the kernel objects of one kind that twill owns equal
// to a desired set.
//
// Reading thousands of objects back from the kernel costs milliseconds,
// too much for every lease event, so the set keeps a record of the kernel
// ("known"). The record is replaced by a dump whenever it may be wrong: at
// the first sync, after fullSyncEvery, after a failed change, and as soon
// as Observe sees a kernel event that contradicts it. The desired set is
// kept between calls and updated in place, with generation stamps, so that
// a lease event with thousands of peers allocates almost nothing; an
// update compares only the keys it changed.
//
// One lock rule: mu guards the record, and is never held across kernel
// I/O. A change is recorded just before it is made (so the kernel's event
// about it agrees with the record) and undone if the kernel refused it.
type ownedSet[K comparable, V any] struct {
	kind          objectKind[K, V]
	fullSyncEvery time.Duration
	// watchedSyncEvery replaces fullSyncEvery, when longer, while a kernel
	// watch follows the objects (watched): every change behind twill's
	// back then reaches Observe as it happens.
	watchedSyncEvery time.Duration
	watched          atomic.Bool
	now              func() time.Time

	mu       sync.Mutex
	known    map[K]V        // guarded by mu; nil until read from the kernel
	lastDump time.Time      // guarded by mu
	touched  map[K]struct{} // guarded by mu; keys recorded while verify reads, else nil
	epoch    uint64         // guarded by mu; counts the records read from the kernel

	// Touched only by the goroutine that plans changes (the reconcile
	// loop): never concurrently.
	desired map[K]*stamped[V]
	gen     uint64
}

// objectKind is what the engine needs to know of one kind of object.
type objectKind[K comparable, V any] interface {
	key(V) K
	// same reports whether two objects are programmed identically.
	same(a, b V) bool
	// inPlace reports whether the kernel can turn have into want with one
	// replace; if not, have is deleted and want added (an FDB entry to a
	// new remote, a rule, which the kernel cannot replace).
	inPlace(have, want V) bool
	// normalize fills in what twill sets on every object of the kind (the
	// protocol, the table, the device).
	normalize(V) V
	// list reads the owned objects from the kernel.
	list() ([]V, error)
	// apply makes changes, one error (or nil) per object.
	apply(op nl.Op, vs []V) []error
}

// stamped is a desired object with the generation that last confirmed it
// (seen) and the one that set its current value (set).
type stamped[V any] struct {
	v         V
	seen, set uint64
}

// SyncStats says what one sync changed.
type SyncStats struct {
	Added, Replaced, Deleted int
	// Repaired counts changes to objects whose desired value had not
	// changed, and deletions of objects nobody asked for in this process's
	// life: drift, as opposed to lease changes.
	Repaired int
	// Dumped is true when the kernel was read back.
	Dumped bool
}

func (s SyncStats) plus(o SyncStats) SyncStats {
	return SyncStats{Added: s.Added + o.Added, Replaced: s.Replaced + o.Replaced, Deleted: s.Deleted + o.Deleted,
		Repaired: s.Repaired + o.Repaired, Dumped: s.Dumped || o.Dumped}
}

// change is a planned change of one set: upserts first, deletes later, so
// that an object never disappears before its successor is in place.
type change[K comparable, V any] struct {
	s       *ownedSet[K, V]
	add     []V // no object with this key exists
	replace []V // one exists, and the kernel can replace it
	delete  []V // owned objects no desired one backs, or in the way of an add
	dropped map[K]bool
	gen     uint64
	dumped  bool
}

// plan sets the whole desired set (what emit gives) and plans the change.
func (s *ownedSet[K, V]) plan(desired func(emit func(V))) (*change[K, V], error) {
	s.init()
	s.gen++
	gen := s.gen
	desired(func(v V) { s.upsert(v, gen) })
	var dropped map[K]bool
	for k, e := range s.desired {
		if e.seen != gen {
			if dropped == nil {
				dropped = map[K]bool{}
			}
			dropped[k] = true
			delete(s.desired, k)
		}
	}
	return s.diff(nil, dropped, gen)
}

// planUpdate changes part of the desired set: upsert adds or changes
// objects, remove drops them by key; the rest stays desired. While the
// record is trusted only the changed keys are compared with it, so the
// cost is that of the change, not of the whole set.
func (s *ownedSet[K, V]) planUpdate(upsert []V, remove []K) (*change[K, V], error) {
	s.init()
	s.gen++
	gen := s.gen
	keys := make([]K, 0, len(upsert)+len(remove))
	var dropped map[K]bool
	for _, k := range remove {
		if _, ok := s.desired[k]; ok {
			if dropped == nil {
				dropped = map[K]bool{}
			}
			dropped[k] = true
			delete(s.desired, k)
		}
		keys = append(keys, k)
	}
	for _, v := range upsert {
		keys = append(keys, s.upsert(v, gen))
	}
	if len(keys) > 1 {
		// A key both removed and upserted (a subnet that changed hands) is
		// compared once.
		seen := make(map[K]bool, len(keys))
		keys = slices.DeleteFunc(keys, func(k K) bool { dup := seen[k]; seen[k] = true; return dup })
	}
	return s.diff(keys, dropped, gen)
}

func (s *ownedSet[K, V]) init() {
	if s.desired == nil {
		s.desired = map[K]*stamped[V]{}
	}
	if s.now == nil {
		s.now = time.Now
	}
}

// recordExpired reports whether the record is older than it may be
// trusted. Called with mu held.
func (s *ownedSet[K, V]) recordExpired() bool {
	every := s.fullSyncEvery
	if s.watched.Load() && s.watchedSyncEvery > every {
		every = s.watchedSyncEvery
	}
	return every > 0 && s.now().Sub(s.lastDump) >= every
}

// upsert records v as desired (stamping it seen, and set when it is new or
// changed) and returns its key.
func (s *ownedSet[K, V]) upsert(v V, gen uint64) K {
	v = s.kind.normalize(v)
	k := s.kind.key(v)
	e, ok := s.desired[k]
	switch {
	case !ok:
		s.desired[k] = &stamped[V]{v: v, seen: gen, set: gen}
	case !s.kind.same(e.v, v):
		e.v, e.seen, e.set = v, gen, gen
	default:
		e.seen = gen
	}
	return k
}

// diff compares the desired set with the record (only keys, when given and
// the record is trusted), reading the kernel first when the record cannot
// be trusted. The kernel is read without the lock held.
func (s *ownedSet[K, V]) diff(keys []K, dropped map[K]bool, gen uint64) (*change[K, V], error) {
	c := &change[K, V]{s: s, dropped: dropped, gen: gen}
	s.mu.Lock()
	known := s.known
	stale := known == nil || s.recordExpired()
	s.mu.Unlock()
	if stale {
		have, err := s.kind.list()
		if err != nil {
			return nil, err
		}
		// Sized for what the record will hold after this change: at
		// start-up the kernel has nothing and every desired object is
		// recorded as it is written.
		known = make(map[K]V, max(len(have), len(s.desired)))
		for _, v := range have {
			known[s.kind.key(v)] = v
		}
		s.mu.Lock()
		s.known, s.lastDump = known, s.now()
		s.epoch++
		s.mu.Unlock()
		c.dumped = true
		keys = nil // the record was just rebuilt: compare everything
	}
	// Compare with the record taken above: a kernel event may drop s.known
	// meanwhile (observe), which only means the next sync reads the kernel
	// again, not that the kernel is empty. record() changes this map under
	// the lock, so it is read under the lock too.
	s.mu.Lock()
	defer s.mu.Unlock()
	present := 0            // desired keys the kernel has
	one := func(k K) bool { // reports whether the kernel has k exactly as desired
		e, want := s.desired[k]
		have, ok := known[k]
		if want && ok {
			present++
		}
		switch {
		case want && !ok:
			c.add = append(c.add, e.v)
		case want && !s.kind.same(have, e.v):
			if s.kind.inPlace(have, e.v) {
				c.replace = append(c.replace, e.v)
			} else {
				c.delete = append(c.delete, have)
				c.add = append(c.add, e.v)
			}
		case !want && ok:
			c.delete = append(c.delete, have)
		case want:
			return true
		}
		return false
	}
	if keys != nil {
		for _, k := range keys {
			one(k)
		}
		return c, nil
	}
	if len(known) == 0 {
		c.add = make([]V, 0, len(s.desired))
	}
	for k := range s.desired {
		one(k)
	}
	// When every kernel object has a desired key, nothing is stale: skip
	// the scan (the common case).
	if present < len(known) {
		for k, have := range known {
			if _, ok := s.desired[k]; !ok {
				c.delete = append(c.delete, have)
			}
		}
	}
	return c, nil
}

// empty reports whether the change changes nothing.
func (c *change[K, V]) empty() bool { return len(c.add)+len(c.replace)+len(c.delete) == 0 }

// upserts makes the additions and replacements. Objects that stand in the
// way of an addition (inPlace false) are deleted first.
func (c *change[K, V]) upserts() (SyncStats, error) {
	var st SyncStats
	st.Dumped = c.dumped
	var errs []error
	// Deletions that make room for an addition go first.
	var inTheWay, stale []V
	for _, v := range c.delete {
		if c.s.desiredHas(c.s.kind.key(v)) {
			inTheWay = append(inTheWay, v)
		} else {
			stale = append(stale, v)
		}
	}
	c.delete = stale
	if len(inTheWay) > 0 {
		_, err := c.run(nl.OpDel, inTheWay, &st, false)
		errs = append(errs, err)
	}
	_, err := c.run(nl.OpAdd, c.add, &st, true)
	errs = append(errs, err)
	_, err = c.run(nl.OpReplace, c.replace, &st, true)
	errs = append(errs, err)
	return st, errors.Join(errs...)
}

// deletes removes what no desired object backs.
func (c *change[K, V]) deletes() (SyncStats, error) {
	var st SyncStats
	_, err := c.run(nl.OpDel, c.delete, &st, false)
	return st, err
}

// both is upserts then deletes.
func (c *change[K, V]) both() (SyncStats, error) {
	a, err1 := c.upserts()
	b, err2 := c.deletes()
	return a.plus(b), errors.Join(err1, err2)
}

func (s *ownedSet[K, V]) desiredHas(k K) bool { _, ok := s.desired[k]; return ok }

// run applies one kind of change to vs and counts it in st. The record is
// updated before the kernel call and undone where the kernel refused.
func (c *change[K, V]) run(op nl.Op, vs []V, st *SyncStats, present bool) (int, error) {
	if len(vs) == 0 {
		return 0, nil
	}
	s := c.s
	s.record(vs, present)
	results := s.kind.apply(op, vs)
	var errs []error
	done := 0
	for i, err := range results {
		v := vs[i]
		if err != nil {
			errs = append(errs, err)
			continue
		}
		done++
		k := s.kind.key(v)
		e := s.desired[k]
		switch op {
		case nl.OpAdd:
			st.Added++
			if e != nil && e.set != c.gen {
				st.Repaired++
			}
		case nl.OpReplace:
			st.Replaced++
			if e != nil && e.set != c.gen {
				st.Repaired++
			}
		case nl.OpDel:
			st.Deleted++
			if e == nil && !c.dropped[k] {
				st.Repaired++ // stale: not desired at any time by this process
			}
		}
	}
	if len(errs) > 0 {
		// The kernel is not what the record says now: read it next time.
		s.Invalidate()
	}
	return done, errors.Join(errs...)
}

// verifyRestarts bounds how often verify compares again because the
// record was replaced while it compared.
const verifyRestarts = 3

// verifyChunk is how many objects verify compares per hold of the lock.
const verifyChunk = 512
