package daemon_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twill-net/twill/backend/hostgw"
	"github.com/twill-net/twill/daemon"
	"github.com/twill-net/twill/nl"
)

// Once the kernel watches run, the full reconcile (every object read back)
// is a safety net every WatchedResync, not every Resync: at 5,000 peers
// each costs 20–50 ms, which made up most of an idle node's CPU. Drift is
// still repaired at once, because the watch asks for a reconcile.
func TestFullReconcileWhileWatched(t *testing.T) {
	peer2 := peerLease("10.244.2.0/24", "192.168.1.2")
	for _, tt := range []struct {
		name      string
		watched   time.Duration
		wantFulls bool
	}{
		{name: "watched: none within the hour", watched: time.Hour, wantFulls: false},
		{name: "watched: every WatchedResync", watched: 100 * time.Millisecond, wantFulls: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e := startEngineWith(t, hostgw.Type, nil, 0, func(_ *engine, o *daemon.Options) {
				o.Resync, o.WatchedResync = 20*time.Millisecond, tt.watched
			}, peer2)
			e.node.open()
			e.waitFor("ready", e.d.Ready)
			fulls := func() int { return strings.Count(e.log.String(), "msg=reconciled full=true") }
			before := fulls()
			time.Sleep(500 * time.Millisecond) // 25 ticks of the loop
			if got := fulls() - before; (got > 0) != tt.wantFulls {
				t.Errorf("%d full reconciles in 500 ms with --resync 20ms and a watched resync of %s; want some: %v", got, tt.watched, tt.wantFulls)
			}
			rs, err := e.k.Routes(nl.FamilyAll, nl.RouteFilter{Protocol: nl.RouteProtocol})
			if err != nil || len(rs) != 1 {
				t.Fatalf("twill's routes %v, %v: want node2's", rs, err)
			}
			if err := e.k.RouteDel(rs[0]); err != nil {
				t.Fatal(err)
			}
			e.waitFor("node2's route put back", func() bool { return slices.Contains(e.routes(), "10.244.2.0/24 via 192.168.1.2 dev#2") })
		})
	}
}
