package nl

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/twill-net/twill/testsupport/netnstest"
)

// referenceRoutes is what Routes returned when it read routes through the
// netlink package: the reference its own decoder must agree with.
func referenceRoutes(h *Handle, family Family, f RouteFilter) ([]Route, error) {
	filter := &netlink.Route{Table: f.Table, Protocol: netlink.RouteProtocol(f.Protocol), LinkIndex: f.LinkIndex}
	mask := netlink.RT_FILTER_TABLE
	switch {
	case f.AllTables:
		filter.Table = unix.RT_TABLE_UNSPEC
	case filter.Table == 0:
		filter.Table = unix.RT_TABLE_MAIN
	}
	if f.Protocol != 0 {
		mask |= netlink.RT_FILTER_PROTOCOL
	}
	if f.LinkIndex != 0 {
		mask |= netlink.RT_FILTER_OIF
	}
	var out []Route
	err := h.h.RouteListFilteredIter(int(family), filter, mask, func(r netlink.Route) bool {
		if r.Type == unix.RTN_UNICAST && r.Dst != nil {
			out = append(out, fromNetlinkRoute(r))
		}
		return true
	})
	return out, err
}

// TestRoutesMatchNetlinkPackage fills a namespace with routes of every
// shape twill and its neighbours make (both families, default routes,
// onlink, link scope, preferred sources, metrics, other tables and
// protocols, a multipath route, thousands of twill's) and checks that the
// dump decoder returns what the netlink package's decoder did, for every
// filter twill uses.
func TestRoutesMatchNetlinkPackage(t *testing.T) {
	netnstest.RequireRoot(t)
	ns := netnstest.New(t, "dump")
	netnstest.Uplink(t, ns, "192.168.0.1/16")
	netnstest.IP(t, ns, "-6", "addr", "add", "fd00::1/64", "dev", "eth0", "nodad")
	netnstest.IP(t, ns, "link", "add", "dummy0", "type", "veth", "peer", "name", "dummy1")
	netnstest.IP(t, ns, "link", "set", "dummy0", "up")
	for _, args := range [][]string{
		{"route", "add", "default", "via", "192.168.0.254"},
		{"-6", "route", "add", "default", "via", "fd00::fe"},
		{"route", "add", "10.1.0.0/24", "via", "192.168.1.1", "proto", "167", "metric", "1048832"},
		{"route", "add", "10.2.0.0/24", "via", "10.2.0.0", "dev", "dummy0", "onlink", "proto", "167"},
		{"route", "add", "10.3.0.0/24", "dev", "dummy0", "scope", "link", "src", "192.168.0.1"},
		{"route", "add", "10.4.0.0/24", "via", "192.168.1.4", "table", "100", "proto", "167"},
		{"route", "add", "10.5.0.0/24", "via", "192.168.1.5", "table", "1000"},
		{"route", "add", "10.6.0.0/24", "nexthop", "via", "192.168.1.6", "nexthop", "via", "192.168.1.7"},
		{"route", "add", "blackhole", "10.7.0.0/24"},
		{"-6", "route", "add", "fd00:10:1::/64", "via", "fd00::11", "proto", "167", "metric", "7"},
		{"-6", "route", "add", "fd00:10:2::/64", "dev", "dummy0", "table", "100"},
	} {
		netnstest.IP(t, ns, args...)
	}
	h, eth := openWithRoutes(t, ns, 100, 3000)
	for _, fam := range []Family{FamilyAll, FamilyV4, FamilyV6} {
		for _, f := range []RouteFilter{{}, {AllTables: true}, {Table: 100}, {Table: 1000}, {Protocol: 167}, {LinkIndex: eth.Index}, {Table: 100, Protocol: 167}} {
			got, err := h.Routes(fam, f)
			if err != nil {
				t.Fatal(err)
			}
			want, err := referenceRoutes(h, fam, f)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) == 0 && f == (RouteFilter{}) {
				t.Fatalf("family %d: no routes in the main table", fam)
			}
			if !slices.Equal(got, want) {
				t.Errorf("family %d filter %+v: %d routes, netlink package %d; first difference: %v", fam, f, len(got), len(want), firstDiff(got, want))
			}
		}
	}
}

