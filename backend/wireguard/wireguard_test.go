package wireguard

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/twill-net/twill/backend"
	"github.com/twill-net/twill/nl"
	"github.com/twill-net/twill/nl/nlfake"
	"github.com/twill-net/twill/subnet"
)

func conf(t testing.TB, backendJSON string) *subnet.Config {
	t.Helper()
	c, err := subnet.ParseConfig([]byte(`{"Network":"10.244.0.0/16","IPv6Network":"fd10::/56","EnableIPv6":true,"Backend":` + backendJSON + `}`))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestConfigErrorsNameFieldAndValue(t *testing.T) {
	for _, tc := range []struct{ backend, want string }{
		{`{"Type":"wireguard","Mode":"tunnel"}`, `Backend.Mode "tunnel"`},
		{`{"Type":"wireguard","ListenPort":70000}`, `Backend.ListenPort 70000`},
		{`{"Type":"wireguard","ListenPortV6":0}`, `Backend.ListenPortV6 0`},
		{`{"Type":"wireguard","ListenPort":"51820"}`, `ListenPort`},
		{`{"Type":"wireguard","PSK":"nope"}`, `Backend.PSK`},
		{`{"Type":"wireguard","MTU":100}`, `Backend.MTU 100`},
		{`{"Type":"wireguard","MTU":1460}`, `Backend.MTU 1460: must be at most 1440`},
		{`{"Type":"wireguard","PersistentKeepaliveInterval":-1}`, `Backend.PersistentKeepaliveInterval -1`},
		{`{"Type":"wireguard","KeyRotationInterval":"1s"}`, `Backend.KeyRotationInterval "1s"`},
		{`{"Type":"wireguard","VNI":1}`, `VNI`},
	} {
		_, err := New(options(t, &nlfake.Kernel{}, conf(t, tc.backend), t.TempDir()))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want it to name %q", tc.backend, err, tc.want)
		}
	}
}

func options(t testing.TB, k *nlfake.Kernel, cfg *subnet.Config, state string) backend.Options {
	t.Helper()
	ext, _ := k.LinkByName("eth0")
	if ext.Index == 0 {
		ext = k.AddLink("eth0", 1500, true, netip.MustParsePrefix("192.168.1.1/24"), netip.MustParsePrefix("fd00::1/64"))
	}
	return backend.Options{
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Netlink: k, Config: cfg, StateDir: state,
		ExtIface: backend.ExternalInterface{Link: ext, Addr: netip.MustParseAddr("192.168.1.1"), AddrV6: netip.MustParseAddr("fd00::1"),
			PublicIP: netip.MustParseAddr("192.168.1.1"), PublicIPv6: netip.MustParseAddr("fd00::1")},
	}
}

// node is one node's backend over a fake kernel and fake devices.
type node struct {
	nudged []netip.Addr
	k      *nlfake.Kernel
	devs   *fakeDevices
	b      *Backend
	nw     *Network
	pub    wgtypes.Key
}

