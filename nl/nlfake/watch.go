package nlfake

import (
	"context"
	"fmt"
	"net/netip"

	"golang.org/x/sys/unix"

	"github.com/twill-net/twill/nl"
)

// Link, address, route and neighbour events, as the kernel announces them
// to a subscribed socket: each change to a link (added, up or down,
// deleted), to an address (added), to a route (added, replaced, deleted,
// by twill or behind its back) or to a neighbour or FDB entry (added or
// changed, deleted; a write that changes nothing says nothing) reaches
// every watch subscribed at the time. Routes
// the kernel flushes with their link (down, or deleted) go without a
// word, as IPv4's do. Like the kernel's socket buffer, a watch's queue is
// bounded: a watch that falls behind by more than watchQueue events fails
// with ENOBUFS, and its caller subscribes again and reads the state.

const watchQueue = 256

// watcher is one subscription: one of its queues is made, the others are
// nil (never ready).
type watcher struct {
	links  chan nl.LinkEvent
	addrs  chan nl.AddrEvent
	routes chan nl.RouteEvent
	neighs chan nl.NeighEvent
	lost   chan struct{}
}

var _ interface {
	WatchLinks(ctx context.Context, subscribed func(), fn func(nl.LinkEvent)) error
	WatchAddrs(ctx context.Context, subscribed func(), fn func(nl.AddrEvent)) error
	nl.RouteWatcher
	RouteGet(dst netip.Addr) (nl.Route, error)
} = (*Kernel)(nil)

// WatchLinks calls subscribed, then fn for each link event, until ctx ends.
func (k *Kernel) WatchLinks(ctx context.Context, subscribed func(), fn func(nl.LinkEvent)) error {
	w := &watcher{links: make(chan nl.LinkEvent, watchQueue), lost: make(chan struct{})}
	return follow(ctx, k, w, w.links, subscribed, fn)
}

// WatchAddrs calls subscribed, then fn for each address event, until ctx
// ends.
func (k *Kernel) WatchAddrs(ctx context.Context, subscribed func(), fn func(nl.AddrEvent)) error {
	w := &watcher{addrs: make(chan nl.AddrEvent, watchQueue), lost: make(chan struct{})}
	return follow(ctx, k, w, w.addrs, subscribed, fn)
}

// WatchRoutes calls subscribed, then fn for each route event, until ctx
// ends.
func (k *Kernel) WatchRoutes(ctx context.Context, subscribed func(), fn func(nl.RouteEvent)) error {
	w := &watcher{routes: make(chan nl.RouteEvent, watchQueue), lost: make(chan struct{})}
	return follow(ctx, k, w, w.routes, subscribed, fn)
}

// WatchNeighs calls subscribed, then fn for each neighbour and FDB event,
// until ctx ends.
func (k *Kernel) WatchNeighs(ctx context.Context, subscribed func(), fn func(nl.NeighEvent)) error {
	w := &watcher{neighs: make(chan nl.NeighEvent, watchQueue), lost: make(chan struct{})}
	return follow(ctx, k, w, w.neighs, subscribed, fn)
}

// follow subscribes w and delivers the events of its queue q until ctx
// ends or the queue overflows.
func follow[E any](ctx context.Context, k *Kernel, w *watcher, q chan E, subscribed func(), fn func(E)) error {
	k.mu.Lock()
	k.initLocked()
	if k.watchers == nil {
		k.watchers = map[*watcher]struct{}{}
	}
	k.watchers[w] = struct{}{}
	k.mu.Unlock()
	defer func() {
		k.mu.Lock()
		delete(k.watchers, w)
		k.mu.Unlock()
	}()
	subscribed()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-w.lost:
			return fmt.Errorf("watching: %w", unix.ENOBUFS)
		case ev := <-q:
			fn(ev)
		}
	}
}

// emitLinkLocked queues a link event for every link watch.
func (k *Kernel) emitLinkLocked(ev nl.LinkEvent) {
	emit(k, func(w *watcher) chan nl.LinkEvent { return w.links }, ev)
}

// emitRouteLocked queues a route event for every route watch.
func (k *Kernel) emitRouteLocked(ev nl.RouteEvent) {
	emit(k, func(w *watcher) chan nl.RouteEvent { return w.routes }, ev)
}

// emitNeighLocked queues a neighbour or FDB event for every neighbour watch.
func (k *Kernel) emitNeighLocked(ev nl.NeighEvent) {
	emit(k, func(w *watcher) chan nl.NeighEvent { return w.neighs }, ev)
}

// emitAddrLocked queues an address event for every address watch.
func (k *Kernel) emitAddrLocked(ev nl.AddrEvent) {
	emit(k, func(w *watcher) chan nl.AddrEvent { return w.addrs }, ev)
}

// emit queues ev on the channel of every watch that has one; a watch whose
// queue is full has lost an event (ENOBUFS, as the kernel's socket would).
func emit[E any](k *Kernel, queue func(*watcher) chan E, ev E) {
	for w := range k.watchers {
		q := queue(w)
		if q == nil {
			continue
		}
		select {
		case q <- ev:
		default:
			closeOnce(w)
		}
	}
}

func closeOnce(w *watcher) {
	select {
	case <-w.lost:
	default:
		close(w.lost)
	}
}

// RouteGet is the route the kernel would take to dst: the longest prefix
// of the main table containing it, among twill's routes and the prefixes
// of the addresses on links that are up.
func (k *Kernel) RouteGet(dst netip.Addr) (nl.Route, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.initLocked()
	best, found := nl.Route{}, false
	consider := func(r nl.Route) {
		if r.Dst.Contains(dst) && (!found || r.Dst.Bits() > best.Dst.Bits()) {
			best, found = r, true
		}
	}
	for _, r := range k.routes {
		if r.Table == 0 || r.Table == 254 {
			consider(r)
		}
	}
	for _, l := range k.links {
		if !l.l.Up {
			continue
		}
		for _, p := range l.addrs {
			consider(nl.Route{Dst: p.Masked(), LinkIndex: l.l.Index, Scope: nl.ScopeLink})
		}
	}
	if !found {
		return nl.Route{}, fmt.Errorf("route to %s: %w", dst, unix.ENETUNREACH)
	}
	return best, nil
}
