package backend

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/twill-net/twill/internal/nl"
	"github.com/twill-net/twill/internal/owned"
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
	Logger        *slog.Logger

	mu       sync.Mutex
	known    map[nl.Key]nl.Route // guarded by mu; nil until read from the kernel
	lastDump time.Time           // guarded by mu

	// Used only inside Sync, which callers do not run concurrently.
	desired map[nl.Key]stamped
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

// Sync makes the owned routes match the routes desired emits. Callers run
// one Sync at a time.
func (s *RouteSync) Sync(desired func(emit func(nl.Route))) (SyncStats, error) {
	var st SyncStats
	if s.desired == nil {
		s.desired = map[nl.Key]stamped{}
	}
	s.gen++
	gen := s.gen
	table := s.table()
	desired(func(r nl.Route) {
		r.Protocol, r.Table = owned.RouteProtocol, table
		k := r.Key()
		e, ok := s.desired[k]
		if !ok || !e.route.Equal(r) {
			s.desired[k] = stamped{route: r, seen: gen, set: gen}
			return
		}
		e.seen = gen
		s.desired[k] = e
	})
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
	}
	plan := diffRoutes(s.desired, func(e stamped) nl.Route { return e.route }, s.known)
	s.mu.Unlock()

	// A change is drift unless the desired route was set by this very Sync.
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
	if ev.Route.Protocol != owned.RouteProtocol || ev.Route.Key().Table != s.table() {
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
