package nl

import (
	"errors"
	"math"
	"net/netip"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/twill-net/twill/testsupport/netnstest"
)

// TestRouteBatchErrorsPerOp runs batches of route changes, some of which the
// kernel refuses, at the first, a middle and the last place of a batch
// (only the last message of a batch asks for an ack): each refused change
// gets its own error, every other change is applied, and deleting a route
// that is gone is not an error. It runs again with sequence numbers that
// wrap around within a batch (after four billion messages in a long-lived
// twilld).
func TestRouteBatchErrorsPerOp(t *testing.T) {
	netnstest.RequireRoot(t)
	for _, tc := range []struct {
		name string
		seq  uint32 // the last sequence number used before the batch
	}{{"fresh handle", 0}, {"sequence wraps", math.MaxUint32 - batchSize - 40}} {
		t.Run(tc.name, func(t *testing.T) { routeBatchErrorsPerOp(t, tc.seq) })
	}
}

func routeBatchErrorsPerOp(t *testing.T, seq uint32) {
	ns := netnstest.New(t, "batch")
	netnstest.Uplink(t, ns, "192.168.0.1/16")
	h, eth := openWithRoutes(t, ns, 200, 1) // 10.200.0.0/24 exists already
	existing := netip.MustParsePrefix("10.200.0.0/24")
	n := 2*batchSize + 10
	ops := make([]RouteOp, n)
	refused := map[int]bool{0: true, 100: true, batchSize - 1: true, batchSize: true, 2*batchSize - 1: true, n - 1: true}
	for i := range ops {
		dst := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i >> 8), byte(i), 0}), 24)
		r := Route{Dst: dst, Gw: netip.AddrFrom4([4]byte{192, 168, 1, byte(1 + i%250)}), LinkIndex: eth.Index, Protocol: 167}
		switch {
		case refused[i] && i%2 == 0:
			r.Gw = netip.MustParseAddr("172.31.0.1") // not on-link: ENETUNREACH
		case refused[i]:
			r.Dst, r.Gw, r.Priority = existing, netip.MustParseAddr("192.168.1.1"), 1<<20 // there already: EEXIST
		}
		ops[i] = RouteOp{Op: OpAdd, Route: r}
	}
	ops[7] = RouteOp{Op: OpDel, Route: Route{Dst: netip.MustParsePrefix("10.250.0.0/24"), LinkIndex: eth.Index, Protocol: 167}}
	h.batch.mu.Lock()
	h.batch.seq = seq
	h.batch.mu.Unlock()
	errs := h.RouteBatch(ops)
	for i, err := range errs {
		switch {
		case refused[i] && err == nil:
			t.Errorf("op %d (%v): no error, but the kernel refused it", i, ops[i].Route)
		case refused[i] && !errors.Is(err, unix.ENETUNREACH) && !errors.Is(err, unix.EEXIST):
			t.Errorf("op %d: error %v, want ENETUNREACH or EEXIST", i, err)
		case !refused[i] && err != nil:
			t.Errorf("op %d (%v): %v", i, ops[i].Route, err)
		}
	}
	rs, err := h.Routes(FamilyV4, RouteFilter{Protocol: 167})
	if err != nil {
		t.Fatal(err)
	}
	have := map[netip.Prefix]bool{}
	for _, r := range rs {
		have[r.Dst] = true
	}
	for i, op := range ops {
		if op.Op == OpAdd && !refused[i] && !have[op.Route.Dst] {
			t.Errorf("op %d: route %s not in the kernel", i, op.Route.Dst)
		}
	}
	applied := n - len(refused) - 1           // op 7 is a delete, of a route that is not there
	if want := applied + 1; len(rs) != want { // and the route there before
		t.Errorf("%d twill routes in the kernel, want %d", len(rs), want)
	}
}

// TestPrivilegedBlackholeRoundTrip: a blackhole route of twill's, added
// in a batch, is read back by a dump as the route twill asked for (so a
// sync finds it in place), and deleted by one.
func TestPrivilegedBlackholeRoundTrip(t *testing.T) {
	netnstest.RequireRoot(t)
	ns := netnstest.New(t, "bh")
	netnstest.Uplink(t, ns, "192.168.0.1/16")
	h := openNS(t, ns)
	want := []Route{
		{Dst: netip.MustParsePrefix("10.244.0.0/16"), Table: 254, Protocol: RouteProtocol, Priority: RouteMetric(netip.MustParsePrefix("10.244.0.0/16")), Type: RouteBlackhole},
		{Dst: netip.MustParsePrefix("fd10::/56"), Table: 254, Protocol: RouteProtocol, Priority: RouteMetric(netip.MustParsePrefix("fd10::/56")), Type: RouteBlackhole},
	}
	ops := []RouteOp{{Op: OpAdd, Route: want[0]}, {Op: OpAdd, Route: want[1]}}
	if err := errors.Join(h.RouteBatch(ops)...); err != nil {
		t.Fatal(err)
	}
	if out := netnstest.IP(t, ns, "route", "show", "10.244.0.0/16"); !strings.HasPrefix(out, "blackhole 10.244.0.0/16 proto 167") {
		t.Fatalf("ip route show: %q, want twill's blackhole", out)
	}
	got, err := h.Routes(FamilyAll, RouteFilter{Protocol: RouteProtocol})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || !got[0].Equal(want[0]) || !got[1].Equal(want[1]) {
		t.Fatalf("dump %v, want %v", got, want)
	}
	for i := range ops {
		ops[i].Op = OpDel
	}
	if err := errors.Join(h.RouteBatch(ops)...); err != nil {
		t.Fatal(err)
	}
	if got, _ := h.Routes(FamilyAll, RouteFilter{Protocol: RouteProtocol}); len(got) != 0 {
		t.Fatalf("after the delete, dump %v", got)
	}
}
