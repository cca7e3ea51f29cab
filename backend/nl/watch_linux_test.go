package nl

import (
	"context"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/twill-net/twill/internal/netnstest"
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
	h, err := Open(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	var (
		mu     sync.Mutex
		events []RouteEvent
	)
	ctx, cancel := context.WithCancel(context.Background())
	subscribed, done := make(chan struct{}), make(chan error, 1)
	go func() {
		done <- h.WatchRoutes(ctx, func() { close(subscribed) }, func(ev RouteEvent) {
			mu.Lock()
			events = append(events, ev)
			mu.Unlock()
		})
	}()
	select {
	case <-subscribed:
	case err := <-done:
		t.Fatalf("watch ended before subscribing: %v", err)
	}
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
	eth, err := h.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	want := []RouteEvent{
		{NonUnicast: true, Route: Route{Dst: netip.MustParsePrefix("10.7.0.0/24"), Table: 254, Protocol: 3}},
		{Route: Route{Dst: netip.MustParsePrefix("10.1.0.0/24"), Gw: netip.MustParseAddr("192.168.1.1"), LinkIndex: eth.Index, Table: 254, Protocol: 167, Priority: 1048832}},
		{Route: Route{Dst: netip.MustParsePrefix("10.4.0.0/24"), Gw: netip.MustParseAddr("192.168.1.4"), LinkIndex: eth.Index, Table: 100, Protocol: 167}},
		{Route: Route{Dst: netip.MustParsePrefix("fd00:10:1::/64"), Gw: netip.MustParseAddr("fd00::11"), LinkIndex: eth.Index, Table: 254, Protocol: 167, Priority: 7}},
		{Deleted: true, Route: Route{Dst: netip.MustParsePrefix("10.1.0.0/24"), Gw: netip.MustParseAddr("192.168.1.1"), LinkIndex: eth.Index, Table: 254, Protocol: 167, Priority: 1048832}},
		{NonUnicast: true, Route: Route{Dst: netip.MustParsePrefix("10.4.0.0/24"), Table: 100, Protocol: 167}},
	}
	seen := func(n int) []RouteEvent {
		deadline := time.Now().Add(10 * time.Second)
		for {
			mu.Lock()
			got := append([]RouteEvent(nil), events...)
			mu.Unlock()
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

// TestWatchNeighs checks neighbour and FDB events as the kernel sends them:
// twill's kind of entry added and deleted, one the kernel owns (not
// permanent), and the FDB flag.
func TestWatchNeighs(t *testing.T) {
	netnstest.RequireRoot(t)
	ns := netnstest.New(t, "watchn")
	netnstest.Uplink(t, ns, "192.168.0.1/16")
	netnstest.IP(t, ns, "link", "add", "twill.1", "type", "vxlan", "id", "1", "dev", "eth0", "local", "192.168.0.1", "dstport", "8472", "nolearning")
	h, err := Open(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	vx, err := h.LinkByName("twill.1")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu     sync.Mutex
		events []NeighEvent
	)
	ctx, cancel := context.WithCancel(context.Background())
	subscribed, done := make(chan struct{}), make(chan error, 1)
	go func() {
		done <- h.WatchNeighs(ctx, func() { close(subscribed) }, func(ev NeighEvent) {
			if ev.Neigh.LinkIndex != vx.Index {
				return // eth0's own neighbours, if any
			}
			mu.Lock()
			events = append(events, ev)
			mu.Unlock()
		})
	}()
	select {
	case <-subscribed:
	case err := <-done:
		t.Fatalf("watch ended before subscribing: %v", err)
	}
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
		return a.Deleted == b.Deleted && a.FDB == b.FDB && a.Neigh.LinkIndex == b.Neigh.LinkIndex && a.Neigh.IP == b.Neigh.IP &&
			slices.Equal(a.Neigh.HardwareAddr, b.Neigh.HardwareAddr) && a.Neigh.Permanent == b.Neigh.Permanent
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
		mu.Lock()
		got := append([]NeighEvent(nil), events...)
		mu.Unlock()
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
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("watch ended with %v after its context was cancelled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("watch did not end within 10s of its context being cancelled")
	}
}
