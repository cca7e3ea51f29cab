package vxlan

import (
	"context"
	"net/netip"
	"slices"
	"testing"

	"github.com/twill-net/twill/backend"
	"github.com/twill-net/twill/backend/backendtest"
	"github.com/twill-net/twill/nl/nlfake"
	"github.com/twill-net/twill/subnet"
)

// A node whose lease changed (its Node registered again with another
// podCIDR) keeps its VTEP across twilld's restart: the address of the old
// lease goes, or the kernel may pick it as the source of the node's own
// packets, to which no peer routes any more.
func TestVTEPAddressOfAnEarlierLeaseGoes(t *testing.T) {
	k := &nlfake.Kernel{}
	eth := k.AddLink("eth0", 1500, true, netip.MustParsePrefix("192.168.1.1/24"))
	state := t.TempDir()
	peers := []subnet.Lease{lease("10.244.2.0/24", "192.168.1.2", "6e:00:00:00:00:02")}
	for _, local := range []string{"10.244.1.0/24", "10.244.7.0/24"} {
		opts := backendtest.Options(t, `{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan"}}`, k, backend.ExternalInterface{Link: eth,
			Addr: netip.MustParseAddr("192.168.1.1"), PublicIP: netip.MustParseAddr("192.168.1.1")})
		opts.StateDir = state
		_, _, nw := backendtest.Attach(t, New, opts, local)
		if err := nw.Network.Reconcile(context.Background(), peers); err != nil {
			t.Fatal(err)
		}
		if got, want := dump(t, k).addrs, []string{netip.MustParsePrefix(local).Addr().String() + "/32"}; !slices.Equal(got, want) {
			t.Errorf("lease %s: twill.1's addresses %q, want %q", local, got, want)
		}
	}
}