func newNode(t testing.TB, backendJSON, state string, lease subnet.Lease) *node {
	t.Helper()
	n := &node{k: &nlfake.Kernel{}, devs: &fakeDevices{}}
	be, err := New(options(t, n.k, conf(t, backendJSON), state))
	if err != nil {
		t.Fatal(err)
	}
	n.b = be.(*Backend)
	n.b.devices.opener = n.devs.open
	attrs, err := n.b.Prepare(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var d Data
	if err := json.Unmarshal(attrs.BackendData, &d); err != nil {
		t.Fatal(err)
	}
	if n.pub, err = wgtypes.ParseKey(d.PublicKey); err != nil {
		t.Fatal(err)
	}
	nw, err := n.b.Attach(context.Background(), lease)
	if err != nil {
		t.Fatal(err)
	}
	n.nw = nw.Network.(*Network)
	// Unit tests send nothing anywhere: nudges are recorded.
	n.nw.nudge = func(a netip.Addr) { n.nudged = append(n.nudged, a) }
	return n
}

func lease(sub, sub6, ip, ip6 string, pub wgtypes.Key) subnet.Lease {
	d, _ := json.Marshal(Data{PublicKey: pub.String()})
	l := subnet.Lease{Subnet: netip.MustParsePrefix(sub), Attrs: subnet.LeaseAttrs{PublicIP: netip.MustParseAddr(ip), BackendType: Type, BackendData: d, BackendV6Data: d}}
	if sub6 != "" {
		l.IPv6Subnet, l.Attrs.PublicIPv6 = netip.MustParsePrefix(sub6), netip.MustParseAddr(ip6)
	}
	return l
}

// keyAbove is a new public key above self (above) or below it: a node
// with key self leads its first handshake with a peer above it (see
// leads).
func keyAbove(t testing.TB, self wgtypes.Key, above bool) wgtypes.Key {
	t.Helper()
	// A random key with self's bytes up to the first it can raise (lower),
	// that byte one more (less), and random bytes after it: drawing keys
	// until one was above self failed when self was near the top.
	k := key(t)
	for i := range self {
		switch {
		case above && self[i] < 0xff:
			copy(k[:i], self[:i])
			k[i] = self[i] + 1
			return k
		case !above && self[i] > 0:
			copy(k[:i], self[:i])
			k[i] = self[i] - 1
			return k
		}
	}
	t.Fatalf("no key is above (%v) %s", above, self)
	return wgtypes.Key{}
}

func key(t testing.TB) wgtypes.Key {
	t.Helper()
	k, err := wgtypes.GeneratePrivateKey()
	if err != nil {
		t.Fatal(err)
	}
	return k.PublicKey()
}

func routeDsts(t testing.TB, k *nlfake.Kernel, dev string) []string {
	t.Helper()
	link, err := k.LinkByName(dev)
	if err != nil {
		t.Fatal(err)
	}
	rs, err := k.Routes(nl.FamilyAll, nl.RouteFilter{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, r := range rs {
		if r.LinkIndex == link.Index {
			out = append(out, r.Dst.String())
		}
	}
	slices.Sort(out)
	return out
}

func TestReconcileFollowsLeases(t *testing.T) {
	ctx := context.Background()
	state := t.TempDir()
	self := lease("10.244.1.0/24", "fd10:0:0:1::/64", "192.168.1.1", "fd00::1", wgtypes.Key{})
	n := newNode(t, `{"Type":"wireguard","PersistentKeepaliveInterval":25}`, state, self)
	if fi, err := os.Stat(filepath.Join(state, keyFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v %v", fi, err)
	}
	k2, k3 := key(t), key(t)
	p2 := lease("10.244.2.0/24", "fd10:0:0:2::/64", "192.168.1.2", "fd00::2", k2)
	p3 := lease("10.244.3.0/24", "fd10:0:0:3::/64", "192.168.1.3", "fd00::3", k3)
	if err := n.nw.Reconcile(ctx, []subnet.Lease{p2, p3}); err != nil {
		t.Fatal(err)
	}
	v4, v6 := n.devs.dev(DeviceName).describe(), n.devs.dev(DeviceNameV6).describe()
	if len(v4) != 2 || !strings.Contains(strings.Join(v4, ";"), "192.168.1.2:51820 [10.244.2.0/24]") {
		t.Fatalf("twill-wg peers %v", v4)
	}
	if len(v6) != 2 || !strings.Contains(strings.Join(v6, ";"), "[fd00::3]:51821 [fd10:0:0:3::/64]") {
		t.Fatalf("twill-wg-v6 peers %v", v6)
	}
	if got := routeDsts(t, n.k, DeviceName); !slices.Equal(got, []string{"10.244.2.0/24", "10.244.3.0/24"}) {
		t.Fatalf("routes via twill-wg %v", got)
	}
	if got := routeDsts(t, n.k, DeviceNameV6); !slices.Equal(got, []string{"fd10:0:0:2::/64", "fd10:0:0:3::/64"}) {
		t.Fatalf("routes via twill-wg-v6 %v", got)
	}
	// A peer's public IP moves: the endpoint follows. A lease goes: its
	// peer and routes go.
	p2.Attrs.PublicIP = netip.MustParseAddr("192.168.1.22")
	if err := n.nw.Reconcile(ctx, []subnet.Lease{p2}); err != nil {
		t.Fatal(err)
	}
	if v4 := n.devs.dev(DeviceName).describe(); len(v4) != 1 || !strings.Contains(v4[0], "192.168.1.22:51820") {
		t.Fatalf("after the change, twill-wg peers %v", v4)
	}
	if got := routeDsts(t, n.k, DeviceName); !slices.Equal(got, []string{"10.244.2.0/24"}) {
		t.Fatalf("routes via twill-wg %v", got)
	}
	// A peer that rotated its key is replaced, and nudged (once), as
	// every peer added is.
	n.nudged = nil
	k2 = keyAbove(t, n.pub, true)
	p2 = lease("10.244.2.0/24", "fd10:0:0:2::/64", "192.168.1.22", "fd00::2", k2)
	if err := n.nw.Reconcile(ctx, []subnet.Lease{p2}); err != nil {
		t.Fatal(err)
	}
	if v4 := n.devs.dev(DeviceName).describe(); len(v4) != 1 || !strings.HasPrefix(v4[0], k2.String()[:6]) {
		t.Fatalf("after the peer's rotation, twill-wg peers %v", v4)
	}
	if fmt.Sprint(n.nudged) != "[10.244.2.0 fd10:0:0:2::]" {
		t.Fatalf("nudged %v, want the rotated peer's device addresses on both devices", n.nudged)
	}
	if err := n.nw.Reconcile(ctx, []subnet.Lease{p2}); err != nil || len(n.nudged) != 2 {
		t.Fatalf("a second reconcile nudged again (%v, %v)", n.nudged, err)
	}
	// A peer removed by hand is noticed and put back.
	dev := n.devs.dev(DeviceName)
	if err := dev.Set(ctx, wgtypes.Config{Peers: []wgtypes.PeerConfig{{PublicKey: k2, Remove: true}}}); err != nil {
		t.Fatal(err)
	}
	if !n.nw.drifted(ctx) {
		t.Fatal("a hand-removed peer is not seen as drift")
	}
	if d, _ := n.nw.Drift(ctx, []subnet.Lease{p2}); len(d.Missing) != 1 || !strings.Contains(d.Missing[0], k2.String()) {
		t.Fatalf("drift %+v", d)
	}
	if err := n.nw.Reconcile(ctx, []subnet.Lease{p2}); err != nil {
		t.Fatal(err)
	}
	if v4 := dev.describe(); len(v4) != 1 || n.nw.drifted(ctx) {
		t.Fatalf("after the repair, twill-wg peers %v", v4)
	}
	// The same state directory keeps the same key.
	again := newNode(t, `{"Type":"wireguard"}`, state, self)
	if again.pub != n.pub {
		t.Fatal("the public key changed across a restart with the same state directory")
	}
}

func TestRoguePeersRefused(t *testing.T) {
	ctx := context.Background()
	n := newNode(t, `{"Type":"wireguard","Mode":"auto"}`, t.TempDir(), lease("10.244.1.0/24", "fd10:0:0:1::/64", "192.168.1.1", "fd00::1", wgtypes.Key{}))
	shared, good := key(t), key(t)
	aged := func(l subnet.Lease, since int64) subnet.Lease { l.Since = since; return l }
	leases := []subnet.Lease{
		aged(lease("10.244.2.0/24", "", "192.168.1.2", "", shared), 7),
		aged(lease("10.244.3.0/24", "", "192.168.1.3", "", shared), 3), // the older: it keeps the key
		aged(lease("10.244.4.0/24", "", "192.168.1.4", "", n.pub), 2),
		aged(lease("10.244.5.0/24", "", "192.168.1.5", "", good), 5),
	}
	bad := aged(lease("10.244.6.0/24", "", "192.168.1.6", "", good), 6)
	bad.Attrs.BackendData = json.RawMessage(`{"PublicKey":"not-a-key"}`)
	bad.Attrs.BackendV6Data = nil
	leases = append(leases, bad)
	if err := n.nw.Reconcile(ctx, leases); err != nil {
		t.Fatal(err)
	}
	want := func(what string, peers, refused int, routes ...string) {
		t.Helper()
		got := strings.Join(n.devs.dev(DeviceName).describe(), ";")
		if strings.Count(got, "192.168.1.") != peers || !strings.Contains(got, "192.168.1.3:51820") || !strings.Contains(got, "192.168.1.5:51820") {
			t.Fatalf("%s: peers %s, want those at 192.168.1.3 (the older of a shared key) and 192.168.1.5", what, got)
		}
		d, err := n.nw.Drift(ctx, leases)
		if err != nil {
			t.Fatal(err)
		}
		if len(d.Refused) != refused {
			t.Fatalf("%s: refused %v", what, d.Refused)
		}
		if got := routeDsts(t, n.k, DeviceName); !slices.Equal(got, routes) {
			t.Fatalf("%s: routes %v", what, got)
		}
	}
	want("first", 2, 3, "10.244.3.0/24", "10.244.5.0/24")
	// A lease made later, with a lower subnet, copying a peer's key: the
	// peer keeps talking, the copy is refused, by the update as by the
	// full reconcile it falls back to.
	copied := aged(lease("10.244.0.0/24", "", "192.168.1.100", "", good), 20)
	if err := n.nw.Update(ctx, []subnet.Lease{copied}, nil); !errors.Is(err, backend.ErrFullReconcile) {
		t.Fatalf("an update copying a programmed peer's key: %v", err)
	}
	leases = append(leases, copied)
	if err := n.nw.Reconcile(ctx, leases); err != nil {
		t.Fatal(err)
	}
	want("after a copy of a peer's key", 2, 4, "10.244.3.0/24", "10.244.5.0/24")
}

func TestRotate(t *testing.T) {
	ctx := context.Background()
	state := t.TempDir()
	n := newNode(t, `{"Type":"wireguard"}`, state, lease("10.244.1.0/24", "fd10:0:0:1::/64", "192.168.1.1", "fd00::1", wgtypes.Key{}))
	if _, _, changed := n.nw.BackendData(); changed {
		t.Fatal("backend data changed before any rotation")
	}
	if err := n.nw.Rotate(); err != nil {
		t.Fatal(err)
	}
	// Not published until the device holds the new key: its peers would
	// drop what it sends, sealed with the old one.
	if _, _, changed := n.nw.BackendData(); changed {
		t.Fatal("the rotated key was published before the device held it")
	}
	refuse := func(on bool) {
		d := n.devs.dev(DeviceName)
		d.mu.Lock()
		d.failSet = on
		d.mu.Unlock()
	}
	refuse(true)
	if err := n.nw.Reconcile(ctx, nil); err == nil {
		t.Fatal("Reconcile succeeded with the device refusing every change")
	}
	if _, _, changed := n.nw.BackendData(); changed {
		t.Fatal("the rotated key was published after the device refused it")
	}
	refuse(false)
	if err := n.nw.Reconcile(ctx, nil); err != nil {
		t.Fatal(err)
	}
	data, _, changed := n.nw.BackendData()
	var d Data
	_ = json.Unmarshal(data, &d)
	dev, _ := n.devs.dev(DeviceName).Get(ctx)
	if !changed || d.PublicKey == n.pub.String() || d.PublicKey != dev.PublicKey.String() {
		t.Fatalf("after rotation: published %q (changed %v), device %s, old %s", d.PublicKey, changed, dev.PublicKey, n.pub)
	}
	raw, _ := os.ReadFile(filepath.Join(state, keyFile))
	if strings.TrimSpace(string(raw)) != dev.PrivateKey.String() {
		t.Fatal("the rotated key was not stored")
	}
}

// TestRotationIsNotDrift: the device taking a rotated key is not a
// repair of drift; a peer removed by hand is.
func TestRotationIsNotDrift(t *testing.T) {
	ctx := context.Background()
	n := newNode(t, `{"Type":"wireguard"}`, t.TempDir(), lease("10.244.1.0/24", "fd10:0:0:1::/64", "192.168.1.1", "fd00::1", wgtypes.Key{}))
	repairs := prometheus.NewCounter(prometheus.CounterOpts{Name: "repairs"})
	n.b.opts.Metrics = &backend.Metrics{DriftRepairs: repairs}
	peers := []subnet.Lease{lease("10.244.2.0/24", "", "192.168.1.2", "", wgtypes.Key{2})}
	if err := n.nw.Reconcile(ctx, peers); err != nil {
		t.Fatal(err)
	}
	if err := n.nw.Rotate(); err != nil {
		t.Fatal(err)
	}
	if err := n.nw.Reconcile(ctx, peers); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(repairs); got != 0 {
		t.Fatalf("a rotation counted as %v drift repairs", got)
	}
	if err := n.devs.dev(DeviceName).Set(ctx, wgtypes.Config{Peers: []wgtypes.PeerConfig{{PublicKey: wgtypes.Key{2}, Remove: true}}}); err != nil {
		t.Fatal(err)
	}
	if err := n.nw.Reconcile(ctx, peers); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(repairs); got != 1 {
		t.Fatalf("a peer removed by hand and put back counted as %v drift repairs, want 1", got)
	}
}

func mustPrefix(s string) netip.Prefix { return netip.MustParsePrefix(s) }

// FuzzParseConfig: whatever a Backend object holds, the configuration is
// refused with the field named, or its values are in range.
func FuzzParseConfig(f *testing.F) {
	f.Add(`{"Type":"wireguard","PSK":"","ListenPort":51820,"ListenPortV6":51821,"Mode":"auto","PersistentKeepaliveInterval":25,"MTU":1380,"KeyRotationInterval":"720h"}`)
	f.Add(`{"Mode":"separate","ListenPort":"x"}`)
	f.Add(`{"KeyRotationInterval":"-5m"}`)
	f.Fuzz(func(t *testing.T, raw string) {
		s, err := parseConfig(json.RawMessage(raw))
		if err != nil {
			if !strings.Contains(err.Error(), "net-conf.json") {
				t.Fatalf("%q: error %q does not say where", raw, err)
			}
			return
		}
		if s.port < 1 || s.port > 65535 || s.portV6 < 1 || s.portV6 > 65535 || s.keepalive < 0 ||
			(s.mtu != 0 && (s.mtu < minMTU || s.mtu > 65535)) || (s.rotate != 0 && s.rotate < time.Minute) ||
			!slices.Contains([]string{ModeSeparate, ModeAuto, ModeIPv4, ModeIPv6}, s.mode) {
			t.Fatalf("%q: accepted as %+v", raw, s)
		}
	})
}

// KeyRotationInterval: the key pair is replaced on the period, and the new
// public key published.
func TestRotatesOnPeriod(t *testing.T) {
	n := newNode(t, `{"Type":"wireguard","KeyRotationInterval":"1m"}`, t.TempDir(), lease("10.244.1.0/24", "fd10:0:0:1::/64", "192.168.1.1", "fd00::1", wgtypes.Key{}))
	if n.b.s.rotate != time.Minute {
		t.Fatalf("KeyRotationInterval parsed as %s", n.b.s.rotate)
	}
	n.b.s.rotate = 20 * time.Millisecond // not to wait a minute
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() { defer close(stopped); _ = n.nw.Run(ctx) }()
	// Run rotates every 20 ms, writing the key file: it must have stopped
	// before the state directory is removed.
	t.Cleanup(func() { cancel(); <-stopped })
	deadline := time.Now().Add(10 * time.Second)
	for {
		_ = n.nw.Reconcile(ctx, nil) // what the daemon does when poked
		if data, _, changed := n.nw.BackendData(); changed {
			if strings.Contains(string(data), n.pub.String()) {
				t.Fatal("published the old key again")
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no rotation within 10s at a 20ms period")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// keyAbove finds a key on the asked side of any key, the extremes too.
func TestKeyAbove(t *testing.T) {
	var top, bottom wgtypes.Key
	for i := range top {
		top[i] = 0xff
	}
	top[31] = 0xfe
	bottom[31] = 1
	for _, self := range []wgtypes.Key{top, bottom, key(t)} {
		for _, above := range []bool{true, false} {
			if k := keyAbove(t, self, above); leads(self, k) != above || k == self {
				t.Errorf("keyAbove(%x, %v) = %x", self, above, k)
			}
		}
	}
}

// blackholes are the fake kernel's blackhole routes, as "dst metric".
func blackholes(t testing.TB, k *nlfake.Kernel) []string {
	t.Helper()
	rs, err := k.Routes(nl.FamilyAll, nl.RouteFilter{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, r := range rs {
		if r.Type == nl.RouteBlackhole {
			out = append(out, fmt.Sprintf("%s %d", r.Dst, r.Priority))
		}
	}
	slices.Sort(out)
	return out
}

// TestFailsClosed: each pod network the devices carry has a blackhole
// route of twill's below the routes through the devices, so that a pod's
// packet to another node is dropped, not sent in clear by the node's
// default route, while a device is missing; and it is there before any
// device is.
func TestFailsClosed(t *testing.T) {
	ctx := context.Background()
	self := lease("10.244.1.0/24", "fd10:0:0:1::/64", "192.168.1.1", "fd00::1", wgtypes.Key{})
	n := newNode(t, `{"Type":"wireguard"}`, t.TempDir(), self)
	want := []string{fmt.Sprintf("10.244.0.0/16 %d", nl.RouteMetric(netip.MustParsePrefix("10.244.0.0/16"))),
		fmt.Sprintf("fd10::/56 %d", nl.RouteMetric(netip.MustParsePrefix("fd10::/56")))}
	p2 := lease("10.244.2.0/24", "fd10:0:0:2::/64", "192.168.1.2", "fd00::2", key(t))
	// No device can be made: the blackholes are there all the same.
	n.devs.failOpen = true
	if err := n.nw.Reconcile(ctx, []subnet.Lease{p2}); err == nil {
		t.Fatal("a reconcile with no device succeeded")
	}
	if got := blackholes(t, n.k); !slices.Equal(got, want) {
		t.Fatalf("with no device, blackhole routes %v, want %v", got, want)
	}
	n.devs.failOpen = false
	if err := n.nw.Reconcile(ctx, []subnet.Lease{p2}); err != nil {
		t.Fatal(err)
	}
	// The device deleted: its routes go with it, the blackholes stay.
	link, err := n.k.LinkByName(DeviceName)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.k.LinkDel(link.Index); err != nil {
		t.Fatal(err)
	}
	if got := blackholes(t, n.k); !slices.Equal(got, want) {
		t.Fatalf("with the device gone, blackhole routes %v, want %v", got, want)
	}
	// A blackhole deleted by hand is drift (the daemon's route watch
	// tells the route set, which reads the kernel again), and comes back.
	if err := n.k.RouteDel(nl.Route{Dst: netip.MustParsePrefix("10.244.0.0/16"), Priority: nl.RouteMetric(netip.MustParsePrefix("10.244.0.0/16")), Type: nl.RouteBlackhole}); err != nil {
		t.Fatal(err)
	}
	if d, err := n.nw.Drift(ctx, []subnet.Lease{p2}); err != nil || !strings.Contains(strings.Join(d.Missing, ";"), "blackhole 10.244.0.0/16") {
		t.Fatalf("drift %+v (%v), want the blackhole missing", d, err)
	}
	n.nw.routes.Invalidate()
	if err := n.nw.Reconcile(ctx, []subnet.Lease{p2}); err != nil {
		t.Fatal(err)
	}
	if got := blackholes(t, n.k); !slices.Equal(got, want) {
		t.Fatalf("after a repair, blackhole routes %v, want %v", got, want)
	}
	if got := routeDsts(t, n.k, DeviceName); !slices.Equal(got, []string{"10.244.2.0/24"}) {
		t.Fatalf("routes via the device made again %v", got)
	}
}

// A node whose lease changed (its Node registered again with another
// podCIDR) keeps its device across twilld's restart (the keeper's, or the
// kernel's): the address of the old lease goes, or the kernel may pick it
// as the source of the node's own packets, to which no peer routes.
func TestDeviceAddressOfAnEarlierLeaseGoes(t *testing.T) {
	ctx := context.Background()
	state := t.TempDir()
	k, devs := &nlfake.Kernel{}, &fakeDevices{}
	old := mustPrefix("10.244.1.0/24")
	for _, sub := range []string{"10.244.1.0/24", "10.244.7.0/24"} {
		be, err := New(options(t, k, conf(t, `{"Type":"wireguard"}`), state))
		if err != nil {
			t.Fatal(err)
		}
		b := be.(*Backend)
		b.devices.opener = devs.open
		if _, err := b.Prepare(ctx); err != nil {
			t.Fatal(err)
		}
		nw, err := b.Attach(ctx, lease(sub, "", "192.168.1.1", "", wgtypes.Key{}))
		if err != nil {
			t.Fatal(err)
		}
		nw.Network.(*Network).nudge = func(netip.Addr) {}
		if err := nw.Network.Reconcile(ctx, nil); err != nil {
			t.Fatal(err)
		}
		link, err := k.LinkByName(DeviceName)
		if err != nil {
			t.Fatal(err)
		}
		addrs, _ := k.Addrs(link.Index, nl.FamilyAll)
		var got []string
		for _, a := range addrs {
			got = append(got, a.Prefix.String())
			if sub != old.String() && old.Contains(a.Prefix.Addr()) {
				t.Errorf("lease %s: %s keeps %s, of the earlier lease %s", sub, DeviceName, a.Prefix, old)
			}
		}
		if len(got) == 0 || !mustPrefix(sub).Contains(addrs[len(addrs)-1].Prefix.Addr()) {
			t.Errorf("lease %s: %s's addresses %q", sub, DeviceName, got)
		}
	}
}
