package hostgw

import (
	"context"
	"io"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/twill-net/twill/backend"
	"github.com/twill-net/twill/backend/backendtest"
	"github.com/twill-net/twill/nl"
	"github.com/twill-net/twill/subnet"
	"github.com/twill-net/twill/testsupport/netnstest"
)

// node makes a namespace whose eth0 sits on 192.168.77.0/24 and returns a
// host-gw Network attached in it.
func node(t *testing.T) (string, *nl.Handle, *Network) {
	ns := netnstest.New(t, "hgw")
	netnstest.Uplink(t, ns, "192.168.77.1/24")
	h, err := nl.Open(ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	link, err := h.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := subnet.ParseConfig([]byte(`{"Network":"10.244.0.0/16","Backend":{"Type":"host-gw"}}`))
	if err != nil {
		t.Fatal(err)
	}
	ext := backend.ExternalInterface{Link: link, Addr: netip.MustParseAddr("192.168.77.1"), PublicIP: netip.MustParseAddr("192.168.77.1"),
		OnLink: []netip.Prefix{netip.MustParsePrefix("192.168.77.0/24")}}
	b, err := New(backend.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Netlink: h, ExtIface: ext, Config: cfg})
	if err != nil {
		t.Fatal(err)
	}
	nw, err := b.Attach(context.Background(), subnet.Lease{Subnet: netip.MustParsePrefix("10.244.1.0/24")})
	if err != nil {
		t.Fatal(err)
	}
	return ns, h, nw.Network.(*Network)
}

// kernelRoutes renders the main table's IPv4 routes as `ip route` does,
// so assertions read like what an operator would see.
func kernelRoutes(t *testing.T, ns string) string {
	return netnstest.IP(t, ns, "-4", "route", "show", "table", "main")
}

func requireRoutes(t *testing.T, ns string, present, absent []string) {
	t.Helper()
	got := kernelRoutes(t, ns)
	for _, p := range present {
		if !strings.Contains(got, p) {
			t.Errorf("route %q missing; table is:\n%s", p, got)
		}
	}
	for _, a := range absent {
		if strings.Contains(got, a) {
			t.Errorf("route %q present; table is:\n%s", a, got)
		}
	}
}

func TestPrivilegedReconcile(t *testing.T) {
	ns, _, nw := node(t)
	ctx := context.Background()
	// Left over from before a restart (owned, stale), owned but wrong, and
	// someone else's route in the same table.
	netnstest.IP(t, ns, "route", "add", "10.244.50.0/24", "via", "192.168.77.50", "proto", "167")
	netnstest.IP(t, ns, "route", "add", "10.244.3.0/24", "via", "192.168.77.33", "proto", "167")
	netnstest.IP(t, ns, "route", "add", "10.244.99.0/24", "via", "192.168.77.99", "proto", "static")

	peers := []subnet.Lease{peer("10.244.2.0/24", "192.168.77.2"), peer("10.244.3.0/24", "192.168.77.3"), peer("10.244.4.0/24", "172.16.0.4")}
	if err := nw.Reconcile(ctx, peers); err != nil {
		t.Fatal(err)
	}
	requireRoutes(t, ns,
		[]string{"10.244.2.0/24 via 192.168.77.2 dev eth0 proto 167", "10.244.3.0/24 via 192.168.77.3 dev eth0 proto 167", "10.244.99.0/24 via 192.168.77.99 dev eth0 proto static"},
		[]string{"10.244.50.0", "192.168.77.33", "10.244.4.0"})

	t.Run("idempotent", func(t *testing.T) {
		before := kernelRoutes(t, ns)
		nw.routes.Invalidate() // force a kernel read, not just the record
		if err := nw.Reconcile(ctx, peers); err != nil {
			t.Fatal(err)
		}
		if after := kernelRoutes(t, ns); after != before {
			t.Fatalf("second reconcile changed the table:\n%s\nto\n%s", before, after)
		}
	})
	t.Run("peer changes public IP", func(t *testing.T) {
		peers[0] = peer("10.244.2.0/24", "192.168.77.22")
		if err := nw.Reconcile(ctx, peers); err != nil {
			t.Fatal(err)
		}
		requireRoutes(t, ns, []string{"10.244.2.0/24 via 192.168.77.22"}, []string{"192.168.77.2 "})
	})
	t.Run("peer removed", func(t *testing.T) {
		if err := nw.Reconcile(ctx, peers[1:]); err != nil {
			t.Fatal(err)
		}
		requireRoutes(t, ns, []string{"10.244.3.0/24", "10.244.99.0/24"}, []string{"10.244.2.0/24"})
	})
	t.Run("foreign route holding a peer destination is left alone, and keeps precedence", func(t *testing.T) {
		netnstest.IP(t, ns, "route", "add", "10.244.5.0/24", "via", "192.168.77.55", "proto", "static")
		nw.routes.Invalidate() // what the route watcher does when the route appears
		withPeer := append(peers[1:], peer("10.244.5.0/24", "192.168.77.5"))
		if err := nw.Reconcile(ctx, withPeer); err != nil {
			t.Fatal(err)
		}
		requireRoutes(t, ns, []string{"10.244.5.0/24 via 192.168.77.55 dev eth0 proto static", "10.244.3.0/24 via 192.168.77.3"}, nil)
		if got := netnstest.IP(t, ns, "route", "get", "10.244.5.1"); !strings.Contains(got, "via 192.168.77.55") {
			t.Fatalf("traffic to the destination does not take the foreign route: %s", got)
		}
		if d, err := nw.Drift(ctx, withPeer); err != nil || len(d.Shadowed) != 1 || !strings.Contains(d.Shadowed[0], "10.244.5.0/24") {
			t.Fatalf("drift %+v (%v): want 10.244.5.0/24 shadowed", d, err)
		}
	})
}

