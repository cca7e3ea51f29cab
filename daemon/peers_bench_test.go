package daemon

import (
	"fmt"
	"io"
	"log/slog"
	"testing"

	"github.com/twill-net/twill/subnet"
)

// BenchmarkPeerSetFull20000 is the peer set's part of a node's start-up at
// 20,000 peers: the first listing folded in and handed out whole.
func BenchmarkPeerSetFull20000(b *testing.B) {
	cfg, err := subnet.ParseConfig([]byte(`{"Network":"10.0.0.0/8","Backend":{"Type":"host-gw"}}`))
	if err != nil {
		b.Fatal(err)
	}
	local := lease("10.255.1.0/24", "192.168.255.1")
	set := make([]subnet.Entry, 20000)
	for i := range set {
		l := lease(fmt.Sprintf("10.%d.%d.0/24", i/256, i%256), fmt.Sprintf("192.168.%d.%d", i/250, i%250+1))
		set[i] = subnet.Entry{Key: "/twill.io/network/subnets/" + l.Key(), Lease: l}
	}
	b.ReportAllocs()
	for range b.N {
		s := newPeerSet(slog.New(slog.NewTextHandler(io.Discard, nil)))
		s.apply(subnet.Change{Full: true, Set: set})
		if n := len(s.all(cfg, local)); n != len(set) {
			b.Fatalf("%d peers handed out, want %d", n, len(set))
		}
	}
}
