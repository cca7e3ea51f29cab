package kernelsync

import (
	"net/netip"
	"testing"

	"github.com/twill-net/twill/nl"
)

// emptyKernel is a route kind over a kernel that holds nothing and takes
// every change: what is left is the engine's own cost.
type emptyKernel struct{ routeKind }

func (emptyKernel) list() ([]nl.Route, error)            { return nil, nil }
func (emptyKernel) apply(_ nl.Op, vs []nl.Route) []error { return make([]error, len(vs)) }

// BenchmarkOwnedSetFirstSync20000 is the engine's part of a node's
// start-up at 20,000 peers: the desired set built, compared with an empty
// kernel and recorded, without the kernel's own cost.
func BenchmarkOwnedSetFirstSync20000(b *testing.B) {
	rs := make([]nl.Route, 20000)
	for i := range rs {
		rs[i] = nl.Route{Dst: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i >> 8), byte(i), 0}), 24),
			Gw: netip.AddrFrom4([4]byte{192, 168, byte(i >> 8), byte(i)}), LinkIndex: 2}
	}
	b.ReportAllocs()
	for range b.N {
		s := &ownedSet[nl.Key, nl.Route]{kind: emptyKernel{}}
		c, err := s.plan(func(emit func(nl.Route)) {
			for _, r := range rs {
				emit(r)
			}
		})
		if err != nil {
			b.Fatal(err)
		}
		if st, err := c.both(); err != nil || st.Added != len(rs) {
			b.Fatal(st, err)
		}
	}
}
