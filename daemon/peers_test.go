package daemon

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/twill-net/twill/subnet"
)

func lease(s, pub string) subnet.Lease {
	return subnet.Lease{Subnet: netip.MustParsePrefix(s), Attrs: subnet.LeaseAttrs{PublicIP: netip.MustParseAddr(pub), BackendType: "host-gw"}}
}

func names(ls []subnet.Lease) []string {
	var out []string
	for _, l := range ls {
		out = append(out, l.String()+" via "+l.Attrs.PublicIP.String())
	}
	slices.Sort(out)
	return out
}

// TestPeerSetDelta: changes folded in come out as what changed, with the
// local lease, refused records and unchanged re-puts left out; a full set
// comes out whole.
func TestPeerSetDelta(t *testing.T) {
	var log strings.Builder
	s := newPeerSet(slog.New(slog.NewTextHandler(&log, nil)))
	cfg, err := subnet.ParseConfig([]byte(`{"Network":"10.244.0.0/16","Backend":{"Type":"host-gw"}}`))
	if err != nil {
		t.Fatal(err)
	}
	local := lease("10.244.1.0/24", "192.168.1.1")
	if have, _ := s.ready(); have {
		t.Fatal("ready before the first full set")
	}
	s.apply(subnet.Change{Full: true, Set: []subnet.Entry{
		{Key: "a", Lease: local},
		{Key: "b", Lease: lease("10.244.2.0/24", "192.168.1.2")},
		{Key: "c", Lease: lease("10.244.3.0/24", "192.168.1.3")},
	}})
	if have, full := s.ready(); !have || !full {
		t.Fatal("a full set is not reported as due")
	}
	if got := names(s.all(cfg, local)); !slices.Equal(got, []string{"10.244.2.0/24 via 192.168.1.2", "10.244.3.0/24 via 192.168.1.3"}) {
		t.Fatalf("all: %q", got)
	}
	if _, full := s.ready(); full {
		t.Fatal("still due after all()")
	}

	s.apply(subnet.Change{Set: []subnet.Entry{
		{Key: "b", Lease: lease("10.244.2.0/24", "192.168.1.2")},  // re-put, unchanged
		{Key: "c", Lease: lease("10.244.3.0/24", "192.168.1.33")}, // moved
		{Key: "d", Lease: lease("10.244.4.0/24", "192.168.1.4")},  // new
		{Key: "e", Lease: lease("10.99.0.0/24", "192.168.1.5")},   // outside the Network
		{Key: "f", Err: errors.New("garbage")},                    // not a lease
	}})
	up, rm := s.delta(cfg, local)
	if got := names(up); !slices.Equal(got, []string{"10.244.3.0/24 via 192.168.1.33", "10.244.4.0/24 via 192.168.1.4"}) {
		t.Errorf("upserted %q", got)
	}
	if len(rm) != 0 {
		t.Errorf("removed %q", names(rm))
	}
	if peers, refused := s.count(); peers != 3 || refused != 2 {
		t.Errorf("count %d peers, %d refused; want 3, 2", peers, refused)
	}
	if !strings.Contains(log.String(), "10.99.0.0/24") || !strings.Contains(log.String(), "garbage") {
		t.Errorf("the refusals were not logged:\n%s", log.String())
	}

	s.apply(subnet.Change{Deleted: []string{"d", "zzz"}, Set: []subnet.Entry{{Key: "e", Lease: lease("10.244.5.0/24", "192.168.1.5")}}})
	up, rm = s.delta(cfg, local)
	if got := names(rm); !slices.Equal(got, []string{"10.244.4.0/24 via 192.168.1.4"}) {
		t.Errorf("removed %q", got)
	}
	if got := names(up); !slices.Equal(got, []string{"10.244.5.0/24 via 192.168.1.5"}) {
		t.Errorf("upserted %q", got)
	}
	if !strings.Contains(log.String(), "lease no longer refused") {
		t.Errorf("the mended lease was not logged:\n%s", log.String())
	}
	if up, rm := s.delta(cfg, local); len(up)+len(rm) != 0 {
		t.Errorf("nothing changed, yet %q / %q", names(up), names(rm))
	}
}

