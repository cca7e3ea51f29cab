package backend

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/twill-net/twill/backend/nl"
	"github.com/twill-net/twill/backend/owned"
)

// RouteSync keeps the routes twill owns in one table equal to a desired set.
//
// Reading 5,000 routes back from the kernel costs several milliseconds, too
// much to do on every lease event, so RouteSync keeps its own record of what
// it programmed. The record is replaced by a kernel dump whenever it may be
// wrong: at the first Sync, after FullSyncEvery, after a failed change, and
// as soon as Observe sees a kernel event that contradicts it.
//
// The desired set is also kept between calls and updated in place, with a
// generation stamp per route, so that a lease event with thousands of peers
// allocates almost nothing.
type RouteSync struct {
	NL            *nl.Handle
	Table         int // 0 means main
	FullSyncEvery time.Duration

	mu       sync.Mutex
	known    map[nl.Key]nl.Route // guarded by mu; nil until read from the kernel
	lastDump time.Time           // guarded by mu

	// Used only inside Sync, which callers do not run concurrently.
	desired map[nl.Key]*stamped
	gen     uint64
}

// stamped is a desired route with the generation that last confirmed it
// (seen) and the one that set its current value (set).
type stamped struct {
	route     nl.Route
	seen, set uint64
}

// SyncStats says what one Sync changed.
type SyncStats struct {
	Added, Replaced, Deleted int
	// Repaired counts changes to routes whose desired value had not
	// changed, and deletions of routes nobody asked for in this process's
	// life: drift, as opposed to lease changes.
	Repaired int
	// Dumped is true when the kernel was read back.
	Dumped bool
}

// Sync makes the owned routes match the routes desired emits: the whole
// desired set. Callers run one Sync or Update at a time.
func (s *RouteSync) Sync(desired func(emit func(nl.Route))) (SyncStats, error) {
	if s.desired == nil {
		s.desired = map[nl.Key]*stamped{}
	}
	s.gen++
	gen := s.gen
	table := s.table()
	desired(func(r nl.Route) { s.upsertLocked(r, table, gen) })
	var dropped map[nl.Key]bool // desired last time, not any more
	for k, e := range s.desired {
		if e.seen != gen {
			if dropped == nil {
				dropped = map[nl.Key]bool{}
			}
			dropped[k] = true
			delete(s.desired, k)
		}
	}
	return s.converge(nil, dropped, gen)
}

// Update changes part of the desired set: upsert adds or changes routes,
// remove drops routes by key; the rest stays as desired before. While the
// record of the kernel is trusted, only the changed keys are compared with
// it, so the cost is that of the change, not of the whole set; otherwise
// the whole desired set is compared with a fresh dump, as Sync does.
func (s *RouteSync) Update(upsert []nl.Route, remove []nl.Key) (SyncStats, error) {
	if s.desired == nil {
		s.desired = map[nl.Key]*stamped{}
	}
	s.gen++
	gen := s.gen
	table := s.table()
	keys := make([]nl.Key, 0, len(upsert)+len(remove))
	for _, r := range upsert {
		keys = append(keys, s.upsertLocked(r, table, gen))
	}
	var dropped map[nl.Key]bool
	for _, k := range remove {
		if _, ok := s.desired[k]; ok {
			if dropped == nil {
				dropped = map[nl.Key]bool{}
			}
			dropped[k] = true
			delete(s.desired, k)
		}
		keys = append(keys, k)
	}
	return s.converge(keys, dropped, gen)
}

// upsertLocked records r as desired (stamping it seen, and set when it is
// new or changed) and returns its key.
func (s *RouteSync) upsertLocked(r nl.Route, table int, gen uint64) nl.Key {
	r.Protocol, r.Table = owned.RouteProtocol, table
	k := r.Key()
	e, ok := s.desired[k]
	switch {
	case !ok:
		s.desired[k] = &stamped{route: r, seen: gen, set: gen}
	case !e.route.Equal(r):
		e.route, e.seen, e.set = r, gen, gen
	default:
		e.seen = gen
	}
	return k
}

