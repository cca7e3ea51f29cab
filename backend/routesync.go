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

// RouteSync keeps the routes twill owns in one table (those with twill's
// protocol) equal to a desired set. It is the route face of the one sync
// engine (see ownedSet): a record of the kernel re-read when it may be
// wrong, a desired set updated in place, batched changes, adds before
// deletes.
type RouteSync struct {
	NL            RouteTable
	Table         int // 0 means main
	FullSyncEvery time.Duration

	once sync.Once
	set  ownedSet[nl.Key, nl.Route]
}

func (s *RouteSync) engine() *ownedSet[nl.Key, nl.Route] {
	s.once.Do(func() {
		s.set.kind = routeKind{nl: s.NL, table: tableOrMain(s.Table)}
		s.set.fullSyncEvery = s.FullSyncEvery
	})
	return &s.set
}

func tableOrMain(t int) int {
	if t == 0 {
		return owned.MainTable
	}
	return t
}

// Sync makes the owned routes match the routes desired emits: the whole
// desired set. Callers run one Sync or Update at a time.
func (s *RouteSync) Sync(desired func(emit func(nl.Route))) (SyncStats, error) {
	c, err := s.Prepare(desired)
	if err != nil {
		return SyncStats{}, err
	}
	return c.Apply()
}

// Update changes part of the desired set: upsert adds or changes routes,
// remove drops them by key; the rest stays desired. While the record of
// the kernel is trusted only the changed keys are compared with it.
func (s *RouteSync) Update(upsert []nl.Route, remove []nl.Key) (SyncStats, error) {
	c, err := s.PrepareUpdate(upsert, remove)
	if err != nil {
		return SyncStats{}, err
	}
	return c.Apply()
}

// Prepare is Sync's first half: it plans, reading the kernel if needed,
// and changes nothing. A backend that must order changes across sets (a
// neighbour before its route, a route before its FDB entry goes) applies
// the halves itself.
func (s *RouteSync) Prepare(desired func(emit func(nl.Route))) (*RouteChange, error) {
	c, err := s.engine().plan(desired)
	if err != nil {
		return nil, fmt.Errorf("reading owned routes of table %d: %w", tableOrMain(s.Table), err)
	}
	return &RouteChange{c}, nil
}

// PrepareUpdate is Update's first half.
func (s *RouteSync) PrepareUpdate(upsert []nl.Route, remove []nl.Key) (*RouteChange, error) {
	c, err := s.engine().planUpdate(upsert, remove)
	if err != nil {
		return nil, fmt.Errorf("reading owned routes of table %d: %w", tableOrMain(s.Table), err)
	}
	return &RouteChange{c}, nil
}

// RouteChange is a planned change of a RouteSync.
type RouteChange struct{ c *change[nl.Key, nl.Route] }

// Upserts adds and replaces routes.
func (c *RouteChange) Upserts() (SyncStats, error) { return c.c.upserts() }

// Deletes removes routes no desired one backs.
func (c *RouteChange) Deletes() (SyncStats, error) { return c.c.deletes() }

// Apply is Upserts, then Deletes.
func (c *RouteChange) Apply() (SyncStats, error) { return c.c.both() }

// Observe checks a kernel route event against the record and reports
// whether it contradicts it, in which case the next Sync reads the kernel.
func (s *RouteSync) Observe(ev nl.RouteEvent) bool {
	if ev.Route.Protocol != owned.RouteProtocol || ev.Route.Key().Table != uint32(tableOrMain(s.Table)) {
		return false
	}
	return s.engine().observe(ev.Route, ev.Deleted)
}

// Invalidate forces the next Sync to read the kernel.
func (s *RouteSync) Invalidate() { s.engine().Invalidate() }

// Watch follows the kernel's route events until ctx ends, and pokes when
// one contradicts the record (a route of twill's changed behind its back).
// Every (re)subscription invalidates the record and pokes, since events
// before it were not seen. It is the route half of a KernelWatcher.
func (s *RouteSync) Watch(ctx context.Context, log *slog.Logger, poke func()) error {
	w, ok := s.NL.(RouteWatcher)
	if !ok {
		<-ctx.Done()
		return nil
	}
	return WatchLoop(ctx, log, "route", func() { s.Invalidate(); poke() }, func(ctx context.Context, subscribed func()) error {
		return w.WatchRoutes(ctx, subscribed, func(ev nl.RouteEvent) {
			if s.Observe(ev) {
				poke()
			}
		})
	})
}

// routeKind is the engine's view of routes.
type routeKind struct {
	nl    RouteTable
	table int
}

func (k routeKind) key(r nl.Route) nl.Key           { return r.Key() }
func (k routeKind) same(a, b nl.Route) bool         { return a.Equal(b) }
func (k routeKind) inPlace(nl.Route, nl.Route) bool { return true }
func (k routeKind) normalize(r nl.Route) nl.Route {
	r.Protocol, r.Table = owned.RouteProtocol, k.table
	return r
}
func (k routeKind) list() ([]nl.Route, error) {
	return k.nl.Routes(nl.FamilyAll, nl.RouteFilter{Table: k.table, Protocol: owned.RouteProtocol})
}

func (k routeKind) apply(op nl.Op, rs []nl.Route) []error {
	ops := make([]nl.RouteOp, len(rs))
	for i, r := range rs {
		ops[i] = nl.RouteOp{Op: op, Route: r}
	}
	errs := k.nl.RouteBatch(ops)
	for i, err := range errs {
		if op == nl.OpAdd && errors.Is(err, unix.EEXIST) {
			errs[i] = fmt.Errorf("%w (a route twill does not own holds this destination; leaving it alone)", err)
		}
	}
	return errs
}
