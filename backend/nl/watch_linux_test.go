package nl

import (
	"context"
	"net/netip"
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
