package kernelsync

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/twill-net/twill/nl"
)

// RouteKernel is what a RouteSync reads, changes and follows.
type RouteKernel interface {
	nl.RouteTable
	nl.RouteWatcher
}

// RouteSync keeps the routes twill owns in one table (those with twill's
// protocol) equal to a desired set. It is the route face of the one sync
// engine (see ownedSet): a record of the kernel re-read when it may be
// wrong, a desired set updated in place, batched changes, adds before
// deletes.
type RouteSync struct {
	NL            RouteKernel
	Table         int // 0 means main
	FullSyncEvery time.Duration
	// WatchedSyncEvery, when longer, replaces FullSyncEvery while Watch
	// follows the routes (subscribed, and the record verified).
	WatchedSyncEvery time.Duration
	// Log, when set, gets one warning per change of the destinations
	// routes of anyone else's hold too (see Shadowed).
	Log *slog.Logger

	once     sync.Once
	set      ownedSet[nl.Key, nl.Route]
	foreign  *foreignRoutes
	shadowed *RefusedPeers
}

func (s *RouteSync) engine() *ownedSet[nl.Key, nl.Route] {
	s.once.Do(func() {
		s.foreign = &foreignRoutes{dsts: map[netip.Prefix]int{}}
		s.set.kind = routeKind{nl: s.NL, table: tableOrMain(s.Table), foreign: s.foreign}
		s.set.fullSyncEvery, s.set.watchedSyncEvery = s.FullSyncEvery, s.WatchedSyncEvery
	})
	return &s.set
}

