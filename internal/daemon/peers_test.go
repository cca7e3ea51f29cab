package daemon

import (
	"errors"
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
