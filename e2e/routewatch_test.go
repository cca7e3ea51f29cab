package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twill-net/twill/nl"
	"github.com/twill-net/twill/testsupport/netnstest"
)

// routeWatch follows twill's routes (proto 167, main table) in one
// namespace through the kernel's route events, so a benchmark can time
// when a route appears or goes without polling. Events are a fast path,
// not the truth: when the subscription breaks (ENOBUFS under a burst of
// thousands of changes) it subscribes again and reads the kernel once, so
// what it holds is current again; only when that fails too, or a wait
// runs out, is the kernel read at every poll. A lost event never reads as
// a missing route, and a broken subscription never turns every later wait
// into a dump of the whole table (at 50,000 routes one takes tens of
// milliseconds: add and change samples read as 55-60 ms while deletes,
// which the stale record already lacked, read as etcd's put alone).
type routeWatch struct {
	tb      testing.TB
	ns      string
	h       *nl.Handle
	changed chan struct{}

	stop func() // ends the subscription; safe to call again

	mu      sync.Mutex
	present map[netip.Prefix]netip.Addr // guarded by mu; from events: destination -> gateway
	err     error                       // guarded by mu; why the subscription ended
	lost    int                         // guarded by mu; how often it broke and was renewed
}

// maxResubscribes bounds how often a broken subscription is renewed.
const maxResubscribes = 20

// watchRoutes subscribes to ns's route events and returns once the
// subscription is in place; it fails the test if that cannot happen.
func watchRoutes(tb testing.TB, ns string) *routeWatch {
	tb.Helper()
	h, err := nl.Open(ns)
	if err != nil {
		tb.Fatal(err)
	}
	w := &routeWatch{tb: tb, ns: ns, h: h, changed: make(chan struct{}, 1), present: map[netip.Prefix]netip.Addr{}}
	ctx, cancel := context.WithCancel(context.Background())
	subscribed, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		err := h.WatchRoutes(ctx, func() { close(subscribed) }, w.observe)
		for range maxResubscribes {
			if ctx.Err() != nil {
				return
			}
			w.mu.Lock()
			w.lost++
			w.mu.Unlock()
			// Events were lost: once subscribed again, read the kernel
			// (events queued meanwhile are newer than the subscription
			// and apply on top).
			err = h.WatchRoutes(ctx, w.resync, w.observe)
		}
		if err == nil && ctx.Err() == nil {
			err = errors.New("subscription ended")
		}
		w.mu.Lock()
		w.err = err
		w.mu.Unlock()
		w.signal()
	}()
	w.stop = sync.OnceFunc(func() { cancel(); <-done; h.Close() })
	tb.Cleanup(w.stop)
	select {
	case <-subscribed:
	case <-done:
		tb.Fatalf("subscribing to route events in %s: %v", ns, w.broken())
	case <-time.After(10 * time.Second):
		tb.Fatalf("subscribing to route events in %s: not in place after 10s", ns)
	}
	return w
}

func (w *routeWatch) observe(ev nl.RouteEvent) {
	if ev.NonUnicast || ev.Route.Protocol != nl.RouteProtocol || ev.Route.Key().Table != nl.MainTable {
		return
	}
	w.mu.Lock()
	if ev.Deleted {
		delete(w.present, ev.Route.Dst)
	} else {
		w.present[ev.Route.Dst] = ev.Route.Gw
	}
	w.mu.Unlock()
	w.signal()
}

// resync replaces what the watch holds with the kernel's routes.
func (w *routeWatch) resync() {
	k, err := w.kernel()
	w.mu.Lock()
	if err == nil {
		w.present = k
	} else {
		// What it holds is stale: waits read the kernel from now on.
		w.err = fmt.Errorf("reading the kernel after a lost subscription: %w", err)
	}
	w.mu.Unlock()
	w.signal()
}

// losses is how often the subscription broke and was renewed.
func (w *routeWatch) losses() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.lost
}

func (w *routeWatch) signal() {
	select {
	case w.changed <- struct{}{}:
	default:
	}
}

func (w *routeWatch) broken() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// kernel reads twill's routes in the main table.
func (w *routeWatch) kernel() (map[netip.Prefix]netip.Addr, error) {
	rs, err := w.h.Routes(nl.FamilyAll, nl.RouteFilter{Protocol: nl.RouteProtocol})
	if err != nil {
		return nil, err
	}
	m := make(map[netip.Prefix]netip.Addr, len(rs))
	for _, r := range rs {
		m[r.Dst] = r.Gw
	}
	return m, nil
}

