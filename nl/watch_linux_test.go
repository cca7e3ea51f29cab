package nl

import (
	"context"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/twill-net/twill/testsupport/netnstest"
)

// TestWatchRoutes subscribes to a namespace's route events, changes routes
// there with ip(8), and checks each change arrives as the route the dump
// decoder reads (default routes left out, blackholes marked as not
// unicast, one replacing a unicast route included), a burst of thousands
// included; cancelling the context ends the watch.
func TestWatchRoutes(t *testing.T) {
	netnstest.RequireRoot(t)
	ns := netnstest.New(t, "watch")
	netnstest.Uplink(t, ns, "192.168.0.1/16")
	netnstest.IP(t, ns, "-6", "addr", "add", "fd00::1/64", "dev", "eth0", "nodad")
	// The kernel adds the address's local route (in table local) from a
	// work queue, after ip has returned: on a busy machine, after the
	// watch below subscribed (a fresh machine's make test, 2026-11-29).
	for deadline := time.Now().Add(10 * time.Second); netnstest.IP(t, ns, "-6", "route", "show", "table", "local", "fd00::1/128") == ""; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no local route for fd00::1 within 10 s")
		}
	}
	h := openNS(t, ns)
	events, stop := watching(t, h.WatchRoutes, func(RouteEvent) bool { return true })
	for _, args := range [][]string{
		{"route", "add", "default", "via", "192.168.0.254"},
		{"route", "add", "blackhole", "10.7.0.0/24"},
		{"route", "add", "10.1.0.0/24", "via", "192.168.1.1", "proto", "167", "metric", "1048832"},
		{"route", "add", "10.4.0.0/24", "via", "192.168.1.4", "table", "100", "proto", "167"},
		{"-6", "route", "add", "fd00:10:1::/64", "via", "fd00::11", "proto", "167", "metric", "7"},
		{"route", "del", "10.1.0.0/24", "via", "192.168.1.1", "proto", "167", "metric", "1048832"},
		{"route", "replace", "blackhole", "10.4.0.0/24", "table", "100", "proto", "167"},
	} {
		netnstest.IP(t, ns, args...)
	}
	eth := linkNamed(t, h, "eth0")
	want := []RouteEvent{
		{NonUnicast: true, Route: Route{Dst: netip.MustParsePrefix("10.7.0.0/24"), Table: 254, Protocol: 3}},
		{Route: Route{Dst: netip.MustParsePrefix("10.1.0.0/24"), Gw: netip.MustParseAddr("192.168.1.1"), LinkIndex: eth.Index, Table: 254, Protocol: 167, Priority: 1048832}},
		{Route: Route{Dst: netip.MustParsePrefix("10.4.0.0/24"), Gw: netip.MustParseAddr("192.168.1.4"), LinkIndex: eth.Index, Table: 100, Protocol: 167}},
		{Route: Route{Dst: netip.MustParsePrefix("fd00:10:1::/64"), Gw: netip.MustParseAddr("fd00::11"), LinkIndex: eth.Index, Table: 254, Protocol: 167, Priority: 7}},
		{Deleted: true, Route: Route{Dst: netip.MustParsePrefix("10.1.0.0/24"), Gw: netip.MustParseAddr("192.168.1.1"), LinkIndex: eth.Index, Table: 254, Protocol: 167, Priority: 1048832}},
		// A blackhole of twill's protocol is decoded as one (twill makes
		// them: the wireguard backend's fail-closed routes); anyone else's
		// is marked, above.
		{Route: Route{Dst: netip.MustParsePrefix("10.4.0.0/24"), Table: 100, Protocol: 167, Type: RouteBlackhole}},
	}
	seen := func(n int) []RouteEvent {
		deadline := time.Now().Add(10 * time.Second)
		for {
			got := events()
			if len(got) >= n || time.Now().After(deadline) {
				return got
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	got := seen(len(want))
	if len(got) != len(want) {
		t.Fatalf("events %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("event %d: %+v, want %+v", i, got[i], want[i])
		}
	}
	// A burst: every route of a 5,000-route batch arrives.
	openWithRoutes(t, ns, 20, 5000)
	if got := seen(len(want) + 5000); len(got) != len(want)+5000 {
		t.Fatalf("%d events after a burst of 5,000 routes, want %d", len(got), len(want)+5000)
	}
	stop()
}

// TestWatchNeighs checks neighbour and FDB events as the kernel sends them:
// twill's kind of entry added and deleted, one the kernel owns (not
// permanent), and the FDB flag.
func TestWatchNeighs(t *testing.T) {
	netnstest.RequireRoot(t)
	ns := vxlanNS(t, "watchn")
	h := openNS(t, ns)
	vx := linkNamed(t, h, "twill.1")
	// eth0's own neighbours, if any, are left out.
	events, stop := watching(t, h.WatchNeighs, func(ev NeighEvent) bool { return ev.Neigh.LinkIndex == vx.Index })
	mac := []byte{0x0a, 0xb0, 0, 0, 0, 1}
	neigh := Neigh{LinkIndex: vx.Index, IP: netip.MustParseAddr("10.244.1.0"), HardwareAddr: mac, Permanent: true}
	fdb := Neigh{LinkIndex: vx.Index, IP: netip.MustParseAddr("192.168.1.1"), HardwareAddr: mac, Permanent: true}
	apply := func(op Op) {
		for _, err := range h.NeighBatch([]NeighOp{{Op: op, Neigh: neigh}, {Op: op, FDB: true, Neigh: fdb}}) {
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	apply(OpReplace)
	apply(OpDel)
	netnstest.IP(t, ns, "neigh", "add", "10.244.9.0", "lladdr", "0a:b0:00:00:00:09", "dev", "twill.1", "nud", "reachable")
	kernels := Neigh{LinkIndex: vx.Index, IP: netip.MustParseAddr("10.244.9.0"), HardwareAddr: []byte{0x0a, 0xb0, 0, 0, 0, 9}}
	same := func(a, b NeighEvent) bool {
		return a.Deleted == b.Deleted && a.FDB == b.FDB && sameNeigh(a.Neigh, b.Neigh)
	}
	// In order: the two adds; the neighbour's deletion (the kernel first
	// marks the entry failed, then deletes it, and reports it without its
	// address or state: only the IP says which it was); the FDB entry's
	// deletion, whole; the kernel's own entry.
	steps := []struct {
		what string
		ok   func(NeighEvent) bool
	}{
		{"the neighbour added", func(ev NeighEvent) bool { return same(ev, NeighEvent{Neigh: neigh}) }},
		{"the FDB entry added", func(ev NeighEvent) bool { return same(ev, NeighEvent{FDB: true, Neigh: fdb}) }},
		{"the neighbour deleted", func(ev NeighEvent) bool { return ev.Deleted && !ev.FDB && ev.Neigh.IP == neigh.IP }},
		{"the FDB entry deleted", func(ev NeighEvent) bool { return same(ev, NeighEvent{Deleted: true, FDB: true, Neigh: fdb}) }},
		{"the kernel's entry added", func(ev NeighEvent) bool { return same(ev, NeighEvent{Neigh: kernels}) }},
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := events()
		step := 0
		for _, ev := range got {
			if step < len(steps) && steps[step].ok(ev) {
				step++
			}
		}
		if step == len(steps) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("events %+v: no %s after the steps before it", got, steps[step].what)
		}
		time.Sleep(10 * time.Millisecond)
	}
	stop()
}

// watching runs watch in the background, keeping the events keep accepts,
// and returns once it has subscribed: events returns those seen so far,
// stop cancels the watch and fails the test unless it ends cleanly within
// 10 s.
func watching[E any](t *testing.T, watch func(ctx context.Context, subscribed func(), fn func(E)) error, keep func(E) bool) (events func() []E, stop func()) {
	t.Helper()
	var (
		mu   sync.Mutex
		seen []E
	)
	ctx, cancel := context.WithCancel(context.Background())
	subscribed, done := make(chan struct{}), make(chan error, 1)
	go func() {
		done <- watch(ctx, func() { close(subscribed) }, func(ev E) {
			if keep(ev) {
				mu.Lock()
				seen = append(seen, ev)
				mu.Unlock()
			}
		})
	}()
	select {
	case <-subscribed:
	case err := <-done:
		cancel()
		t.Fatalf("watch ended before subscribing: %v", err)
	}
	events = func() []E {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(seen)
	}
	stop = func() {
		t.Helper()
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("watch ended with %v after its context was cancelled", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("watch still running 10s after its context was cancelled")
		}
	}
	return events, stop
}
