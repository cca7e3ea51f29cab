package vxlan

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/netip"
	"strings"
	"testing"

	"github.com/twill-net/twill/backend"
	"github.com/twill-net/twill/backend/backendtest"
	"github.com/twill-net/twill/nl"
	"github.com/twill-net/twill/nl/nlfake"
	"github.com/twill-net/twill/subnet"
)

// IPv6: one VTEP carries both pod families, over an IPv4 or an IPv6
// underlay. These run against the fake kernel, as fake_test.go's do.

const dualConf = `{"Network":"10.244.0.0/16","EnableIPv6":true,"IPv6Network":"fd00:10::/56","Backend":%s}`

// newV6Node builds a node on a fake kernel whose eth0 holds underlay (one
// or two prefixes), with the given local lease.
func newV6Node(t *testing.T, conf, backendJSON string, local subnet.Lease, underlay ...netip.Prefix) *fnode {
	t.Helper()
	k := &nlfake.Kernel{}
	eth := k.AddLink("eth0", 1500, true, underlay...)
	ext := backend.ExternalInterface{Link: eth}
	for _, p := range underlay {
		ext.OnLink = append(ext.OnLink, p.Masked())
		if p.Addr().Is4() {
			ext.Addr, ext.PublicIP = p.Addr(), p.Addr()
		} else {
			ext.AddrV6, ext.PublicIPv6 = p.Addr(), p.Addr()
		}
	}
	opts := backendtest.Options(t, strings.Replace(conf, "%s", backendJSON, 1), k, ext)
	f := &fnode{k: k, eth: eth, state: t.TempDir(), conf: backendJSON}
	opts.Logger, opts.StateDir = slog.New(slog.NewTextHandler(&f.log, nil)), f.state
	b, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	attrs, err := b.Prepare(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	local.Attrs = attrs
	nw, err := b.Attach(context.Background(), local)
	if err != nil {
		t.Fatal(err)
	}
	f.b, f.nw = b.(*Backend), nw.Network.(*Network)
	return f
}

// peer6 is a lease with subnets v4 and/or v6 (either ""), public
// addresses pub4 and/or pub6, and mac in BackendData and BackendV6Data
// for the families it has.
func peer6(v4, v6, pub4, pub6, mac string) subnet.Lease {
	data, _ := json.Marshal(Data{VNI: 1, VtepMAC: mac})
	var l subnet.Lease
	l.Attrs.BackendType = Type
	if v4 != "" {
		l.Subnet, l.Attrs.BackendData = netip.MustParsePrefix(v4), data
	}
	if v6 != "" {
		l.IPv6Subnet, l.Attrs.BackendV6Data = netip.MustParsePrefix(v6), data
	}
	if pub4 != "" {
		l.Attrs.PublicIP = netip.MustParseAddr(pub4)
	}
	if pub6 != "" {
		l.Attrs.PublicIPv6 = netip.MustParseAddr(pub6)
	}
	return l
}

func reconcile(t *testing.T, f *fnode, peers ...subnet.Lease) kernelState {
	t.Helper()
	if err := f.nw.Reconcile(context.Background(), peers); err != nil {
		t.Fatal(err)
	}
	return dump(t, f.k)
}

func TestFakeDualStackOverIPv4(t *testing.T) {
	local := subnet.Lease{Subnet: netip.MustParsePrefix("10.244.1.0/24"), IPv6Subnet: netip.MustParsePrefix("fd00:10:0:1::/64")}
	f := newV6Node(t, dualConf, `{"Type":"vxlan"}`, local, netip.MustParsePrefix("192.168.1.1/24"))
	attrs := f.nw.local.Attrs
	if len(attrs.BackendData) == 0 || string(attrs.BackendData) != string(attrs.BackendV6Data) {
		t.Fatalf("published BackendData %s, BackendV6Data %s: want the same VTEP in both", attrs.BackendData, attrs.BackendV6Data)
	}
	peer := peer6("10.244.2.0/24", "fd00:10:0:2::/64", "10.0.0.2", "", "0a:00:00:00:00:02")
	s := reconcile(t, f, peer)
	if !strings.Contains(s.device, "mtu 1450") || !strings.Contains(s.device, "local 192.168.1.1") {
		t.Errorf("device %s: want MTU 1450 (IPv4 underlay) bound to 192.168.1.1", s.device)
	}
	if f.nw.MTU() != 1450 {
		t.Errorf("MTU %d: want 1450 for pods of both families", f.nw.MTU())
	}
	has(t, "addrs", s.addrs, "10.244.1.0/32", "fd00:10:0:1::/128")
	has(t, "neigh", s.neigh, "10.244.2.0 lladdr 0a:00:00:00:00:02", "fd00:10:0:2:: lladdr 0a:00:00:00:00:02")
	if len(s.fdb) != 1 || s.fdb[0] != "0a:00:00:00:00:02 dst 10.0.0.2" {
		t.Errorf("fdb %q: want one entry, to the peer's IPv4 address, for both families", s.fdb)
	}
	has(t, "routes", s.routes, "10.244.2.0/24 via 10.244.2.0 dev twill.1 proto 167 onlink", "fd00:10:0:2::/64 via fd00:10:0:2:: dev twill.1 proto 167 onlink")

	t.Run("a v6 route and neighbour deleted by hand are reported and restored", func(t *testing.T) {
		ctx := context.Background()
		rs, _ := f.k.Routes(nl.FamilyV6, nl.RouteFilter{})
		if len(rs) != 1 {
			t.Fatalf("v6 routes %v", rs)
		}
		if err := f.k.RouteDel(rs[0]); err != nil {
			t.Fatal(err)
		}
		if err := f.k.NeighDel(nl.Neigh{LinkIndex: f.nw.devIdx, IP: netip.MustParseAddr("fd00:10:0:2::")}, false); err != nil {
			t.Fatal(err)
		}
		d, err := f.nw.Drift(ctx, []subnet.Lease{peer})
		if err != nil {
			t.Fatal(err)
		}
		missing := strings.Join(d.Missing, "\n")
		if !strings.Contains(missing, "route fd00:10:0:2::/64") || !strings.Contains(missing, "neighbour fd00:10:0:2::") {
			t.Errorf("drift %+v: want the v6 route and neighbour missing", d)
		}
		f.nw.invalidate() // what a resync or the route watch does
		s := reconcile(t, f, peer)
		has(t, "neigh", s.neigh, "fd00:10:0:2:: lladdr 0a:00:00:00:00:02")
		has(t, "routes", s.routes, "fd00:10:0:2::/64 via fd00:10:0:2:: dev twill.1 proto 167 onlink")
	})
	t.Run("a peer that loses its v6 subnet loses its v6 objects only", func(t *testing.T) {
		v4only := peer6("10.244.2.0/24", "", "10.0.0.2", "", "0a:00:00:00:00:02")
		if err := f.nw.Update(context.Background(), []subnet.Lease{v4only}, nil); err != nil {
			t.Fatal(err)
		}
		s := dump(t, f.k)
		lacks(t, "routes", s.routes, "fd00:10:0:2::")
		lacks(t, "neigh", s.neigh, "fd00:10:0:2::")
		has(t, "routes", s.routes, "10.244.2.0/24 via 10.244.2.0 dev twill.1 proto 167 onlink")
		has(t, "fdb", s.fdb, "0a:00:00:00:00:02 dst 10.0.0.2")
		if err := f.nw.Update(context.Background(), []subnet.Lease{peer}, nil); err != nil {
			t.Fatal(err)
		}
		has(t, "routes", dump(t, f.k).routes, "fd00:10:0:2::/64 via fd00:10:0:2:: dev twill.1 proto 167 onlink")
	})
	t.Run("a removed peer leaves nothing behind", func(t *testing.T) {
		s := reconcile(t, f)
		if len(s.neigh)+len(s.fdb)+len(s.routes) != 0 {
			t.Errorf("after the peer left:\n%s", s)
		}
	})
	t.Run("a v6 VTEP MAC that is not the v4 one is refused", func(t *testing.T) {
		odd := peer6("10.244.3.0/24", "fd00:10:0:3::/64", "10.0.0.3", "", "0a:00:00:00:00:03")
		odd.Attrs.BackendV6Data = json.RawMessage(`{"VNI":1,"VtepMAC":"0a:00:00:00:00:33"}`)
		s := reconcile(t, f, odd)
		if len(s.routes) != 0 {
			t.Errorf("routes %q for a peer with two VTEP MACs", s.routes)
		}
		d, _ := f.nw.Drift(context.Background(), []subnet.Lease{odd})
		if !strings.Contains(strings.Join(d.Refused, "\n"), "BackendV6Data VtepMAC 0a:00:00:00:00:33 differs") {
			t.Errorf("refused %q", d.Refused)
		}
	})
}

func TestFakeIPv6OnlyOverIPv6(t *testing.T) {
	conf := `{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"fd00:10::/56","Backend":%s}`
	local := subnet.Lease{IPv6Subnet: netip.MustParsePrefix("fd00:10:0:1::/64")}
	f := newV6Node(t, conf, `{"Type":"vxlan"}`, local, netip.MustParsePrefix("fd99::1/64"))
	if attrs := f.nw.local.Attrs; len(attrs.BackendData) != 0 || len(attrs.BackendV6Data) == 0 {
		t.Fatalf("published BackendData %s, BackendV6Data %s: want only BackendV6Data in an IPv6-only cluster", attrs.BackendData, attrs.BackendV6Data)
	}
	routed := peer6("", "fd00:10:0:2::/64", "", "fd98::2", "0a:00:00:00:00:02")
	noV6 := peer6("", "fd00:10:0:3::/64", "10.0.0.3", "", "0a:00:00:00:00:03")
	s := reconcile(t, f, routed, noV6)
	if !strings.Contains(s.device, "mtu 1430") || !strings.Contains(s.device, "local fd99::1") {
		t.Errorf("device %s: want MTU 1430 (IPv6 underlay) bound to fd99::1", s.device)
	}
	if len(s.addrs) != 1 || s.addrs[0] != "fd00:10:0:1::/128" {
		t.Errorf("addrs %q: want the v6 VTEP address alone", s.addrs)
	}
	if len(s.fdb) != 1 || s.fdb[0] != "0a:00:00:00:00:02 dst fd98::2" {
		t.Errorf("fdb %q: want one entry to the peer's IPv6 address", s.fdb)
	}
	if len(s.routes) != 1 || s.routes[0] != "fd00:10:0:2::/64 via fd00:10:0:2:: dev twill.1 proto 167 onlink" {
		t.Errorf("routes %q", s.routes)
	}
	d, err := f.nw.Drift(context.Background(), []subnet.Lease{routed, noV6})
	if err != nil {
		t.Fatal(err)
	}
	if !d.Clean() || !strings.Contains(strings.Join(d.Refused, "\n"), "fd00:10:0:3::/64: PublicIPv6 no address (the overlay runs over IPv6)") {
		t.Errorf("drift %+v: want clean, with the peer that has no IPv6 underlay address refused", d)
	}
	t.Run("an FDB entry deleted by hand is reported and restored", func(t *testing.T) {
		mac := []byte{0x0a, 0, 0, 0, 0, 2}
		if err := f.k.NeighDel(nl.Neigh{LinkIndex: f.nw.devIdx, IP: netip.MustParseAddr("fd98::2"), HardwareAddr: mac}, true); err != nil {
			t.Fatal(err)
		}
		d, _ := f.nw.Drift(context.Background(), []subnet.Lease{routed})
		if !strings.Contains(strings.Join(d.Missing, "\n"), "fdb fd98::2 0a:00:00:00:00:02") {
			t.Errorf("drift %+v: want the FDB entry missing", d)
		}
		f.nw.invalidate()
		has(t, "fdb", reconcile(t, f, routed).fdb, "0a:00:00:00:00:02 dst fd98::2")
	})
}

func TestFakeDirectRoutingPerFamily(t *testing.T) {
	local := subnet.Lease{Subnet: netip.MustParsePrefix("10.244.1.0/24"), IPv6Subnet: netip.MustParsePrefix("fd00:10:0:1::/64")}
	f := newV6Node(t, dualConf, `{"Type":"vxlan","DirectRouting":true}`, local,
		netip.MustParsePrefix("192.168.1.1/24"), netip.MustParsePrefix("fd99::1/64"))
	// On-link in both families: host-gw routes, no overlay entries.
	both := peer6("10.244.2.0/24", "fd00:10:0:2::/64", "192.168.1.2", "fd99::2", "0a:00:00:00:00:02")
	// On-link over IPv4 only: its IPv6 pods go through the overlay.
	half := peer6("10.244.3.0/24", "fd00:10:0:3::/64", "192.168.1.3", "fd98::3", "0a:00:00:00:00:03")
	s := reconcile(t, f, both, half)
	has(t, "routes", s.routes,
		"10.244.2.0/24 via 192.168.1.2 dev eth0 proto 167", "fd00:10:0:2::/64 via fd99::2 dev eth0 proto 167",
		"10.244.3.0/24 via 192.168.1.3 dev eth0 proto 167", "fd00:10:0:3::/64 via fd00:10:0:3:: dev twill.1 proto 167 onlink")
	if len(s.neigh) != 1 || s.neigh[0] != "fd00:10:0:3:: lladdr 0a:00:00:00:00:03" {
		t.Errorf("neigh %q: want only the overlay family's", s.neigh)
	}
	if len(s.fdb) != 1 || s.fdb[0] != "0a:00:00:00:00:03 dst 192.168.1.3" {
		t.Errorf("fdb %q: want one, over the IPv4 underlay", s.fdb)
	}
}

// TestFakeUnderlayFamilyKept: an interface that loses its IPv4 address
// (the underlay) keeps its VTEP on IPv4, not moved to IPv6 behind the
// peers' backs: they reach this node at the PublicIP it published, and its
// pods' MTU counts IPv4's overhead.
func TestFakeUnderlayFamilyKept(t *testing.T) {
	local := subnet.Lease{Subnet: netip.MustParsePrefix("10.244.1.0/24"), IPv6Subnet: netip.MustParsePrefix("fd00:10:0:1::/64")}
	f := newV6Node(t, dualConf, `{"Type":"vxlan"}`, local, netip.MustParsePrefix("192.168.1.1/24"), netip.MustParsePrefix("fd99::1/64"))
	peer := peer6("10.244.2.0/24", "fd00:10:0:2::/64", "10.0.0.2", "fd98::2", "0a:00:00:00:00:02")
	if s := reconcile(t, f, peer); !strings.Contains(s.device, "mtu 1450") || !strings.Contains(s.device, "local 192.168.1.1") {
		t.Fatalf("device %s: want the IPv4 underlay", s.device)
	}
	ext := f.b.opts.ExtIface
	ext.Addr, ext.PublicIP, ext.OnLink = netip.Addr{}, netip.Addr{}, []netip.Prefix{netip.MustParsePrefix("fd99::/64")}
	f.nw.ExternalChanged(ext)
	s := reconcile(t, f, peer)
	if !strings.Contains(s.device, "mtu 1450") || !strings.Contains(s.device, "local 192.168.1.1") {
		t.Errorf("device %s: the underlay moved to IPv6 with the IPv4 address gone", s.device)
	}
	if len(s.fdb) != 1 || s.fdb[0] != "0a:00:00:00:00:02 dst 10.0.0.2" {
		t.Errorf("fdb %q: want the entry to the peer's IPv4 address kept", s.fdb)
	}
	if !strings.Contains(f.log.String(), "lost the address the overlay runs over") {
		t.Errorf("no warning in the log:\n%s", f.log.String())
	}
}