func TestPrivilegedRepairsHandDeletedRoute(t *testing.T) {
	ns, _, nw := node(t)
	repairs := prometheus.NewCounter(prometheus.CounterOpts{Name: "repairs"})
	nw.metrics = &backend.Metrics{DriftRepairs: repairs}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	peers := []subnet.Lease{peer("10.244.2.0/24", "192.168.77.2")}
	if err := nw.Reconcile(ctx, peers); err != nil {
		t.Fatal(err)
	}
	// A route deleted before the watch subscribes is found once it has.
	netnstest.IP(t, ns, "route", "del", "10.244.2.0/24")
	pokes := make(chan struct{}, 1)
	watchErr := make(chan error, 1)
	watching := make(chan struct{})
	go func() {
		watchErr <- nw.WatchKernel(ctx, func() {
			select {
			case pokes <- struct{}{}:
			default:
			}
		}, sync.OnceFunc(func() { close(watching) }))
	}()
	repaired := func(want float64) {
		t.Helper()
		if err := nw.Reconcile(ctx, peers); err != nil {
			t.Fatal(err)
		}
		requireRoutes(t, ns, []string{"10.244.2.0/24 via 192.168.77.2 dev eth0 proto 167"}, nil)
		if got := testutil.ToFloat64(repairs); got != want {
			t.Errorf("drift repairs metric %v, want %v", got, want)
		}
	}
	select {
	case <-watching:
	case <-time.After(5 * time.Second):
		t.Fatal("the watch did not say it was watching within 5s")
	}
	// It says so after its first check, which has poked already.
	select {
	case <-pokes:
	default:
		t.Fatal("no poke once watching, though a twill route went before")
	}
	repaired(1)
	// Subscribed now: a route deleted by hand comes as an event.
	netnstest.IP(t, ns, "route", "del", "10.244.2.0/24")
	select {
	case <-pokes:
	case <-time.After(5 * time.Second):
		t.Fatal("no poke within 5s of deleting a twill route by hand")
	}
	repaired(2)
	// A lease change is not drift.
	if err := nw.Reconcile(ctx, append(peers, peer("10.244.3.0/24", "192.168.77.3"))); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(repairs); got != 2 {
		t.Errorf("drift repairs metric %v after a lease change, want still 2", got)
	}
	// A foreign route change is not twill's business: no poke.
	netnstest.IP(t, ns, "route", "add", "10.244.99.0/24", "via", "192.168.77.99")
	select {
	case <-pokes:
		t.Fatal("poked for a route twill does not own")
	case <-time.After(300 * time.Millisecond):
	}
	cancel()
	if err := <-watchErr; err != nil {
		t.Fatal(err)
	}
}

// benchNetwork programs n peers in a fresh namespace and returns the
// Network and the peers.
func benchNetwork(b *testing.B, n int) (*Network, []subnet.Lease) {
	ns := netnstest.New(b, "hgwb")
	netnstest.Uplink(b, ns, "192.168.0.1/16")
	h, err := nl.Open(ns)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(h.Close)
	link, err := h.LinkByName("eth0")
	if err != nil {
		b.Fatal(err)
	}
	ext := backend.ExternalInterface{Link: link, Addr: netip.MustParseAddr("192.168.0.1"), PublicIP: netip.MustParseAddr("192.168.0.1"),
		OnLink: []netip.Prefix{netip.MustParsePrefix("192.168.0.0/16")}}
	_, _, bnw := backendtest.Attach(b, New, backendtest.Options(b, `{"Network":"100.64.0.0/10","Backend":{"Type":"host-gw"}}`, h, ext), "100.64.0.0/24")
	nw := bnw.Network.(*Network)
	peers := make([]subnet.Lease, n)
	for i := range peers {
		dst := netip.PrefixFrom(subnet.NthSubnet(netip.MustParseAddr("100.64.0.0"), uint64(i+1), 24), 24)
		peers[i] = subnet.Lease{Subnet: dst, Attrs: subnet.LeaseAttrs{PublicIP: netip.AddrFrom4([4]byte{192, 168, byte(1 + i/250), byte(1 + i%250)})}}
	}
	if err := nw.Reconcile(context.Background(), peers); err != nil {
		b.Fatal(err)
	}
	return nw, peers
}

// BenchmarkResyncNoChange5000 is the periodic full resync with nothing to
// do: read 5,000 owned routes back from the kernel and diff them.
func BenchmarkResyncNoChange5000(b *testing.B) {
	nw, peers := benchNetwork(b, 5000)
	b.ResetTimer()
	for range b.N {
		nw.routes.Invalidate()
		if err := nw.Reconcile(context.Background(), peers); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkReconcileOnEvent5000 is what a lease event costs with 5,000
// peers programmed and the kernel record trusted: no dump, a diff, no
// kernel change.
func BenchmarkReconcileOnEvent5000(b *testing.B) {
	nw, peers := benchNetwork(b, 5000)
	b.ResetTimer()
	for range b.N {
		if err := nw.Reconcile(context.Background(), peers); err != nil {
			b.Fatal(err)
		}
	}
}
