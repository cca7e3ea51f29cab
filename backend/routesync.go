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
type RouteSync struct {
	NL            *nl.Handle
	Table         int // 0 means main
	FullSyncEvery time.Duration
	Logger        *slog.Logger

	mu       sync.Mutex
	known    map[nl.Key]nl.Route // guarded by mu; nil until read from the kernel
	lastDump time.Time           // guarded by mu
	applied  map[nl.Key]nl.Route // guarded by mu; the last desired set fully applied
}

// SyncStats says what one Sync changed.
type SyncStats struct {
	Added, Replaced, Deleted int
	// Repaired counts changes to routes twill had already programmed or
	// never wanted: drift, as opposed to lease changes.
	Repaired int
	// Dumped is true when the kernel was read back.
	Dumped bool
}

// Sync makes the owned routes match desired.
func (s *RouteSync) Sync(desired []nl.Route) (SyncStats, error) {
	var st SyncStats
	want := RouteMap(desired)
	for k, r := range want {
		r.Protocol = owned.RouteProtocol
		r.Table = s.table()
		want[k] = r
	}

	s.mu.Lock()
	if s.known == nil || (s.FullSyncEvery > 0 && time.Since(s.lastDump) >= s.FullSyncEvery) {
		s.mu.Unlock()
		have, err := s.NL.Routes(nl.FamilyAll, nl.RouteFilter{Table: s.table(), Protocol: owned.RouteProtocol})
		if err != nil {
			return st, fmt.Errorf("reading owned routes of table %d: %w", s.table(), err)
		}
		s.mu.Lock()
		s.known = RouteMap(have)
		s.lastDump = time.Now()
		st.Dumped = true
	}
	plan := DiffRoutes(want, s.known)
	applied := s.applied
	s.mu.Unlock()

	var errs []error
	drift := func(r nl.Route) bool {
		prev, ok := applied[r.Key()]
		return !ok || prev.Equal(want[r.Key()])
	}
	// Add and replace first, then delete: a route never disappears before
	// its successor is in place.
	for _, r := range plan.Add {
		s.record(r, true)
		if err := s.NL.RouteAdd(r); err != nil {
			s.record(r, false)
			if errors.Is(err, unix.EEXIST) {
				err = fmt.Errorf("%w (a route twill does not own holds this destination; leaving it alone)", err)
			}
			errs = append(errs, err)
			continue
		}
		st.Added++
		if _, ok := applied[r.Key()]; ok && drift(r) {
			st.Repaired++
		}
	}
	for _, r := range plan.Replace {
		s.record(r, true)
		if err := s.NL.RouteReplace(r); err != nil {
			errs = append(errs, err)
			continue
		}
		st.Replaced++
		if drift(r) {
			st.Repaired++
		}
	}
	for _, r := range plan.Delete {
		s.record(r, false)
		if err := s.NL.RouteDel(r); err != nil {
			errs = append(errs, err)
			continue
		}
		st.Deleted++
		if _, ok := applied[r.Key()]; !ok {
			st.Repaired++ // stale: nobody asked for it since this process started
		}
	}

	s.mu.Lock()
	if len(errs) > 0 {
		s.known = nil // re-read the kernel next time
	} else {
		s.applied = want
	}
	s.mu.Unlock()
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
