package kernelsync

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/twill-net/twill/nl"
	"github.com/twill-net/twill/nl/nlfake"
)

// TestRouteDrift: a drift report names what a sync would add, replace and
// delete, with device names, and changes nothing; after a sync of the same
// routes it is clean.
func TestRouteDrift(t *testing.T) {
	k := &nlfake.Kernel{}
	eth := k.AddLink("eth0", 1500, true)
	r := func(dst, gw string) nl.Route { return nl.Route{Dst: pfx(dst), Gw: ip(gw), LinkIndex: eth.Index} }
	desired := []nl.Route{r("10.0.3.0/24", "192.168.0.3"), r("10.0.1.0/24", "192.168.0.1"), r("10.0.2.0/24", "192.168.0.2")}
	var ops []nl.RouteOp
	for _, have := range []nl.Route{r("10.0.2.0/24", "192.168.0.2"), r("10.0.3.0/24", "192.168.0.99"), r("10.0.9.0/24", "192.168.0.9")} {
		ops = append(ops, nl.RouteOp{Op: nl.OpAdd, Route: Owned(have, 0)})
	}
	if errs := k.RouteBatch(ops); errors.Join(errs...) != nil {
		t.Fatal(errors.Join(errs...))
	}
	before := routes(t, k, 0)
	d, err := RouteDrift(k, 0, desired)
	if err != nil {
		t.Fatal(err)
	}
	dsts := func(lines []string) (out []string) {
		for _, l := range lines {
			out = append(out, strings.Fields(l)[1])
		}
		return out
	}
	if got := dsts(d.Missing); !slices.Equal(got, []string{"10.0.1.0/24"}) {
		t.Errorf("Missing %q", d.Missing)
	}
	if got := dsts(d.Wrong); !slices.Equal(got, []string{"10.0.3.0/24"}) || !strings.Contains(d.Wrong[0], "via 192.168.0.3 dev eth0") {
		t.Errorf("Wrong %q: want 10.0.3.0/24 as it should be, via 192.168.0.3 dev eth0", d.Wrong)
	}
	if got := dsts(d.Extra); !slices.Equal(got, []string{"10.0.9.0/24"}) {
		t.Errorf("Extra %q", d.Extra)
	}
	if d.Objects != 3 || d.Clean() {
		t.Errorf("drift %+v: want 3 objects, not clean", d)
	}
	if after := routes(t, k, 0); !slices.Equal(before, after) {
		t.Errorf("RouteDrift changed the kernel:\nbefore %q\nafter  %q", before, after)
	}
	if _, err := (&RouteSync{NL: k}).Sync(emitRoutes(desired...)); err != nil {
		t.Fatal(err)
	}
	if d, err := RouteDrift(k, 0, desired); err != nil || !d.Clean() {
		t.Errorf("after a sync: drift %+v (%v), want clean", d, err)
	}
}

// A backend with several watches is watching once each has made its first
// check; a watch that resubscribes and checks again does not count twice.
func TestAllChecked(t *testing.T) {
	done := 0
	checked := AllChecked(3, func() { done++ })
	checked[0]()
	checked[0]() // resubscribed before the others checked
	checked[2]()
	if done != 0 {
		t.Fatalf("done after two of three watches checked (one of them twice)")
	}
	checked[1]()
	checked[1]()
	checked[0]()
	if done != 1 {
		t.Fatalf("done called %d times once all three checked, want 1", done)
	}
	none := 0
	AllChecked(0, func() { none++ })
	if none != 1 {
		t.Fatalf("no watches: done called %d times, want 1", none)
	}
}