func tableOrMain(t int) int {
	if t == 0 {
		return nl.MainTable
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
// remove drops them by destination; the rest stays desired. While the
// record of the kernel is trusted only the changed keys are compared with
// it.
func (s *RouteSync) Update(upsert []nl.Route, remove []netip.Prefix) (SyncStats, error) {
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
	s.reportShadowed()
	return &RouteChange{c}, nil
}

// reportShadowed logs the shadowed destinations when they changed.
func (s *RouteSync) reportShadowed() {
	if s.Log == nil {
		return
	}
	if s.shadowed == nil {
		s.shadowed = &RefusedPeers{Log: s.Log, Message: "routes twill does not own hold destinations of twill's routes too, and take precedence; twill leaves them alone"}
	}
	s.shadowed.Report(s.Shadowed(), "table", tableOrMain(s.Table))
}

// PrepareUpdate is Update's first half.
func (s *RouteSync) PrepareUpdate(upsert []nl.Route, remove []netip.Prefix) (*RouteChange, error) {
	keys := make([]nl.Key, len(remove))
	for i, dst := range remove {
		keys[i] = Owned(nl.Route{Dst: dst}, s.Table).Key()
	}
	c, err := s.engine().planUpdate(upsert, keys)
	if err != nil {
		return nil, fmt.Errorf("reading owned routes of table %d: %w", tableOrMain(s.Table), err)
	}
	s.reportShadowed()
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
	if ev.Route.Key().Table != uint32(tableOrMain(s.Table)) {
		return false
	}
	e := s.engine()
	if ev.NonUnicast {
		// A blackhole (say) put in place of twill's route replaces it
		// whatever its protocol: to the record, twill's route is gone.
		// Dumps leave such routes out, and so does the foreign count.
		return !ev.Deleted && e.observe(ev.Route, true)
	}
	if ev.Route.Protocol != nl.RouteProtocol {
		// twill's route stands beside someone else's, so one going needs
		// nothing, unless it had twill's metric: then twill's add failed
		// (EEXIST) and can now succeed.
		s.foreign.observe(ev)
		return ev.Deleted && ev.Route.Priority == nl.RouteMetric(ev.Route.Dst)
	}
	return e.observe(ev.Route, ev.Deleted)
}

// Invalidate forces the next Sync to read the kernel.
func (s *RouteSync) Invalidate() { s.engine().Invalidate() }

// Verify reads the kernel's routes and reports whether they differ from
// the record, which is then dropped so that the next Sync reads them
// again. It may run beside Sync (a watch calls it once subscribed, to
// learn of changes made before): a start with tens of thousands of routes
// then needs no second full sync when nothing drifted.
func (s *RouteSync) Verify() bool { return s.engine().verify() }

// Shadowed lists the desired destinations a route of anyone else's holds
// too, sorted: its route takes precedence over twill's (twill leaves it
// alone). Call it from the goroutine that syncs.
func (s *RouteSync) Shadowed() []string {
	e := s.engine()
	dsts := s.foreign.among(func(dst netip.Prefix) bool {
		_, ok := e.desired[Owned(nl.Route{Dst: dst}, s.Table).Key()]
		return ok
	})
	out := make([]string, len(dsts))
	for i, d := range dsts {
		out[i] = d.String()
	}
	slices.Sort(out)
	return out
}

// Watch follows the kernel's route events until ctx ends, and pokes when
// one contradicts the record (a route of twill's changed behind its back).
// Every (re)subscription checks the record against the kernel and pokes
// if they differ, since events before it were not seen; checked is called
// after each such check (at once if the kernel cannot be watched). It is
// the route half of a KernelWatcher.
func (s *RouteSync) Watch(ctx context.Context, log *slog.Logger, poke, checked func()) error {
	return watchRecord(ctx, log.With("table", tableOrMain(s.Table)), "route", s.NL.WatchRoutes, s.Verify, s.Observe, s.engine().watched.Store, poke, checked)
}

// routeKind is the engine's view of routes.
type routeKind struct {
	nl      nl.RouteTable
	table   int
	foreign *foreignRoutes
}

// foreignRoutes counts the routes of anyone else's in the table by
// destination, as the last dump and the events since show them. twill's
// route to such a destination stands beside the other one, with its own
// metric; the other keeps winning as long as its metric is lower (the
// kernel's default, 0, is). RouteSync.Shadowed names them.
type foreignRoutes struct {
	mu   sync.Mutex
	dsts map[netip.Prefix]int
}

func (f *foreignRoutes) set(rs []nl.Route) {
	f.mu.Lock()
	defer f.mu.Unlock()
	clear(f.dsts)
	for _, r := range rs {
		f.dsts[r.Dst]++
	}
}

// among lists the destinations of want that a foreign route holds.
func (f *foreignRoutes) among(want func(netip.Prefix) bool) []netip.Prefix {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []netip.Prefix
	for dst := range f.dsts {
		if want(dst) {
			out = append(out, dst)
		}
	}
	return out
}

// observe follows an event about a foreign route.
func (f *foreignRoutes) observe(ev nl.RouteEvent) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if ev.Deleted {
		if f.dsts[ev.Route.Dst]--; f.dsts[ev.Route.Dst] <= 0 {
			delete(f.dsts, ev.Route.Dst)
		}
	} else {
		f.dsts[ev.Route.Dst]++
	}
}

func (k routeKind) key(r nl.Route) nl.Key           { return r.Key() }
func (k routeKind) same(a, b nl.Route) bool         { return a.Equal(b) }
func (k routeKind) inPlace(nl.Route, nl.Route) bool { return true }
func (k routeKind) normalize(r nl.Route) nl.Route   { return Owned(r, k.table) }

// Owned is r as twill programs it in table: its protocol, the table, and
// its metric (nl.RouteMetric); and as the kernel reports it: an IPv6
// route's scope is always universe, whatever was asked (otherwise it would
// never equal its desired self, and be replaced at every sync).
func Owned(r nl.Route, table int) nl.Route {
	r.Protocol, r.Table, r.Priority = nl.RouteProtocol, tableOrMain(table), nl.RouteMetric(r.Dst)
	if r.Dst.Addr().Is6() {
		r.Scope = nl.ScopeUniverse
	}
	return r
}

// list reads the table: twill's routes, and the destinations of everyone
// else's.
func (k routeKind) list() ([]nl.Route, error) {
	all, err := k.nl.Routes(nl.FamilyAll, nl.RouteFilter{Table: k.table})
	if err != nil {
		return nil, err
	}
	// twill's are kept in place: a table of 50,000 would otherwise be
	// copied into a slice grown a quarter at a time.
	mine, others := all[:0], []nl.Route(nil)
	for _, r := range all {
		if r.Protocol == nl.RouteProtocol {
			mine = append(mine, r)
		} else {
			others = append(others, r)
		}
	}
	k.foreign.set(others)
	return mine, nil
}

func (k routeKind) apply(op nl.Op, rs []nl.Route) []error {
	ops := make([]nl.RouteOp, len(rs))
	for i, r := range rs {
		ops[i] = nl.RouteOp{Op: op, Route: r}
	}
	errs := k.nl.RouteBatch(ops)
	for i, err := range errs {
		if op == nl.OpAdd && errors.Is(err, unix.EEXIST) {
			errs[i] = fmt.Errorf("%w (a route twill does not own holds this destination with twill's metric; leaving it alone)", err)
		}
	}
	return errs
}
