package kernelsync

import (
	"net/netip"
	"reflect"
	"testing"

	"github.com/twill-net/twill/nl"
)

func TestDiffRoutes(t *testing.T) {
	r := func(dst, gw string) nl.Route {
		return nl.Route{Dst: netip.MustParsePrefix(dst), Gw: netip.MustParseAddr(gw), LinkIndex: 2, Protocol: 167}
	}
	desired := RouteMap([]nl.Route{r("10.0.1.0/24", "192.168.0.1"), r("10.0.2.0/24", "192.168.0.2"), r("10.0.3.0/24", "192.168.0.3")})
	actual := RouteMap([]nl.Route{r("10.0.2.0/24", "192.168.0.2"), r("10.0.3.0/24", "192.168.0.99"), r("10.0.9.0/24", "192.168.0.9")})
	p := DiffRoutes(desired, actual)
	dsts := func(rs []nl.Route) (s []string) {
		for _, r := range rs {
			s = append(s, r.Dst.String())
		}
		return s
	}
	if got := dsts(p.Add); !reflect.DeepEqual(got, []string{"10.0.1.0/24"}) {
		t.Errorf("Add %v", got)
	}
	if got := dsts(p.Replace); !reflect.DeepEqual(got, []string{"10.0.3.0/24"}) || p.Replace[0].Gw.String() != "192.168.0.3" {
		t.Errorf("Replace %v", p.Replace)
	}
	if got := dsts(p.Delete); !reflect.DeepEqual(got, []string{"10.0.9.0/24"}) {
		t.Errorf("Delete %v", got)
	}
	if !DiffRoutes(desired, desired).Empty() {
		t.Error("diff of a set with itself is not empty")
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
