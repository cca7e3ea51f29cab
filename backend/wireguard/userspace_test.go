package wireguard

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
	"golang.zx2c4.com/wireguard/tun/tuntest"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/twill-net/twill/backend"
	"github.com/twill-net/twill/backend/wireguard/uapi"
	"github.com/twill-net/twill/backend/wireguard/userspace"
	"github.com/twill-net/twill/nl/nlfake"
	"github.com/twill-net/twill/subnet"
)

// userspaceNode is a node whose kernel has no wireguard module and whose
// twill-wg already runs (as after a twilld restart): a real wireguard-go
// device on an in-memory TUN, served on the state directory's socket.
func userspaceNode(t *testing.T) (*Backend, *nlfake.Kernel, *uapi.Client, *prometheus.Registry) {
	t.Helper()
	state := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	go func() {
		done <- userspace.Run(ctx, userspace.Options{Logger: log, Name: DeviceName, Socket: Socket(state, DeviceName), TUN: tuntest.NewChannelTUN().TUN(), Bind: &userspace.DiscardBind{}})
	}()
	t.Cleanup(func() { cancel(); <-done })
	c := &uapi.Client{Path: Socket(state, DeviceName)}
	deadline := time.Now().Add(10 * time.Second)
	for _, err := c.Get(ctx); err != nil; _, err = c.Get(ctx) {
		if time.Now().After(deadline) {
			t.Fatal("the device never served its socket")
		}
		time.Sleep(10 * time.Millisecond)
	}
	k := &nlfake.Kernel{NoWireGuard: true}
	k.AddTUN(DeviceName, 1420)
	reg := prometheus.NewRegistry()
	o := options(t, k, conf(t, `{"Type":"wireguard","Mode":"auto"}`), state)
	o.Config.EnableIPv6 = false
	o.Metrics = &backend.Metrics{Registerer: reg}
	be, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	return be.(*Backend), k, c, reg
}

func TestUserspaceDevice(t *testing.T) {
	ctx := context.Background()
	b, k, dev, reg := userspaceNode(t)
	attrs, err := b.Prepare(ctx)
	if err != nil {
		t.Fatal(err)
	}
	nw, err := b.Attach(ctx, subnet.Lease{Subnet: mustPrefix("10.244.1.0/24")})
	if err != nil {
		t.Fatal(err)
	}
	n := nw.Network.(*Network)
	n.poll = 20 * time.Millisecond
	n.nudge = func(netip.Addr) {}
	k2 := key(t)
	p2 := lease("10.244.2.0/24", "", "192.168.1.2", "", k2)
	if err := n.Reconcile(ctx, []subnet.Lease{p2}); err != nil {
		t.Fatal(err)
	}
	d, err := dev.Get(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Peers) != 1 || d.Peers[0].PublicKey != k2 || !strings.Contains(string(attrs.BackendData), d.PublicKey.String()) {
		t.Fatalf("device %+v, published %s", d, attrs.BackendData)
	}
	if link, _ := k.LinkByName(DeviceName); !link.Up || link.MTU != 1440 {
		t.Fatalf("device link %+v: want it up with the underlay's MTU minus 60", link)
	}
	if got := testutil.ToFloat64(b.devices.info.WithLabelValues(DeviceName, ImplUserspace)); got != 1 {
		t.Fatalf("twill_wireguard_device_info{implementation=userspace} = %v", got)
	}
	if n, _ := testutil.GatherAndCount(reg, "twill_wireguard_device_info"); n != 1 {
		t.Fatalf("%d series of twill_wireguard_device_info", n)
	}
	if st := strings.Join(n.Status(ctx), "\n"); !strings.Contains(st, "userspace WireGuard") || !strings.Contains(st, "1 peers") {
		t.Fatalf("status %q", st)
	}
	if n.MTU() != 1440 {
		t.Fatalf("MTU %d", n.MTU())
	}

	if n.drifted(ctx) {
		t.Fatal("the device read back differs from what was just applied")
	}
	// The watch notices a peer removed by hand; a rotation asked for is
	// published.
	wctx, cancel := context.WithCancel(ctx)
	poked := make(chan struct{}, 1)
	rotations := make(chan struct{}, 1)
	b.opts.KeyRotations = rotations
	var running sync.WaitGroup
	running.Add(2)
	go func() { defer running.Done(); _ = n.WatchKernel(wctx, func() { trySend(poked) }, func() {}) }()
	go func() { defer running.Done(); _ = n.Run(wctx) }()
	// Both stopped before the state directory is removed (Run writes the
	// key file).
	t.Cleanup(func() { cancel(); running.Wait() })
	if err := dev.Set(ctx, wgtypes.Config{Peers: []wgtypes.PeerConfig{{PublicKey: k2, Remove: true}}}); err != nil {
		t.Fatal(err)
	}
	waitPoke(t, poked, "the watch noticing the removed peer")
	if err := n.Reconcile(ctx, []subnet.Lease{p2}); err != nil {
		t.Fatal(err)
	}
	if d, _ := dev.Get(ctx); len(d.Peers) != 1 {
		t.Fatalf("the removed peer was not put back: %+v", d.Peers)
	}
	old := d.PublicKey
	rotations <- struct{}{}
	// A poke may still be pending from the watch (the peer put back
	// changed the device): reconcile at each poke until the rotation's.
	for i := 0; ; i++ {
		waitPoke(t, poked, "the rotation asking for a reconcile")
		if err := n.Reconcile(ctx, []subnet.Lease{p2}); err != nil {
			t.Fatal(err)
		}
		data, _, changed := n.BackendData()
		d, _ := dev.Get(ctx)
		if changed && d.PublicKey != old && strings.Contains(string(data), d.PublicKey.String()) {
			break
		}
		if i == 4 {
			t.Fatalf("after the rotation: device key %s (was %s), published %s (changed %v)", d.PublicKey, old, data, changed)
		}
	}
}

// A kernel without the module and no twill-wg to start: the error says both.
func TestUserspaceDeviceCannotStart(t *testing.T) {
	k := &nlfake.Kernel{NoWireGuard: true}
	be, err := New(options(t, k, conf(t, `{"Type":"wireguard"}`), t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	b := be.(*Backend)
	b.devices.helper = "/nonexistent/twill-wg"
	_, err = b.Prepare(context.Background())
	if err == nil || !strings.Contains(err.Error(), "no wireguard module") || !strings.Contains(err.Error(), "/nonexistent/twill-wg") {
		t.Fatalf("Prepare: %v", err)
	}
}

func trySend(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

func waitPoke(t *testing.T, c chan struct{}, what string) {
	t.Helper()
	select {
	case <-c:
	case <-time.After(10 * time.Second):
		t.Fatalf("no poke: %s", what)
	}
}