// wait blocks until cond holds over the routes present, or timeout. It
// returns an error saying what was last seen when cond never held, read
// from the kernel itself.
func (w *routeWatch) wait(timeout time.Duration, what string, cond func(present map[netip.Prefix]netip.Addr) bool) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	poll := time.NewTicker(20 * time.Millisecond)
	defer poll.Stop()
	warned := false
	for {
		w.mu.Lock()
		ok, err := cond(w.present), w.err
		w.mu.Unlock()
		if ok {
			return nil
		}
		if err != nil {
			// Without events, read the kernel at every poll.
			if !warned {
				w.tb.Logf("route events in %s lost (%v); reading the kernel instead", w.ns, err)
				warned = true
			}
			if k, kerr := w.kernel(); kerr == nil && cond(k) {
				return nil
			}
		}
		select {
		case <-w.changed:
		case <-poll.C:
		case <-deadline.C:
			k, kerr := w.kernel()
			if kerr != nil {
				return fmt.Errorf("%s: not seen within %s, and reading the kernel failed: %w", what, timeout, kerr)
			}
			if cond(k) {
				w.tb.Logf("%s: the kernel has it, but its route events never arrived (subscription: %v)", what, w.broken())
				return nil
			}
			return fmt.Errorf("%s: not within %s (the kernel holds %d twill routes)", what, timeout, len(k))
		}
	}
}

// waitCount waits until at least n twill routes are present.
func (w *routeWatch) waitCount(n int, timeout time.Duration) error {
	return w.wait(timeout, fmt.Sprintf("%d twill routes", n), func(p map[netip.Prefix]netip.Addr) bool { return len(p) >= n })
}

// waitRoute waits until the route to dst is present (or, with deleted,
// gone), failing the benchmark after 10s.
func (w *routeWatch) waitRoute(dst netip.Prefix, deleted bool) {
	w.tb.Helper()
	what := fmt.Sprintf("route %s present", dst)
	if deleted {
		what = fmt.Sprintf("route %s gone", dst)
	}
	if err := w.wait(10*time.Second, what, func(p map[netip.Prefix]netip.Addr) bool { _, ok := p[dst]; return ok != deleted }); err != nil {
		w.tb.Fatal(err)
	}
}

// waitGateway waits until the route to dst goes via gw, failing the
// benchmark after 10s.
func (w *routeWatch) waitGateway(dst netip.Prefix, gw netip.Addr) {
	w.tb.Helper()
	if err := w.wait(10*time.Second, fmt.Sprintf("route %s via %s", dst, gw), func(p map[netip.Prefix]netip.Addr) bool { return p[dst] == gw }); err != nil {
		w.tb.Fatal(err)
	}
}

// TestRouteWatchRenewsALostSubscription: when the kernel drops the watch's
// events (its socket's buffer overflows while the reader is held up), the
// watch subscribes again and reads the kernel, instead of falling back to
// a dump of the whole table at every later wait; what it holds afterwards
// is the kernel's routes, and events keep it current.
func TestRouteWatchRenewsALostSubscription(t *testing.T) {
	beside(t)
	name := netnstest.New(t, "rw")
	netnstest.IP(t, name, "link", "add", "d0", "type", "veth", "peer", "name", "d1")
	netnstest.IP(t, name, "link", "set", "d0", "up")
	netnstest.IP(t, name, "link", "set", "d1", "up")
	w := watchRoutes(t, name)
	const n = 40000 // far over what the 8 MiB socket buffer holds
	var batch strings.Builder
	for i := range n {
		fmt.Fprintf(&batch, "route add 10.%d.%d.0/24 dev d0 proto %d\n", 64+i/256, i%256, nl.RouteProtocol)
	}
	file := filepath.Join(t.TempDir(), "routes")
	if err := os.WriteFile(file, []byte(batch.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	w.mu.Lock() // the reader stalls in observe: the kernel drops events
	out, err := exec.Command("ip", "-n", name, "-batch", file).CombinedOutput()
	w.mu.Unlock()
	if err != nil {
		t.Fatalf("ip -batch: %v: %s", err, out)
	}
	waitFor(t, 30*time.Second, "the watch renewing its subscription", func() bool { return w.losses() > 0 })
	if err := w.waitCount(n, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := w.broken(); err != nil {
		t.Fatalf("after %d losses the watch reads the kernel at every wait: %v", w.losses(), err)
	}
	dst := netip.MustParsePrefix("10.250.0.0/24")
	netnstest.IP(t, name, "route", "add", dst.String(), "dev", "d0", "proto", strconv.Itoa(nl.RouteProtocol))
	w.waitRoute(dst, false)
	if err := w.broken(); err != nil {
		t.Fatalf("the renewed subscription broke: %v", err)
	}
	t.Logf("the subscription broke %d times and was renewed", w.losses())
}
