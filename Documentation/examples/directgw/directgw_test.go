package directgw

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

// TestReconcile runs the backend on a model of the kernel's state
// (nl/nlfake, public like backend/backendtest, so a backend in another
// module is tested the same way), without root, and checks the routes it
// holds afterwards: a backend's unit test as writing-a-backend.md
// describes it.
func TestReconcile(t *testing.T) {
	k := &nlfake.Kernel{}
	eth := k.AddLink("eth0", 1500, true, netip.MustParsePrefix("192.168.1.1/24"))
	opts := backendtest.Options(t, `{"Network":"10.244.0.0/16","Backend":{"Type":"directgw","Table":50}}`, k,
		backend.ExternalInterface{Link: eth, PublicIP: netip.MustParseAddr("192.168.1.1"), OnLink: []netip.Prefix{netip.MustParsePrefix("192.168.1.0/24")}})
	_, _, nw := backendtest.Attach(t, New, opts, "10.244.1.0/24")
	peer := func(sub, pub string) subnet.Lease {
		return subnet.Lease{Subnet: netip.MustParsePrefix(sub), Attrs: subnet.LeaseAttrs{PublicIP: netip.MustParseAddr(pub), BackendType: Type}}
	}
	table := func() []string { return backendtest.Routes(t, k, 50) }
	peers := []subnet.Lease{peer("10.244.2.0/24", "192.168.1.2"), peer("10.244.3.0/24", "10.9.9.9")}
	if err := nw.Network.Reconcile(context.Background(), peers); err != nil {
		t.Fatal(err)
	}
	if got, want := table(), []string{"10.244.2.0/24 via 192.168.1.2 dev#1 table 50"}; !slices.Equal(got, want) {
		t.Fatalf("table 50: %q, want %q (the peer off the segment is not routed)", got, want)
	}
	if err := nw.Network.Reconcile(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	if got := table(); len(got) != 0 {
		t.Fatalf("after the peer left, table 50 still has %q", got)
	}
}