// converge compares the desired set with the kernel (only keys, when given
// and the record is trusted) and applies the difference.
func (s *RouteSync) converge(keys []nl.Key, dropped map[nl.Key]bool, gen uint64) (SyncStats, error) {
	var st SyncStats
	table := s.table()
	s.mu.Lock()
	if s.known == nil || (s.FullSyncEvery > 0 && time.Since(s.lastDump) >= s.FullSyncEvery) {
		s.mu.Unlock()
		have, err := s.NL.Routes(nl.FamilyAll, nl.RouteFilter{Table: table, Protocol: owned.RouteProtocol})
		if err != nil {
			return st, fmt.Errorf("reading owned routes of table %d: %w", table, err)
		}
		s.mu.Lock()
		s.known = RouteMap(have)
		s.lastDump = time.Now()
		st.Dumped = true
		keys = nil // the record was just rebuilt: compare everything
	}
	var plan RoutePlan
	if keys == nil {
		plan = diffRoutes(s.desired, func(e *stamped) nl.Route { return e.route }, s.known)
	} else {
		for _, k := range keys {
			e, want := s.desired[k]
			have, ok := s.known[k]
			switch {
			case want && !ok:
				plan.Add = append(plan.Add, e.route)
			case want && !have.Equal(e.route):
				plan.Replace = append(plan.Replace, e.route)
			case !want && ok:
				plan.Delete = append(plan.Delete, have)
			}
		}
	}
	s.mu.Unlock()

	// A change is drift unless the desired route was set by this very call.
	drift := func(r nl.Route) bool { return s.desired[r.Key()].set != gen }
	var errs []error
	// Add and replace first, then delete: a route never disappears before
	// its successor is in place. Each phase is one batch.
	for _, phase := range []struct {
		op     nl.Op
		routes []nl.Route
	}{{nl.OpAdd, plan.Add}, {nl.OpReplace, plan.Replace}, {nl.OpDel, plan.Delete}} {
		if len(phase.routes) == 0 {
			continue
		}
		ops := make([]nl.RouteOp, len(phase.routes))
		for i, r := range phase.routes {
			ops[i] = nl.RouteOp{Op: phase.op, Route: r}
			s.record(r, phase.op != nl.OpDel)
		}
		for i, err := range s.NL.RouteBatch(ops) {
			r := phase.routes[i]
			if err != nil {
				s.record(r, phase.op == nl.OpDel) // undo: the kernel did not change
				if phase.op == nl.OpAdd && errors.Is(err, unix.EEXIST) {
					err = fmt.Errorf("%w (a route twill does not own holds this destination; leaving it alone)", err)
				}
				errs = append(errs, err)
				continue
			}
			switch phase.op {
			case nl.OpAdd:
				st.Added++
				if drift(r) {
					st.Repaired++
				}
			case nl.OpReplace:
				st.Replaced++
				if drift(r) {
					st.Repaired++
				}
			case nl.OpDel:
				st.Deleted++
				if !dropped[r.Key()] {
					st.Repaired++ // stale: not desired at any time by this process
				}
			}
		}
	}
	if len(errs) > 0 {
		s.Invalidate() // re-read the kernel next time
	}
	return st, errors.Join(errs...)
}

// record updates the record before the kernel call, so that the event the
// kernel sends about our own change agrees with it.
func (s *RouteSync) record(r nl.Route, present bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.known == nil {
		return
	}
	if present {
		s.known[r.Key()] = r
	} else {
		delete(s.known, r.Key())
	}
}

// Observe checks a kernel route event against the record and reports
// whether it contradicts it, in which case the next Sync reads the kernel.
func (s *RouteSync) Observe(ev nl.RouteEvent) bool {
	if ev.Route.Protocol != owned.RouteProtocol || ev.Route.Key().Table != uint32(s.table()) {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.known == nil {
		return true
	}
	have, ok := s.known[ev.Route.Key()]
	contradicts := ok == ev.Deleted
	if !contradicts && !ev.Deleted && !have.Equal(ev.Route) {
		contradicts = true
	}
	if contradicts {
		s.known = nil
	}
	return contradicts
}

// Invalidate forces the next Sync to read the kernel.
func (s *RouteSync) Invalidate() {
	s.mu.Lock()
	s.known = nil
	s.mu.Unlock()
}

func (s *RouteSync) table() int {
	if s.Table == 0 {
		return owned.MainTable
	}
	return s.Table
}

// Watch follows the kernel's route events until ctx ends, and pokes when
// one contradicts the record (a route of twill's changed behind its back).
// Every (re)subscription invalidates the record and pokes, since events
// before it were not seen. It is the route half of a KernelWatcher.
func (s *RouteSync) Watch(ctx context.Context, log *slog.Logger, poke func()) error {
	return WatchLoop(ctx, log, "route", func() { s.Invalidate(); poke() }, func(ctx context.Context, subscribed func()) error {
		return s.NL.WatchRoutes(ctx, subscribed, func(ev nl.RouteEvent) {
			if s.Observe(ev) {
				poke()
			}
		})
	})
}