func firstDiff(a, b []Route) string {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return fmt.Sprintf("#%d %+v vs %+v", i, a[i], b[i])
		}
	}
	return "one list is longer"
}

// openNS opens a handle in ns, closed at the end of the test.
func openNS(tb testing.TB, ns string) *Handle {
	tb.Helper()
	h, err := Open(ns)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(h.Close)
	return h
}

// linkNamed is the link called name, as h reads it.
func linkNamed(tb testing.TB, h *Handle, name string) Link {
	tb.Helper()
	l, err := h.LinkByName(name)
	if err != nil {
		tb.Fatal(err)
	}
	return l
}

// openWithRoutes opens a handle in ns (closed at the end of the test) and
// adds n twill routes through its eth0: 10.<from+i/256>.<i%256>.0/24, each
// via its own node address on 192.168.0.0/16, with twill's metrics.
func openWithRoutes(tb testing.TB, ns string, from, n int) (*Handle, Link) {
	tb.Helper()
	h := openNS(tb, ns)
	eth := linkNamed(tb, h, "eth0")
	batch := make([]RouteOp, n)
	for i := range batch {
		dst := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(from + i>>8), byte(i), 0}), 24)
		gw := netip.AddrFrom4([4]byte{192, 168, byte(1 + i/250), byte(1 + i%250)})
		batch[i] = RouteOp{Op: OpAdd, Route: Route{Dst: dst, Gw: gw, LinkIndex: eth.Index, Protocol: 167, Priority: 1<<20 + i}}
	}
	for i, err := range h.RouteBatch(batch) {
		if err != nil {
			tb.Fatalf("route %d: %v", i, err)
		}
	}
	return h, eth
}

// BenchmarkRoutesDump20000 reads 20,000 routes back, as the route watch's
// check and every --resync do, with twill's decoder and, for reference,
// with the netlink package's.
func BenchmarkRoutesDump20000(b *testing.B) {
	netnstest.RequireRoot(b)
	ns := netnstest.New(b, "dump")
	netnstest.Uplink(b, ns, "192.168.0.1/16")
	h, _ := openWithRoutes(b, ns, 0, 20000)
	for name, list := range map[string]func(*Handle, Family, RouteFilter) ([]Route, error){
		"twill": (*Handle).Routes, "netlink-package": referenceRoutes,
	} {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for range b.N {
				rs, err := list(h, FamilyAll, RouteFilter{})
				if err != nil || len(rs) < 20000 {
					b.Fatalf("%d routes, %v", len(rs), err)
				}
			}
		})
	}
}

// referenceNeighs is what Neighs and FDB returned when they read entries
// through the netlink package.
func referenceNeighs(h *Handle, index, family int, fdb bool) ([]Neigh, error) {
	ns, err := h.h.NeighList(index, family)
	if err != nil {
		return nil, err
	}
	var out []Neigh
	for _, n := range ns {
		ip, ok := netip.AddrFromSlice(n.IP)
		if !ok || (fdb && n.LinkIndex != index) {
			continue
		}
		out = append(out, Neigh{LinkIndex: n.LinkIndex, IP: ip.Unmap(), HardwareAddr: append([]byte(nil), n.HardwareAddr...), Permanent: n.State&netlink.NUD_PERMANENT != 0})
	}
	return out, nil
}

