package vxlan

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twill-net/twill/backend"
	"github.com/twill-net/twill/backend/backendtest"
	"github.com/twill-net/twill/nl"
	"github.com/twill-net/twill/subnet"
	"github.com/twill-net/twill/testsupport/netnstest"
)

type vnode struct {
	ns    string
	h     *nl.Handle
	b     *Backend
	nw    *Network
	state string
}

func newVNode(t *testing.T) *vnode { return newVNodeB(t) }

func newVNodeB(t testing.TB) *vnode {
	ns := netnstest.New(t, "vx")
	netnstest.Uplink(t, ns, "192.168.1.1/24")
	netnstest.IP(t, ns, "link", "set", "eth0", "address", "02:00:00:00:00:01")
	h, err := nl.Open(ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	v := &vnode{ns: ns, h: h, state: t.TempDir()}
	v.start(t)
	return v
}

// start builds the backend as a (re)starting daemon would.
func (v *vnode) start(t testing.TB) {
	link, err := v.h.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	opts := backendtest.Options(t, `{"Network":"10.244.0.0/16"}`, v.h, backend.ExternalInterface{Link: link,
		Addr: netip.MustParseAddr("192.168.1.1"), PublicIP: netip.MustParseAddr("192.168.1.1"), OnLink: []netip.Prefix{netip.MustParsePrefix("192.168.1.0/24")}})
	opts.StateDir = v.state
	b, _, nw := backendtest.Attach(t, New, opts, "10.244.1.0/24")
	v.b, v.nw = b.(*Backend), nw.Network.(*Network)
}

func (v *vnode) show(t *testing.T, args ...string) string {
	out, err := netnstest.Exec(v.ns, args[0], args[1:]...)
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	return out
}

func requireAll(t *testing.T, what, got string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(got, w) {
			t.Errorf("%s lacks %q:\n%s", what, w, got)
		}
	}
}

