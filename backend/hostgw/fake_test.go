package hostgw

import (
	"context"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/twill-net/twill/backend"
	"github.com/twill-net/twill/backend/backendtest"
	"github.com/twill-net/twill/nl/nlfake"
	"github.com/twill-net/twill/subnet"
)

// host-gw's Reconcile against nl/nlfake, without root.

func mainTable(t *testing.T, k *nlfake.Kernel) []string {
	t.Helper()
	return backendtest.Routes(t, k, 0)
}

func fakeNode(t *testing.T) (*nlfake.Kernel, *Network, *strings.Builder) {
	t.Helper()
	k := &nlfake.Kernel{}
	eth := k.AddLink("eth0", 1500, true, netip.MustParsePrefix("192.168.1.1/24"))
	opts := backendtest.Options(t, `{"Network":"10.244.0.0/16","Backend":{"Type":"host-gw"}}`, k, backend.ExternalInterface{Link: eth,
		Addr: netip.MustParseAddr("192.168.1.1"), PublicIP: netip.MustParseAddr("192.168.1.1"), OnLink: []netip.Prefix{netip.MustParsePrefix("192.168.1.0/24")}})
	var log strings.Builder
	opts.Logger = slog.New(slog.NewTextHandler(&log, nil))
	_, _, nw := backendtest.Attach(t, New, opts, "10.244.1.0/24")
	return k, nw.Network.(*Network), &log
}

func TestFakeReconcile(t *testing.T) {
	k, nw, log := fakeNode(t)
	ctx := context.Background()
	peers := []subnet.Lease{peer("10.244.2.0/24", "192.168.1.2"), peer("10.244.3.0/24", "192.168.1.3"), peer("10.244.4.0/24", "10.9.0.4")}
	for range 3 {
		if err := nw.Reconcile(ctx, peers); err != nil {
			t.Fatal(err)
		}
	}
	want := []string{"10.244.2.0/24 via 192.168.1.2 dev#1", "10.244.3.0/24 via 192.168.1.3 dev#1"}
	if got := mainTable(t, k); !slices.Equal(got, want) {
		t.Fatalf("main table %q, want %q", got, want)
	}
	if n := strings.Count(log.String(), "refusing peers whose public IP is not on-link"); n != 1 {
		t.Errorf("the unreachable peer was logged %d times over three reconciles, want once:\n%s", n, log)
	}
	d, err := nw.Drift(ctx, peers)
	if err != nil || len(d.Missing)+len(d.Extra)+len(d.Wrong) != 0 || len(d.Refused) != 1 {
		t.Errorf("drift %+v, %v: want none, and the one refused peer", d, err)
	}

	// The link flaps: the kernel drops its routes without an event that
	// twill's record would contradict. twilld hands over the interface.
	k.SetUp(1, false)
	k.SetUp(1, true)
	if d, _ := nw.Drift(ctx, peers); len(d.Missing) != 2 {
		t.Errorf("drift after a flap %+v: want both routes missing", d)
	}
	nw.ExternalChanged(nw.ext)
	if err := nw.Reconcile(ctx, peers); err != nil {
		t.Fatal(err)
	}
	if got := mainTable(t, k); !slices.Equal(got, want) {
		t.Fatalf("after the flap: main table %q, want %q", got, want)
	}

	// A peer leaves.
	if err := nw.Reconcile(ctx, peers[1:]); err != nil {
		t.Fatal(err)
	}
	if got := mainTable(t, k); !slices.Equal(got, want[1:]) {
		t.Fatalf("after a peer left: main table %q, want %q", got, want[1:])
	}
}

// Update applies a change of the peer set as a full Reconcile of the new
// set would: new and moved peers' routes, and no route for a peer that
// left or whose node moved off-link.
func TestFakeUpdate(t *testing.T) {
	k, nw, log := fakeNode(t)
	ctx := context.Background()
	p2, p3, p4 := peer("10.244.2.0/24", "192.168.1.2"), peer("10.244.3.0/24", "192.168.1.3"), peer("10.244.4.0/24", "10.9.0.4")
	if err := nw.Reconcile(ctx, []subnet.Lease{p2, p3, p4}); err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		name              string
		upserted, removed []subnet.Lease
		peers             []subnet.Lease // the set after the change
		want              []string
	}{
		{"a peer joins", []subnet.Lease{peer("10.244.5.0/24", "192.168.1.5")}, nil,
			[]subnet.Lease{p2, p3, p4, peer("10.244.5.0/24", "192.168.1.5")},
			[]string{"10.244.2.0/24 via 192.168.1.2 dev#1", "10.244.3.0/24 via 192.168.1.3 dev#1", "10.244.5.0/24 via 192.168.1.5 dev#1"}},
		{"a node's address moves: the gateway follows", []subnet.Lease{peer("10.244.2.0/24", "192.168.1.22")}, nil,
			[]subnet.Lease{peer("10.244.2.0/24", "192.168.1.22"), p3, p4, peer("10.244.5.0/24", "192.168.1.5")},
			[]string{"10.244.2.0/24 via 192.168.1.22 dev#1", "10.244.3.0/24 via 192.168.1.3 dev#1", "10.244.5.0/24 via 192.168.1.5 dev#1"}},
		{"the refused peer moves on-link", []subnet.Lease{peer("10.244.4.0/24", "192.168.1.4")}, nil,
			[]subnet.Lease{peer("10.244.2.0/24", "192.168.1.22"), p3, peer("10.244.4.0/24", "192.168.1.4"), peer("10.244.5.0/24", "192.168.1.5")},
			[]string{"10.244.2.0/24 via 192.168.1.22 dev#1", "10.244.3.0/24 via 192.168.1.3 dev#1", "10.244.4.0/24 via 192.168.1.4 dev#1", "10.244.5.0/24 via 192.168.1.5 dev#1"}},
		{"a peer moves off-link: its route goes", []subnet.Lease{peer("10.244.3.0/24", "10.9.0.3")}, nil,
			[]subnet.Lease{peer("10.244.2.0/24", "192.168.1.22"), peer("10.244.3.0/24", "10.9.0.3"), peer("10.244.4.0/24", "192.168.1.4"), peer("10.244.5.0/24", "192.168.1.5")},
			[]string{"10.244.2.0/24 via 192.168.1.22 dev#1", "10.244.4.0/24 via 192.168.1.4 dev#1", "10.244.5.0/24 via 192.168.1.5 dev#1"}},
		{"two peers leave", nil, []subnet.Lease{peer("10.244.2.0/24", "192.168.1.22"), peer("10.244.5.0/24", "192.168.1.5")},
			[]subnet.Lease{peer("10.244.3.0/24", "10.9.0.3"), peer("10.244.4.0/24", "192.168.1.4")},
			[]string{"10.244.4.0/24 via 192.168.1.4 dev#1"}},
	}
	for _, s := range steps {
		if err := nw.Update(ctx, s.upserted, s.removed); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if got := mainTable(t, k); !slices.Equal(got, s.want) {
			t.Fatalf("%s: main table %q, want %q", s.name, got, s.want)
		}
		d, err := nw.Drift(ctx, s.peers)
		if err != nil || len(d.Missing)+len(d.Extra)+len(d.Wrong) != 0 {
			t.Errorf("%s: drift against a full reconcile %+v, %v: want none", s.name, d, err)
		}
	}
	if !strings.Contains(log.String(), "10.9.0.3") {
		t.Errorf("the peer that moved off-link was not reported as refused:\n%s", log)
	}
}