// TestNeighsMatchNetlinkPackage checks the neighbour and FDB decoder
// against the netlink package's, on a VXLAN device with thousands of
// permanent entries of both families beside entries on another link.
func TestNeighsMatchNetlinkPackage(t *testing.T) {
	netnstest.RequireRoot(t)
	ns := vxlanNS(t, "dump")
	netnstest.IP(t, ns, "link", "set", "twill.1", "up")
	netnstest.IP(t, ns, "neigh", "add", "192.168.7.7", "lladdr", "02:00:00:00:07:07", "dev", "eth0", "nud", "reachable")
	netnstest.IP(t, ns, "-6", "neigh", "add", "fd00::7", "lladdr", "02:00:00:00:07:08", "dev", "eth0", "nud", "permanent")
	h := openNS(t, ns)
	vx, eth := linkNamed(t, h, "twill.1"), linkNamed(t, h, "eth0")
	var ops []NeighOp
	for i := range 2000 {
		mac := []byte{0x0a, 0xb0, 0, 0, byte(i >> 8), byte(i)}
		ops = append(ops,
			NeighOp{Op: OpAdd, Neigh: Neigh{LinkIndex: vx.Index, IP: netip.AddrFrom4([4]byte{10, byte(i >> 8), byte(i), 0}), HardwareAddr: mac, Permanent: true}},
			NeighOp{Op: OpAdd, FDB: true, Neigh: Neigh{LinkIndex: vx.Index, IP: netip.AddrFrom4([4]byte{192, 168, byte(1 + i/250), byte(1 + i%250)}), HardwareAddr: mac, Permanent: true}})
		if i%10 == 0 {
			ops = append(ops, NeighOp{Op: OpAdd, Neigh: Neigh{LinkIndex: vx.Index, IP: netip.MustParseAddr(fmt.Sprintf("fd00:10:%x::", i)), HardwareAddr: mac, Permanent: true}})
		}
	}
	for i, err := range h.NeighBatch(ops) {
		if err != nil {
			t.Fatalf("entry %d: %v", i, err)
		}
	}
	for _, index := range []int{vx.Index, eth.Index} {
		for _, fam := range []Family{FamilyAll, FamilyV4, FamilyV6} {
			got, want := settled(t, func() ([]Neigh, error) { return h.Neighs(index, fam) },
				func() ([]Neigh, error) { return referenceNeighs(h, index, int(fam), false) })
			if !slices.EqualFunc(got, want, sameNeigh) || len(got) == 0 {
				t.Errorf("neighbours of #%d family %d: %d, netlink package %d", index, fam, len(got), len(want))
			}
		}
		got, want := settled(t, func() ([]Neigh, error) { return h.FDB(index) },
			func() ([]Neigh, error) { return referenceNeighs(h, index, unix.AF_BRIDGE, true) })
		if !slices.EqualFunc(got, want, sameNeigh) || (index == vx.Index && len(got) != 2000) {
			t.Errorf("fdb of #%d: %d, netlink package %d", index, len(got), len(want))
		}
	}
}

// vxlanNS is a namespace with an uplink eth0 (192.168.0.1/16) and a VXLAN
// device twill.1 on it, as the vxlan backend makes it (down).
func vxlanNS(t *testing.T, role string) string {
	t.Helper()
	ns := netnstest.New(t, role)
	netnstest.Uplink(t, ns, "192.168.0.1/16")
	netnstest.IP(t, ns, "link", "add", "twill.1", "type", "vxlan", "id", "1", "dev", "eth0", "local", "192.168.0.1", "dstport", "8472", "nolearning")
	return ns
}

func sameNeigh(a, b Neigh) bool {
	return a.LinkIndex == b.LinkIndex && a.IP == b.IP && slices.Equal(a.HardwareAddr, b.HardwareAddr) && a.Permanent == b.Permanent
}

// settled reads entries with ours between two reads with the reference
// that agree: the kernel adds entries of its own now and then (a multicast
// neighbour when a device sends its first IPv6 packets), and one arriving
// between two reads is no disagreement of the decoders.
func settled(t *testing.T, ours, reference func() ([]Neigh, error)) (got, want []Neigh) {
	t.Helper()
	for range 10 {
		before, err := reference()
		if err != nil {
			t.Fatal(err)
		}
		if got, err = ours(); err != nil {
			t.Fatal(err)
		}
		if want, err = reference(); err != nil {
			t.Fatal(err)
		}
		if slices.EqualFunc(before, want, sameNeigh) {
			return got, want
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatal("the kernel's entries kept changing for 10 reads")
	return nil, nil
}
