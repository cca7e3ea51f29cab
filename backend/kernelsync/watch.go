package kernelsync

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twill-net/twill/backend"
	"github.com/twill-net/twill/nl"
)

// AllChecked returns one callback for each of n watches, to call after
// every check it makes once (re)subscribed; done is called once, when each
// of the n has been called at least once.
func AllChecked(n int, done func()) []func() {
	if n == 0 {
		done()
		return nil
	}
	var left atomic.Int32
	left.Store(int32(n))
	out := make([]func(), n)
	for i := range out {
		var once sync.Once
		out[i] = func() {
			once.Do(func() {
				if left.Add(-1) == 0 {
					done()
				}
			})
		}
	}
	return out
}

// RouteDrift compares desired routes with the kernel's owned routes in
// table (0: main), through the same engine (and so the same comparison)
// as RouteSync, which it leaves alone: the set is a fresh one, read from
// the kernel, and nothing is applied. Devices are named when h can list
// links.
func RouteDrift(h nl.RouteTable, table int, desired []nl.Route) (backend.Drift, error) {
	foreign := &foreignRoutes{dsts: map[netip.Prefix]int{}}
	set := &ownedSet[nl.Key, nl.Route]{kind: routeKind{nl: h, table: tableOrMain(table), foreign: foreign}}
	c, err := set.plan(func(emit func(nl.Route)) {
		for _, r := range desired {
			emit(r)
		}
	})
	if err != nil {
		return backend.Drift{}, err
	}
	d := backend.Drift{Objects: len(desired)}
	dsts := make(map[netip.Prefix]bool, len(set.desired))
	for _, e := range set.desired {
		dsts[e.v.Dst] = true
	}
	for _, dst := range foreign.among(func(p netip.Prefix) bool { return dsts[p] }) {
		d.Shadowed = append(d.Shadowed, dst.String()+": a route twill does not own holds it too, and takes precedence")
	}
	slices.Sort(d.Shadowed)
	names := map[int]string{}
	if lh, ok := h.(interface{ Links() ([]nl.Link, error) }); ok {
		if links, err := lh.Links(); err == nil {
			for _, l := range links {
				names[l.Index] = l.Name
			}
		}
	}
	show := func(rs []nl.Route) []string {
		slices.SortFunc(rs, func(a, b nl.Route) int { return compareKeys(a.Key(), b.Key()) })
		var out []string
		for _, r := range rs {
			s := r.String()
			if n, ok := names[r.LinkIndex]; ok {
				s = strings.Replace(s, fmt.Sprintf("dev#%d", r.LinkIndex), "dev "+n, 1)
			}
			out = append(out, "route "+s)
		}
		return out
	}
	d.Missing, d.Wrong, d.Extra = show(c.add), show(c.replace), show(c.delete)
	return d, nil
}

// compareKeys orders route keys by table, address and prefix length.
func compareKeys(a, b nl.Key) int {
	if a.Table != b.Table {
		return cmp.Compare(a.Table, b.Table)
	}
	if c := bytes.Compare(a.Addr[:], b.Addr[:]); c != 0 {
		return c
	}
	return cmp.Compare(a.Bits, b.Bits)
}

// watchRecord is a sync's Watch: it follows the kernel's events through
// subscribe and pokes when observe says one contradicts the record; every
// (re)subscription verifies the record against the kernel, pokes if they
// differ, then calls checked. following is told true once the record is
// verified under a live subscription, false when the subscription ends.
// A nil subscribe (the kernel cannot be watched) calls checked at once
// and waits for ctx.
func watchRecord[E any](ctx context.Context, log *slog.Logger, what string, subscribe func(context.Context, func(), func(E)) error, verify func() bool, observe func(E) bool, following func(bool), poke, checked func()) error {
	if subscribe == nil {
		checked()
		<-ctx.Done()
		return nil
	}
	return WatchLoop(ctx, log, what, func() {
		if verify() {
			log.Debug("twill's " + what + " entries changed before the watch began; syncing them")
			poke()
		}
		following(true)
		checked()
	}, func(ctx context.Context, subscribed func()) error {
		defer following(false)
		return subscribe(ctx, subscribed, func(ev E) {
			if observe(ev) {
				poke()
			}
		})
	})
}

// WatchLoop keeps a kernel subscription alive until ctx is done. watch
// subscribes, calls its second argument once subscribed, and blocks; resync
// is that argument, so every (re)subscription triggers a re-read, since
// events before it were not seen. A lost subscription is retried after a
// second.
func WatchLoop(ctx context.Context, log *slog.Logger, what string, resync func(), watch func(ctx context.Context, subscribed func()) error) error {
	for {
		err := watch(ctx, resync)
		if ctx.Err() != nil {
			return nil
		}
		log.Warn(what+" watch lost; resubscribing", "err", err)
		t := time.NewTimer(time.Second)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}