// A lease that takes another's public IP (overwritten by a client that is
// not its node) is refused, the peer stays routed as it was, the first
// holder keeps the address, and the conflict is counted once. This node's
// own address is never another lease's.
func TestPeerSetPublicIPConflicts(t *testing.T) {
	var log strings.Builder
	s := newPeerSet(slog.New(slog.NewTextHandler(&log, nil)))
	cfg, err := subnet.ParseConfig([]byte(`{"Network":"10.244.0.0/16","Backend":{"Type":"host-gw"}}`))
	if err != nil {
		t.Fatal(err)
	}
	local := lease("10.244.1.0/24", "192.168.1.1")
	s.apply(subnet.Change{Full: true, Set: []subnet.Entry{
		{Key: "a", Lease: local},
		{Key: "b", Lease: lease("10.244.2.0/24", "192.168.1.2")},
		{Key: "c", Lease: lease("10.244.3.0/24", "192.168.1.3")},
	}})
	s.all(cfg, local)

	// c overwritten with b's address: nothing changes in the kernel.
	s.apply(subnet.Change{Set: []subnet.Entry{{Key: "c", Lease: lease("10.244.3.0/24", "192.168.1.2")}}})
	up, rm := s.delta(cfg, local)
	if len(up) != 0 || len(rm) != 0 {
		t.Fatalf("c claiming b's address: upserted %q, removed %q; want neither (c stays routed as it was)", names(up), names(rm))
	}
	if got := s.conflictCount(); got != 1 {
		t.Errorf("conflicts %d, want 1", got)
	}
	if !strings.Contains(log.String(), "public IP 192.168.1.2 is held by b (10.244.2.0/24)") {
		t.Errorf("the refusal does not name the holder:\n%s", log.String())
	}
	// A full reconcile meanwhile keeps c's last good record.
	if got := names(s.all(cfg, local)); !slices.Equal(got, []string{"10.244.2.0/24 via 192.168.1.2", "10.244.3.0/24 via 192.168.1.3"}) {
		t.Fatalf("all during the conflict: %q", got)
	}
	if got := s.conflictCount(); got != 1 {
		t.Errorf("conflicts %d after a resync of the same conflict, want still 1", got)
	}
	// c's node writes its lease back: nothing to do, nothing refused.
	s.apply(subnet.Change{Set: []subnet.Entry{{Key: "c", Lease: lease("10.244.3.0/24", "192.168.1.3")}}})
	if up, rm := s.delta(cfg, local); len(up) != 0 || len(rm) != 0 {
		t.Fatalf("c written back: upserted %q, removed %q; want neither", names(up), names(rm))
	}
	if _, refused := s.count(); refused != 0 {
		t.Errorf("%d refused after c was written back", refused)
	}

	// This node's address, claimed by a newcomer: refused.
	s.apply(subnet.Change{Set: []subnet.Entry{{Key: "d", Lease: lease("10.244.4.0/24", "192.168.1.1")}}})
	if up, _ := s.delta(cfg, local); len(up) != 0 {
		t.Fatalf("a lease with this node's address was programmed: %q", names(up))
	}
	if !strings.Contains(log.String(), "public IP 192.168.1.1 is held by this node") {
		t.Errorf("the refusal does not say the address is this node's:\n%s", log.String())
	}

	// b leaves and e takes its address in the same batch: e is a peer.
	s.apply(subnet.Change{Set: []subnet.Entry{{Key: "e", Lease: lease("10.244.5.0/24", "192.168.1.2")}}, Deleted: []string{"b", "d"}})
	if up, rm := s.delta(cfg, local); !slices.Equal(names(up), []string{"10.244.5.0/24 via 192.168.1.2"}) || !slices.Equal(names(rm), []string{"10.244.2.0/24 via 192.168.1.2"}) {
		t.Fatalf("b gone, e on its address: upserted %q, removed %q", names(up), names(rm))
	}
}

// Two leases new to this node that claim one address: the lower key holds
// it, whatever the map's order.
func TestPeerSetConflictFirstListing(t *testing.T) {
	cfg, err := subnet.ParseConfig([]byte(`{"Network":"10.244.0.0/16","Backend":{"Type":"host-gw"}}`))
	if err != nil {
		t.Fatal(err)
	}
	local := lease("10.244.1.0/24", "192.168.1.1")
	for range 20 {
		s := newPeerSet(slog.New(slog.NewTextHandler(io.Discard, nil)))
		s.apply(subnet.Change{Full: true, Set: []subnet.Entry{
			{Key: "k1", Lease: lease("10.244.2.0/24", "192.168.1.7")},
			{Key: "k2", Lease: lease("10.244.3.0/24", "192.168.1.7")},
			{Key: "k3", Lease: lease("10.244.4.0/24", "192.168.1.8")},
		}})
		if got := names(s.all(cfg, local)); !slices.Equal(got, []string{"10.244.2.0/24 via 192.168.1.7", "10.244.4.0/24 via 192.168.1.8"}) {
			t.Fatalf("all: %q, want k1 (the lower key) to hold 192.168.1.7", got)
		}
	}
}