func TestPrivilegedDeviceAndPeers(t *testing.T) {
	v := newVNode(t)
	ctx := context.Background()
	dev := v.show(t, "ip", "-d", "link", "show", "twill.1")
	requireAll(t, "twill.1", dev, "mtu 1450", "vxlan id 1", "local 192.168.1.1", "dev eth0", "dstport 8472", "nolearning")
	mac := net.HardwareAddr(v.b.dev.HardwareAddr).String()

	peers := []subnet.Lease{lease("10.244.2.0/24", "10.0.0.2", "0a:00:00:00:00:02"), lease("10.244.3.0/24", "10.0.0.3", "0a:00:00:00:00:03")}
	if err := v.nw.Reconcile(ctx, peers); err != nil {
		t.Fatal(err)
	}
	requireAll(t, "addresses", v.show(t, "ip", "addr", "show", "twill.1"), "inet 10.244.1.0/32")
	requireAll(t, "neighbours", v.show(t, "ip", "neigh", "show", "dev", "twill.1"),
		"10.244.2.0 lladdr 0a:00:00:00:00:02 PERMANENT", "10.244.3.0 lladdr 0a:00:00:00:00:03 PERMANENT")
	requireAll(t, "fdb", v.show(t, "bridge", "fdb", "show", "dev", "twill.1"),
		"0a:00:00:00:00:02 dst 10.0.0.2 self permanent", "0a:00:00:00:00:03 dst 10.0.0.3 self permanent")
	requireAll(t, "routes", v.show(t, "ip", "route"),
		"10.244.2.0/24 via 10.244.2.0 dev twill.1 proto 167", "10.244.3.0/24 via 10.244.3.0 dev twill.1 proto 167")

	t.Run("peer changes VTEP MAC and public IP", func(t *testing.T) {
		peers[0] = lease("10.244.2.0/24", "10.0.0.22", "0a:00:00:00:00:22")
		if err := v.nw.Reconcile(ctx, peers); err != nil {
			t.Fatal(err)
		}
		fdb := v.show(t, "bridge", "fdb", "show", "dev", "twill.1")
		if strings.Contains(fdb, "0a:00:00:00:00:02") || strings.Count(fdb, "dst 10.0.0.22") != 1 {
			t.Fatalf("want exactly one FDB entry for the peer, with its new MAC:\n%s", fdb)
		}
		requireAll(t, "neighbours", v.show(t, "ip", "neigh", "show", "dev", "twill.1"), "10.244.2.0 lladdr 0a:00:00:00:00:22 PERMANENT")
	})
	t.Run("peer removed", func(t *testing.T) {
		if err := v.nw.Reconcile(ctx, peers[1:]); err != nil {
			t.Fatal(err)
		}
		all := v.show(t, "bridge", "fdb", "show", "dev", "twill.1") + v.show(t, "ip", "neigh", "show", "dev", "twill.1") + v.show(t, "ip", "route")
		if strings.Contains(all, "10.244.2.0") || strings.Contains(all, "0a:00:00:00:00:22") {
			t.Fatalf("the removed peer left entries:\n%s", all)
		}
	})
	t.Run("device deleted by hand comes back with the same MAC and every peer", func(t *testing.T) {
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		pokes := make(chan struct{}, 1)
		watching := make(chan struct{})
		go func() {
			_ = v.nw.WatchKernel(wctx, func() {
				select {
				case pokes <- struct{}{}:
				default:
				}
			}, sync.OnceFunc(func() { close(watching) }))
		}()
		// Whether the link watch subscribes before the deletion (an event)
		// or after (the device is not as left), it pokes.
		netnstest.IP(t, v.ns, "link", "del", "twill.1")
		select {
		case <-pokes:
		case <-time.After(5 * time.Second):
			t.Fatal("no poke after the VTEP device was deleted")
		}
		select {
		case <-watching: // all four watches (routes, neighbours, FDB, link) checked
		case <-time.After(5 * time.Second):
			t.Fatal("the watches did not say they were watching within 5s")
		}
		if err := v.nw.Reconcile(ctx, peers[1:]); err != nil {
			t.Fatal(err)
		}
		requireAll(t, "twill.1", v.show(t, "ip", "-d", "link", "show", "twill.1"), mac, "vxlan id 1")
		requireAll(t, "fdb", v.show(t, "bridge", "fdb", "show", "dev", "twill.1"), "0a:00:00:00:00:03 dst 10.0.0.3 self permanent")
		requireAll(t, "neighbours", v.show(t, "ip", "neigh", "show", "dev", "twill.1"), "10.244.3.0 lladdr 0a:00:00:00:00:03 PERMANENT")
		requireAll(t, "routes", v.show(t, "ip", "route"), "10.244.3.0/24 via 10.244.3.0 dev twill.1 proto 167")
	})
	t.Run("altered device is re-created", func(t *testing.T) {
		netnstest.IP(t, v.ns, "link", "set", "twill.1", "mtu", "1300")
		if err := v.nw.Reconcile(ctx, peers[1:]); err != nil {
			t.Fatal(err)
		}
		requireAll(t, "twill.1", v.show(t, "ip", "-d", "link", "show", "twill.1"), "mtu 1450", mac)
		requireAll(t, "routes", v.show(t, "ip", "route"), "10.244.3.0/24 via 10.244.3.0 dev twill.1")
	})
	t.Run("VTEP MAC survives a restart and a lost state directory", func(t *testing.T) {
		v.start(t)
		if got := net.HardwareAddr(v.b.dev.HardwareAddr).String(); got != mac {
			t.Fatalf("MAC after restart %s, was %s", got, mac)
		}
		netnstest.IP(t, v.ns, "link", "del", "twill.1") // a reboot
		if err := os.RemoveAll(filepath.Join(v.state)); err != nil {
			t.Fatal(err)
		}
		v.start(t)
		if got := net.HardwareAddr(v.b.dev.HardwareAddr).String(); got != mac {
			t.Fatalf("MAC after reboot without state %s, was %s", got, mac)
		}
	})
}

// drain returns a channel that is ready once pending pokes are consumed.
func drain(c chan struct{}) chan struct{} {
	done := make(chan struct{}, 1)
	for {
		select {
		case <-c:
		default:
			done <- struct{}{}
			return done
		}
	}
}

func benchPeers(n int) []subnet.Lease {
	peers := make([]subnet.Lease, n)
	for i := range peers {
		dst := netip.PrefixFrom(subnet.NthSubnet(netip.MustParseAddr("100.64.0.0"), uint64(i+1), 24), 24)
		peers[i] = lease(dst.String(), netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}).String(), fmt.Sprintf("0a:b0:00:00:%02x:%02x", i>>8&0xff, i&0xff))
	}
	return peers
}

// BenchmarkReconcileOnEvent5000 is a lease event with 5,000 peers
// programmed (15,000 objects) and the records trusted.
func BenchmarkReconcileOnEvent5000(b *testing.B) {
	v := newVNodeB(b)
	peers := benchPeers(5000)
	if err := v.nw.Reconcile(context.Background(), peers); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for range b.N {
		if err := v.nw.Reconcile(context.Background(), peers); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkResyncNoChange5000 is the periodic full resync with nothing to
// do: all three sets read back from the kernel and diffed.
func BenchmarkResyncNoChange5000(b *testing.B) {
	v := newVNodeB(b)
	peers := benchPeers(5000)
	if err := v.nw.Reconcile(context.Background(), peers); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for range b.N {
		v.nw.routes.Invalidate()
		v.nw.neighs.Invalidate()
		v.nw.fdb.Invalidate()
		if err := v.nw.Reconcile(context.Background(), peers); err != nil {
			b.Fatal(err)
		}
	}
}

func debugOut() io.Writer {
	if os.Getenv("TWILL_TEST_DEBUG") != "" {
		return os.Stderr
	}
	return io.Discard
}