// twilld and twillctl status (subnet.Peers, a single listing) name the
// same holder of a contested address, whatever the records' keys (node
// names in Kubernetes mode, which need not sort as the subnets do): one
// rule, subnet.PublicIPClaims.
func TestPeerSetConflictWinnerAsStatusNamesIt(t *testing.T) {
	cfg, err := subnet.ParseConfig([]byte(`{"Network":"10.244.0.0/16","Backend":{"Type":"host-gw"}}`))
	if err != nil {
		t.Fatal(err)
	}
	local := lease("10.244.1.0/24", "192.168.1.1")
	entries := []subnet.Entry{
		{Key: "node-b", Lease: lease("10.244.2.0/24", "192.168.1.7")},
		{Key: "node-a", Lease: lease("10.244.3.0/24", "192.168.1.7")},
		{Key: "node-c", Lease: lease("10.244.4.0/24", "192.168.1.7")},
	}
	snap := subnet.Snapshot{}
	for _, e := range entries {
		snap.Leases = append(snap.Leases, e.Lease)
	}
	status, refused := subnet.Peers(cfg, local, snap, nil)
	s := newPeerSet(slog.New(slog.NewTextHandler(io.Discard, nil)))
	s.apply(subnet.Change{Full: true, Set: entries})
	if got, want := names(s.all(cfg, local)), names(status); !slices.Equal(got, want) || len(got) != 1 {
		t.Fatalf("twilld programs %q, twillctl status names %q (refused %v): want one and the same", got, want, refused)
	}
}

// A lease refused for claiming an address another lease held is programmed
// as soon as the holder is gone, not at the next full reconcile.
func TestPeerSetConflictFreed(t *testing.T) {
	s := newPeerSet(slog.New(slog.NewTextHandler(io.Discard, nil)))
	cfg, err := subnet.ParseConfig([]byte(`{"Network":"10.244.0.0/16","Backend":{"Type":"host-gw"}}`))
	if err != nil {
		t.Fatal(err)
	}
	local := lease("10.244.1.0/24", "192.168.1.1")
	s.apply(subnet.Change{Full: true, Set: []subnet.Entry{{Key: "a", Lease: local}, {Key: "b", Lease: lease("10.244.2.0/24", "192.168.1.2")}}})
	s.all(cfg, local)
	// A new node on b's address while b's lease lingers: refused.
	s.apply(subnet.Change{Set: []subnet.Entry{{Key: "x", Lease: lease("10.244.9.0/24", "192.168.1.2")}}})
	if up, _ := s.delta(cfg, local); len(up) != 0 {
		t.Fatalf("x programmed while b holds its address: %q", names(up))
	}
	// b's lease goes: x is programmed in the same step.
	s.apply(subnet.Change{Deleted: []string{"b"}})
	up, rm := s.delta(cfg, local)
	if !slices.Equal(names(up), []string{"10.244.9.0/24 via 192.168.1.2"}) || !slices.Equal(names(rm), []string{"10.244.2.0/24 via 192.168.1.2"}) {
		t.Fatalf("b gone: upserted %q, removed %q; want x in, b out", names(up), names(rm))
	}
	if _, refused := s.count(); refused != 0 {
		t.Errorf("%d refused after b left", refused)
	}
}

// A hundred records refused at once (a client with a node's credentials
// can write any number) are logged one by one up to maxRefusalsLogged,
// and the rest in one line that counts them; more trickling in within the
// minute are counted, not logged, at most one line every 10 s. The count
// of refused records is all of them.
func TestPeerSetRefusalsSummarised(t *testing.T) {
	var log strings.Builder
	s := newPeerSet(slog.New(slog.NewTextHandler(&log, nil)))
	cfg, err := subnet.ParseConfig([]byte(`{"Network":"10.244.0.0/16","Backend":{"Type":"host-gw"}}`))
	if err != nil {
		t.Fatal(err)
	}
	local := lease("10.244.1.0/24", "192.168.1.1")
	set := []subnet.Entry{{Key: "own", Lease: local}}
	for i := range 100 {
		set = append(set, subnet.Entry{Key: fmt.Sprintf("rogue-%03d", i), Err: fmt.Errorf("etcd key rogue-%03d: a value of 1048576 bytes, over the 8192 a lease may have", i)})
	}
	s.apply(subnet.Change{Full: true, Set: set})
	s.all(cfg, local)
	if got := strings.Count(log.String(), "refusing lease; no route"); got != maxRefusalsLogged {
		t.Errorf("%d refusals logged one by one, want %d:\n%s", got, maxRefusalsLogged, log.String())
	}
	if !strings.Contains(log.String(), fmt.Sprintf("more=%d refused=100", 100-maxRefusalsLogged)) {
		t.Errorf("no line counting the rest:\n%s", log.String())
	}
	if _, refused := s.count(); refused != 100 {
		t.Errorf("%d refused, want 100", refused)
	}
	// Thirty more, one at a time, within the minute: none named, no
	// second count within 10 s.
	log.Reset()
	for i := range 30 {
		key := fmt.Sprintf("late-%03d", i)
		s.apply(subnet.Change{Set: []subnet.Entry{{Key: key, Err: fmt.Errorf("etcd key %s: too big", key)}}})
		s.delta(cfg, local)
	}
	if log.Len() != 0 {
		t.Errorf("refusals trickling in after the budget was spent were logged:\n%s", log.String())
	}
	if _, refused := s.count(); refused != 130 {
		t.Errorf("%d refused, want 130", refused)
	}
}
