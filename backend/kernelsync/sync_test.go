package kernelsync

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twill-net/twill/nl"
	"github.com/twill-net/twill/nl/nlfake"
)

// The engines are tested against nl/nlfake, a model of the
// kernel's state: each test sets the kernel up, syncs, and asserts what
// the kernel holds afterwards, as `ip route` would show it.

var (
	_ nl.RouteTable = (*nlfake.Kernel)(nil)
	_ nl.NeighTable = (*nlfake.Kernel)(nil)
	_ nl.RuleTable  = (*nlfake.Kernel)(nil)
)

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }
func ip(s string) netip.Addr    { return netip.MustParseAddr(s) }

// routes lists a table's routes as `ip route` would, owned ones marked.
func routes(t *testing.T, k *nlfake.Kernel, table int) []string {
	t.Helper()
	rs, err := k.Routes(nl.FamilyAll, nl.RouteFilter{Table: table})
	if err != nil {
		t.Fatal(err)
	}
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = r.String()
		if r.Protocol == nl.RouteProtocol {
			out[i] += " proto twill"
		}
	}
	slices.Sort(out)
	return out
}

func want(t *testing.T, what string, got, want []string) {
	t.Helper()
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("%s:\n got  %q\n want %q", what, got, want)
	}
}

func emitRoutes(rs ...nl.Route) func(func(nl.Route)) {
	return func(emit func(nl.Route)) {
		for _, r := range rs {
			emit(r)
		}
	}
}

func TestRouteSyncConvergesAndLeavesForeignRoutes(t *testing.T) {
	k := &nlfake.Kernel{}
	eth := k.AddLink("eth0", 1500, true, pfx("192.168.1.10/24"))
	// Before twilld: a route of someone else's, a twill route from a
	// previous run that no lease backs now, one with a stale gateway, and
	// one from a twill that programmed no metric.
	for _, r := range []nl.Route{
		{Dst: pfx("10.0.0.0/8"), Gw: ip("192.168.1.1"), LinkIndex: eth.Index, Protocol: 4},
		Owned(nl.Route{Dst: pfx("10.244.9.0/24"), Gw: ip("192.168.1.9"), LinkIndex: eth.Index}, 0),
		Owned(nl.Route{Dst: pfx("10.244.2.0/24"), Gw: ip("192.168.1.99"), LinkIndex: eth.Index}, 0),
		{Dst: pfx("10.244.3.0/24"), Gw: ip("192.168.1.13"), LinkIndex: eth.Index, Protocol: nl.RouteProtocol},
	} {
		if errs := k.RouteBatch([]nl.RouteOp{{Op: nl.OpAdd, Route: r}}); errs[0] != nil {
			t.Fatal(errs[0])
		}
	}
	s := &RouteSync{NL: k}
	st, err := s.Sync(emitRoutes(
		nl.Route{Dst: pfx("10.244.1.0/24"), Gw: ip("192.168.1.11"), LinkIndex: eth.Index},
		nl.Route{Dst: pfx("10.244.2.0/24"), Gw: ip("192.168.1.12"), LinkIndex: eth.Index},
		nl.Route{Dst: pfx("10.244.3.0/24"), Gw: ip("192.168.1.13"), LinkIndex: eth.Index},
	))
	if err != nil {
		t.Fatal(err)
	}
	want(t, "main table", routes(t, k, 0), []string{
		"10.0.0.0/8 via 192.168.1.1 dev#1",
		"10.244.1.0/24 via 192.168.1.11 dev#1 proto twill",
		"10.244.2.0/24 via 192.168.1.12 dev#1 proto twill",
		"10.244.3.0/24 via 192.168.1.13 dev#1 proto twill",
	})
	if rs, _ := k.Routes(nl.FamilyAll, nl.RouteFilter{Protocol: nl.RouteProtocol}); !slices.ContainsFunc(rs, func(r nl.Route) bool {
		return r.Dst == pfx("10.244.3.0/24") && r.Priority == nl.RouteMetric(r.Dst)
	}) {
		t.Errorf("the route without a metric was not replaced by one with twill's: %v", rs)
	}
	if st.Added != 2 || st.Replaced != 1 || st.Deleted != 2 || !st.Dumped {
		t.Errorf("stats %+v, want 2 added, 1 replaced, 2 deleted, after a dump", st)
	}
	if st.Repaired != 2 {
		t.Errorf("Repaired = %d, want 2 (the route no lease backs, the one without a metric)", st.Repaired)
	}

	// Nothing to do: nothing changes, nothing is read back.
	st, err = s.Sync(emitRoutes(
		nl.Route{Dst: pfx("10.244.1.0/24"), Gw: ip("192.168.1.11"), LinkIndex: eth.Index},
		nl.Route{Dst: pfx("10.244.2.0/24"), Gw: ip("192.168.1.12"), LinkIndex: eth.Index},
		nl.Route{Dst: pfx("10.244.3.0/24"), Gw: ip("192.168.1.13"), LinkIndex: eth.Index},
	))
	if err != nil || st != (SyncStats{}) {
		t.Fatalf("second sync: %+v, %v; want no change and no dump", st, err)
	}
}

func TestRouteSyncOwnTable(t *testing.T) {
	k := &nlfake.Kernel{}
	eth := k.AddLink("eth1", 1500, true)
	s := &RouteSync{NL: k, Table: 100}
	if _, err := s.Sync(emitRoutes(nl.Route{Dst: pfx("10.10.1.0/24"), LinkIndex: eth.Index, Scope: nl.ScopeLink})); err != nil {
		t.Fatal(err)
	}
	want(t, "table 100", routes(t, k, 100), []string{"10.10.1.0/24 dev#1 table 100 proto twill"})
	want(t, "main table", routes(t, k, 0), nil)
}

func TestRouteSyncRepairsWhatItIsToldOf(t *testing.T) {
	k := &nlfake.Kernel{}
	eth := k.AddLink("eth0", 1500, true)
	r := nl.Route{Dst: pfx("10.244.1.0/24"), Gw: ip("192.168.1.11"), LinkIndex: eth.Index}
	s := &RouteSync{NL: k}
	if _, err := s.Sync(emitRoutes(r)); err != nil {
		t.Fatal(err)
	}
	// Someone deletes the route. The record still has it, so a sync
	// alone, which reads nothing, cannot know...
	gone := Owned(r, 0)
	if err := k.RouteDel(gone); err != nil {
		t.Fatal(err)
	}
	if st, _ := s.Sync(emitRoutes(r)); st.Added != 0 {
		t.Fatalf("a sync with a trusted record re-added a route: %+v", st)
	}
	// ...until the kernel's event says so. A route of someone else's
	// coming or going changes nothing of twill's (its route stands beside
	// it), unless it held twill's own metric, which kept twill's out.
	other := nl.Route{Dst: pfx("10.99.0.0/16"), LinkIndex: eth.Index}
	if s.Observe(nl.RouteEvent{Route: other}) || s.Observe(nl.RouteEvent{Route: other, Deleted: true}) {
		t.Error("a route of someone else's coming or going contradicted the record")
	}
	other.Priority = nl.RouteMetric(other.Dst)
	if !s.Observe(nl.RouteEvent{Route: other, Deleted: true}) {
		t.Error("a route of someone else's with twill's metric going did not ask for a sync")
	}
	if !s.Observe(nl.RouteEvent{Route: gone, Deleted: true}) {
		t.Fatal("the deletion of an owned route did not contradict the record")
	}
	st, err := s.Sync(emitRoutes(r))
	if err != nil {
		t.Fatal(err)
	}
	want(t, "main table", routes(t, k, 0), []string{"10.244.1.0/24 via 192.168.1.11 dev#1 proto twill"})
	if st.Repaired != 1 {
		t.Errorf("Repaired = %d, want 1", st.Repaired)
	}
	// The event about twill's own change agrees with the record.
	if s.Observe(nl.RouteEvent{Route: gone}) {
		t.Error("the event about twill's own add contradicted the record")
	}
	// A blackhole put in place of twill's route (ip route replace
	// blackhole ..., whatever its protocol) replaces it; one with another
	// key, or one going, does not touch twill's.
	hole := nl.Route{Dst: gone.Dst, Table: gone.Table, Priority: gone.Priority, Protocol: 3}
	elsewhere := nl.Route{Dst: pfx("10.98.0.0/24"), Protocol: 3}
	if s.Observe(nl.RouteEvent{Route: elsewhere, NonUnicast: true}) || s.Observe(nl.RouteEvent{Route: hole, NonUnicast: true, Deleted: true}) {
		t.Error("a blackhole elsewhere, or one going, contradicted the record")
	}
	if !s.Observe(nl.RouteEvent{Route: hole, NonUnicast: true}) {
		t.Error("a blackhole in place of twill's route did not contradict the record")
	}
}

func TestRouteSyncFullSyncEveryReadsTheKernel(t *testing.T) {
	k := &nlfake.Kernel{}
	eth := k.AddLink("eth0", 1500, true)
	now := time.Unix(1000, 0)
	s := &RouteSync{NL: k, FullSyncEvery: time.Minute}
	s.set.now = func() time.Time { return now }
	r := nl.Route{Dst: pfx("10.244.1.0/24"), Gw: ip("192.168.1.11"), LinkIndex: eth.Index}
	if _, err := s.Sync(emitRoutes(r)); err != nil {
		t.Fatal(err)
	}
	_ = k.RouteDel(Owned(r, 0)) // a deletion whose event was lost
	now = now.Add(59 * time.Second)
	if st, _ := s.Sync(emitRoutes(r)); st.Dumped {
		t.Fatal("read the kernel before FullSyncEvery passed")
	}
	now = now.Add(time.Second)
	st, err := s.Sync(emitRoutes(r))
	if err != nil || !st.Dumped || st.Repaired != 1 {
		t.Fatalf("after FullSyncEvery: %+v, %v; want a dump and one repair", st, err)
	}
	want(t, "main table", routes(t, k, 0), []string{"10.244.1.0/24 via 192.168.1.11 dev#1 proto twill"})
}

// TestRouteSyncWatchedTrustsItsRecordLonger: while Watch follows the
// routes, a lease event after FullSyncEvery of quiet does not read every
// route back (the watch would have told of any change); it does after
// WatchedSyncEvery, and after FullSyncEvery once the watch has stopped.
func TestRouteSyncWatchedTrustsItsRecordLonger(t *testing.T) {
	k := &nlfake.Kernel{}
	eth := k.AddLink("eth0", 1500, true)
	now := time.Unix(1000, 0)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	s := &RouteSync{NL: k, FullSyncEvery: 30 * time.Second, WatchedSyncEvery: 5 * time.Minute}
	s.set.now = clock
	r := func(i int) nl.Route {
		return nl.Route{Dst: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(i), 0}), 24), Gw: ip("192.168.1.11"), LinkIndex: eth.Index}
	}
	if _, err := s.Sync(emitRoutes(r(1))); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	checked := make(chan struct{})
	stopped := make(chan error, 1)
	go func() {
		var once sync.Once
		stopped <- s.Watch(ctx, slog.New(slog.NewTextHandler(io.Discard, nil)), func() {}, func() { once.Do(func() { close(checked) }) })
	}()
	select {
	case <-checked:
	case <-time.After(10 * time.Second):
		t.Fatal("the watch made no first check within 10s")
	}
	update := func(i int) SyncStats {
		t.Helper()
		st, err := s.Update([]nl.Route{r(i)}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	advance(31 * time.Second)
	if update(2).Dumped {
		t.Error("watched: a lease event after FullSyncEvery of quiet read the kernel back")
	}
	advance(5 * time.Minute)
	if !update(3).Dumped {
		t.Error("watched: a lease event after WatchedSyncEvery trusted the record")
	}
	cancel()
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	advance(31 * time.Second)
	if !update(4).Dumped {
		t.Error("the watch stopped: a lease event after FullSyncEvery trusted the record")
	}
	want(t, "main table", routes(t, k, 0), []string{
		"10.244.1.0/24 via 192.168.1.11 dev#1 proto twill", "10.244.2.0/24 via 192.168.1.11 dev#1 proto twill",
		"10.244.3.0/24 via 192.168.1.11 dev#1 proto twill", "10.244.4.0/24 via 192.168.1.11 dev#1 proto twill"})
}

func TestRouteSyncFailureIsRetriedFromTheKernel(t *testing.T) {
	k := &nlfake.Kernel{}
	eth := k.AddLink("eth0", 1500, true)
	a := nl.Route{Dst: pfx("10.244.1.0/24"), Gw: ip("192.168.1.11"), LinkIndex: eth.Index}
	b := nl.Route{Dst: pfx("10.244.2.0/24"), Gw: ip("192.168.1.12"), LinkIndex: eth.Index}
	s := &RouteSync{NL: k}
	if _, err := s.Sync(emitRoutes(a)); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	refuse := true
	k.Fail = func(string) error {
		mu.Lock()
		defer mu.Unlock()
		if refuse {
			return errors.New("ENOMEM")
		}
		return nil
	}
	if _, err := s.Update([]nl.Route{b}, nil); err == nil || !strings.Contains(err.Error(), "ENOMEM") {
		t.Fatalf("Update with a refusing kernel: %v, want the kernel's error", err)
	}
	mu.Lock()
	refuse = false
	mu.Unlock()
	// b is still desired; the failure made the record untrusted, so the
	// next (empty) update reads the kernel and adds it.
	st, err := s.Update(nil, nil)
	if err != nil || !st.Dumped {
		t.Fatalf("update after the failure: %+v, %v; want a dump", st, err)
	}
	want(t, "main table", routes(t, k, 0), []string{
		"10.244.1.0/24 via 192.168.1.11 dev#1 proto twill",
		"10.244.2.0/24 via 192.168.1.12 dev#1 proto twill",
	})
}

// TestRouteSyncLeavesAForeignRouteFirst: a route of someone else's to a
// destination twill wants stays as it is and keeps precedence (a lower
// metric); twill's stands beside it, and is named as shadowed.
func TestRouteSyncLeavesAForeignRouteFirst(t *testing.T) {
	k := &nlfake.Kernel{}
	eth := k.AddLink("eth0", 1500, true)
	foreign := nl.Route{Dst: pfx("10.244.1.0/24"), Gw: ip("192.168.1.1"), LinkIndex: eth.Index, Protocol: 4}
	k.RouteBatch([]nl.RouteOp{{Op: nl.OpAdd, Route: foreign}})
	var log strings.Builder
	s := &RouteSync{NL: k, Log: slog.New(slog.NewTextHandler(&log, nil))}
	for range 2 {
		if _, err := s.Sync(emitRoutes(nl.Route{Dst: pfx("10.244.1.0/24"), Gw: ip("192.168.1.11"), LinkIndex: eth.Index})); err != nil {
			t.Fatal(err)
		}
	}
	rs, _ := k.Routes(nl.FamilyAll, nl.RouteFilter{})
	if !slices.ContainsFunc(rs, func(r nl.Route) bool { return r.Equal(foreign) }) {
		t.Fatalf("the foreign route changed: %v", rs)
	}
	for _, r := range rs {
		if r.Protocol == nl.RouteProtocol && r.Priority <= foreign.Priority {
			t.Fatalf("twill's route %v does not yield to the foreign one (metric %d)", r, r.Priority)
		}
	}
	if got := s.Shadowed(); !slices.Equal(got, []string{"10.244.1.0/24"}) {
		t.Errorf("Shadowed() = %q", got)
	}
	if n := strings.Count(log.String(), "routes twill does not own hold destinations"); n != 1 {
		t.Errorf("the shadowed destination was logged %d times, want once:\n%s", n, log.String())
	}
	d, err := RouteDrift(k, 0, []nl.Route{{Dst: pfx("10.244.1.0/24"), Gw: ip("192.168.1.11"), LinkIndex: eth.Index}})
	if err != nil || !d.Clean() || len(d.Shadowed) != 1 {
		t.Errorf("drift %+v (%v): want clean, with the destination shadowed", d, err)
	}
}

// TestRouteSyncUpdateIsSync: a sequence of updates leaves the kernel as a
// full sync of the same desired set does.
func TestRouteSyncUpdateIsSync(t *testing.T) {
	inc, full := &nlfake.Kernel{}, &nlfake.Kernel{}
	eth := inc.AddLink("eth0", 1500, true)
	full.AddLink("eth0", 1500, true)
	si, sf := &RouteSync{NL: inc}, &RouteSync{NL: full}
	desired := map[netip.Prefix]nl.Route{}
	route := func(i, gw int) nl.Route {
		return nl.Route{Dst: pfx(fmt.Sprintf("10.244.%d.0/24", i)), Gw: netip.AddrFrom4([4]byte{192, 168, 1, byte(gw)}), LinkIndex: eth.Index}
	}
	for step := 0; step < 200; step++ {
		i, gw := step*7%23, step*13%31+1
		var up []nl.Route
		var rm []netip.Prefix
		if step%3 == 2 {
			r := route(i, gw)
			rm = append(rm, r.Dst)
			delete(desired, r.Dst)
		} else {
			r := route(i, gw)
			up = append(up, r)
			desired[r.Dst] = r
		}
		if _, err := si.Update(up, rm); err != nil {
			t.Fatal(err)
		}
		var all []nl.Route
		for _, r := range desired {
			all = append(all, r)
		}
		if _, err := sf.Sync(emitRoutes(all...)); err != nil {
			t.Fatal(err)
		}
		if a, b := routes(t, inc, 0), routes(t, full, 0); !slices.Equal(a, b) {
			t.Fatalf("step %d: incremental %q, full %q", step, a, b)
		}
	}
}

func neighs(t *testing.T, k *nlfake.Kernel, link int, fdb bool) []string {
	t.Helper()
	var ns []nl.Neigh
	var err error
	if fdb {
		ns, err = k.FDB(link)
	} else {
		ns, err = k.Neighs(link, nl.FamilyAll)
	}
	if err != nil {
		t.Fatal(err)
	}
	out := make([]string, len(ns))
	for i, n := range ns {
		out[i] = fmt.Sprintf("%s lladdr %x permanent=%v", n.IP, n.HardwareAddr, n.Permanent)
	}
	slices.Sort(out)
	return out
}

func emitNeighs(ns ...nl.Neigh) func(func(nl.Neigh)) {
	return func(emit func(nl.Neigh)) {
		for _, n := range ns {
			emit(n)
		}
	}
}

func TestNeighSyncFDBEntryMovesToItsNewRemote(t *testing.T) {
	k := &nlfake.Kernel{}
	dev := k.AddLink("twill.1", 1450, true)
	mac := []byte{0x0a, 0, 0, 0, 0, 1}
	s := &NeighSync{NL: k, FDB: true}
	s.SetLink(dev.Index)
	if _, err := s.Sync(emitNeighs(nl.Neigh{IP: ip("192.168.1.11"), HardwareAddr: mac})); err != nil {
		t.Fatal(err)
	}
	// The node moved: the MAC's remote is another address.
	if _, err := s.Sync(emitNeighs(nl.Neigh{IP: ip("192.168.1.21"), HardwareAddr: mac})); err != nil {
		t.Fatal(err)
	}
	want(t, "fdb", neighs(t, k, dev.Index, true), []string{"192.168.1.21 lladdr 0a0000000001 permanent=true"})
}

func TestNeighSyncLeavesLearnedEntries(t *testing.T) {
	k := &nlfake.Kernel{}
	dev := k.AddLink("twill.1", 1450, true)
	// An entry the kernel learned (not permanent) is not twill's.
	k.NeighBatch([]nl.NeighOp{{Op: nl.OpReplace, Neigh: nl.Neigh{LinkIndex: dev.Index, IP: ip("10.244.7.0"), HardwareAddr: []byte{2, 0, 0, 0, 0, 7}}}})
	s := &NeighSync{NL: k}
	s.SetLink(dev.Index)
	n1 := nl.Neigh{IP: ip("10.244.1.0"), HardwareAddr: []byte{0x0a, 0, 0, 0, 0, 1}}
	n2 := nl.Neigh{IP: ip("10.244.2.0"), HardwareAddr: []byte{0x0a, 0, 0, 0, 0, 2}}
	if _, err := s.Sync(emitNeighs(n1, n2)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Sync(emitNeighs(n2)); err != nil {
		t.Fatal(err)
	}
	want(t, "neighbours", neighs(t, k, dev.Index, false), []string{
		"10.244.2.0 lladdr 0a0000000002 permanent=true",
		"10.244.7.0 lladdr 020000000007 permanent=false",
	})
}

func TestNeighSyncNewDeviceReadsTheKernel(t *testing.T) {
	k := &nlfake.Kernel{}
	dev := k.AddLink("twill.1", 1450, true)
	n1 := nl.Neigh{IP: ip("10.244.1.0"), HardwareAddr: []byte{0x0a, 0, 0, 0, 0, 1}}
	s := &NeighSync{NL: k}
	s.SetLink(dev.Index)
	if _, err := s.Sync(emitNeighs(n1)); err != nil {
		t.Fatal(err)
	}
	// The device is deleted and made again: its entries went with it.
	if err := k.LinkDel(dev.Index); err != nil {
		t.Fatal(err)
	}
	dev2 := k.AddLink("twill.1", 1450, true)
	s.SetLink(dev2.Index)
	if _, err := s.Sync(emitNeighs(n1)); err != nil {
		t.Fatal(err)
	}
	want(t, "neighbours on the new device", neighs(t, k, dev2.Index, false), []string{"10.244.1.0 lladdr 0a0000000001 permanent=true"})
}

func rules(t *testing.T, k *nlfake.Kernel) []string {
	t.Helper()
	rs, err := k.Rules(nl.FamilyAll)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = fmt.Sprintf("%s proto %d", r, r.Protocol)
	}
	slices.Sort(out)
	return out
}

func TestRuleSyncReplacesAChangedRule(t *testing.T) {
	k := &nlfake.Kernel{}
	foreign := nl.Rule{Priority: 1536, Src: pfx("10.10.1.99/32"), Table: 200}
	if err := k.RuleAdd(foreign); err != nil {
		t.Fatal(err)
	}
	s := &RuleSync{NL: k}
	old := nl.Rule{Priority: 1536, Src: pfx("10.10.1.5/32"), Table: 100}
	if _, err := s.Sync(func(emit func(nl.Rule)) { emit(old) }); err != nil {
		t.Fatal(err)
	}
	// The ENI's address changed: a rule cannot be replaced, so the old
	// goes and the new comes; the rule twill does not own stays.
	st, err := s.Sync(func(emit func(nl.Rule)) { emit(nl.Rule{Priority: 1536, Src: pfx("10.10.1.6/32"), Table: 100}) })
	if err != nil {
		t.Fatal(err)
	}
	want(t, "rules", rules(t, k), []string{
		"pref 1536 from 10.10.1.6/32 lookup 100 proto 167",
		"pref 1536 from 10.10.1.99/32 lookup 200 proto 0",
	})
	if st.Added != 1 || st.Deleted != 1 {
		t.Errorf("stats %+v, want one added and one deleted", st)
	}
}

// TestOwnedSetEventsDuringSync: kernel events arrive on the watcher's
// goroutine while the reconcile goroutine syncs; with -race this checks
// the lock rule, and the end state is still the desired one.
func TestOwnedSetEventsDuringSync(t *testing.T) {
	k := &nlfake.Kernel{}
	eth := k.AddLink("eth0", 1500, true)
	s := &RouteSync{NL: k}
	var rs []nl.Route
	for i := 0; i < 50; i++ {
		rs = append(rs, nl.Route{Dst: pfx(fmt.Sprintf("10.244.%d.0/24", i)), Gw: ip("192.168.1.11"), LinkIndex: eth.Index})
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < 2000; i++ {
			s.Observe(nl.RouteEvent{Route: Owned(rs[i%len(rs)], 0), Deleted: i%5 == 0})
		}
	}()
	for i := 0; i < 100; i++ {
		if _, err := s.Sync(emitRoutes(rs[:len(rs)-i%7]...)); err != nil {
			t.Fatal(err)
		}
	}
	<-done
	s.Invalidate()
	if _, err := s.Sync(emitRoutes(rs...)); err != nil {
		t.Fatal(err)
	}
	if got := routes(t, k, 0); len(got) != len(rs) {
		t.Fatalf("%d routes after syncing %d", len(got), len(rs))
	}
}

// Verify (what a watch runs once subscribed) reads the kernel without
// dropping a record that is still right, so a start with thousands of
// routes needs no second full sync; it finds what changed before.
func TestRouteSyncVerify(t *testing.T) {
	k := &nlfake.Kernel{}
	eth := k.AddLink("eth0", 1500, true)
	rs := []nl.Route{{Dst: pfx("10.244.1.0/24"), Gw: ip("192.168.1.11"), LinkIndex: eth.Index}, {Dst: pfx("10.244.2.0/24"), Gw: ip("192.168.1.12"), LinkIndex: eth.Index}}
	s := &RouteSync{NL: k}
	if !s.Verify() {
		t.Error("Verify trusted a record never read")
	}
	if _, err := s.Sync(emitRoutes(rs...)); err != nil {
		t.Fatal(err)
	}
	if s.Verify() {
		t.Fatal("Verify found a difference where there is none")
	}
	if st, _ := s.Sync(emitRoutes(rs...)); st.Dumped {
		t.Error("a sync after a clean Verify read the kernel again")
	}
	for name, drift := range map[string]func(){
		"deleted": func() { _ = k.RouteDel(Owned(rs[0], 0)) },
		"changed": func() {
			c := Owned(rs[1], 0)
			c.Gw = ip("192.168.1.99")
			k.RouteBatch([]nl.RouteOp{{Op: nl.OpReplace, Route: c}})
		},
		"added": func() {
			k.RouteBatch([]nl.RouteOp{{Op: nl.OpAdd, Route: Owned(nl.Route{Dst: pfx("10.244.9.0/24"), Gw: ip("192.168.1.19"), LinkIndex: eth.Index}, 0)}})
		},
	} {
		drift()
		if !s.Verify() {
			t.Errorf("Verify missed a twill route %s behind its back", name)
		}
		st, err := s.Sync(emitRoutes(rs...))
		if err != nil || !st.Dumped || st.Repaired != 1 {
			t.Errorf("after a route %s: sync %+v, %v; want one repair after a dump", name, st, err)
		}
	}
}

// Verify compares a chunk at a time: a difference in any chunk, or a
// record holding an object the kernel lost, is found with thousands of
// routes as with two.
func TestRouteSyncVerifyChunks(t *testing.T) {
	k := &nlfake.Kernel{}
	eth := k.AddLink("eth0", 1500, true)
	rs := make([]nl.Route, 3*verifyChunk+7)
	for i := range rs {
		rs[i] = nl.Route{Dst: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i >> 8), byte(i), 0}), 24), Gw: ip("192.168.1.11"), LinkIndex: eth.Index}
	}
	s := &RouteSync{NL: k}
	for _, i := range []int{0, verifyChunk, len(rs) - 1} {
		if _, err := s.Sync(emitRoutes(rs...)); err != nil {
			t.Fatal(err)
		}
		if s.Verify() {
			t.Fatal("Verify found a difference where there is none")
		}
		c := Owned(rs[i], 0)
		c.Gw = ip("192.168.1.99")
		k.RouteBatch([]nl.RouteOp{{Op: nl.OpReplace, Route: c}})
		if !s.Verify() {
			t.Errorf("Verify missed route %d of %d changed", i, len(rs))
		}
		if _, err := s.Sync(emitRoutes(rs...)); err != nil {
			t.Fatal(err)
		}
		_ = k.RouteDel(Owned(rs[i], 0))
		if !s.Verify() {
			t.Errorf("Verify missed route %d of %d deleted", i, len(rs))
		}
	}
}

func TestNeighSyncRepairsWhatItIsToldOf(t *testing.T) {
	k := &nlfake.Kernel{}
	dev := k.AddLink("twill.1", 1450, true)
	mac := []byte{0x0a, 0, 0, 0, 0, 1}
	n1 := nl.Neigh{IP: ip("10.244.1.0"), HardwareAddr: mac}
	s := &NeighSync{NL: k}
	s.SetLink(dev.Index)
	if _, err := s.Sync(emitNeighs(n1)); err != nil {
		t.Fatal(err)
	}
	mine := nl.Neigh{LinkIndex: dev.Index, IP: n1.IP, HardwareAddr: mac, Permanent: true}
	// Events that are not about twill's entries: the kernel's own entries
	// coming and going (a multicast or resolved neighbour), entries of
	// another device, FDB events to the neighbour set, and the event about
	// twill's own add.
	kernels := nl.Neigh{LinkIndex: dev.Index, IP: ip("ff02::1"), HardwareAddr: []byte{0x33, 0x33, 0, 0, 0, 1}}
	otherDev := mine
	otherDev.LinkIndex = dev.Index + 1
	for name, ev := range map[string]nl.NeighEvent{
		"the kernel's entry added":      {Neigh: kernels},
		"the kernel's entry deleted":    {Neigh: kernels, Deleted: true},
		"another device's entry gone":   {Neigh: otherDev, Deleted: true},
		"an FDB entry gone":             {Neigh: mine, FDB: true, Deleted: true},
		"the event about twill's write": {Neigh: mine},
	} {
		if s.Observe(ev) {
			t.Errorf("%s: contradicted the record", name)
		}
	}
	// Someone deletes twill's entry: a sync alone, trusting its record,
	// cannot know; the event says so, and the next sync repairs it.
	// The kernel reports the deletion without the entry's address or state.
	k.NeighBatch([]nl.NeighOp{{Op: nl.OpDel, Neigh: mine}})
	if !s.Observe(nl.NeighEvent{Neigh: nl.Neigh{LinkIndex: dev.Index, IP: n1.IP}, Deleted: true}) {
		t.Fatal("the deletion of twill's entry did not contradict the record")
	}
	st, err := s.Sync(emitNeighs(n1))
	if err != nil {
		t.Fatal(err)
	}
	want(t, "neighbours", neighs(t, k, dev.Index, false), []string{"10.244.1.0 lladdr 0a0000000001 permanent=true"})
	if st.Repaired != 1 {
		t.Errorf("Repaired = %d, want 1", st.Repaired)
	}
	// An entry the kernel owns put in its place (ip neigh replace ... nud
	// reachable), and one with another MAC, contradict it.
	replaced := mine
	replaced.Permanent = false
	if !s.Observe(nl.NeighEvent{Neigh: replaced}) {
		t.Error("a non-permanent entry in place of twill's did not contradict the record")
	}
	if _, err := s.Sync(emitNeighs(n1)); err != nil {
		t.Fatal(err)
	}
	moved := mine
	moved.HardwareAddr = []byte{0x0a, 0, 0, 0, 0, 9}
	if !s.Observe(nl.NeighEvent{Neigh: moved}) {
		t.Error("twill's entry with another MAC did not contradict the record")
	}
}

// An FDB entry whose remote changed is deleted and added again; the
// deletion of the old entry, seen after the record holds the new one,
// agrees with the record.
func TestNeighSyncFDBMoveAgreesWithItsEvents(t *testing.T) {
	k := &nlfake.Kernel{}
	dev := k.AddLink("twill.1", 1450, true)
	mac := []byte{0x0a, 0, 0, 0, 0, 1}
	s := &NeighSync{NL: k, FDB: true}
	s.SetLink(dev.Index)
	old := nl.Neigh{IP: ip("192.168.1.11"), HardwareAddr: mac}
	moved := nl.Neigh{IP: ip("192.168.1.21"), HardwareAddr: mac}
	for _, n := range []nl.Neigh{old, moved} {
		if _, err := s.Sync(emitNeighs(n)); err != nil {
			t.Fatal(err)
		}
	}
	at := func(n nl.Neigh) nl.Neigh { n.LinkIndex, n.Permanent = dev.Index, true; return n }
	if s.Observe(nl.NeighEvent{FDB: true, Neigh: at(old), Deleted: true}) || s.Observe(nl.NeighEvent{FDB: true, Neigh: at(moved)}) {
		t.Error("the events about twill's own move contradicted the record")
	}
	if !s.Observe(nl.NeighEvent{FDB: true, Neigh: at(moved), Deleted: true}) {
		t.Error("the deletion of the moved entry did not contradict the record")
	}
}

// dupFDB is a kernel whose FDB dump sends every entry twice, as a vxlan
// FDB dump does for many entries when others are added while it runs.
type dupFDB struct{ *nlfake.Kernel }

func (k dupFDB) FDB(link int) ([]nl.Neigh, error) {
	ns, err := k.Kernel.FDB(link)
	return append(ns, ns...), err
}

func TestNeighSyncVerifyCountsAnEntrySentTwiceOnce(t *testing.T) {
	k := &nlfake.Kernel{}
	dev := k.AddLink("twill.1", 1450, true)
	s := &NeighSync{NL: dupFDB{k}, FDB: true}
	s.SetLink(dev.Index)
	if _, err := s.Sync(emitNeighs(nl.Neigh{IP: ip("192.168.1.11"), HardwareAddr: []byte{0x0a, 0, 0, 0, 0, 1}})); err != nil {
		t.Fatal(err)
	}
	if s.Verify() {
		t.Fatal("an entry the dump sent twice read as drift")
	}
	k.NeighBatch([]nl.NeighOp{{Op: nl.OpDel, FDB: true, Neigh: nl.Neigh{LinkIndex: dev.Index, IP: ip("192.168.1.11"), HardwareAddr: []byte{0x0a, 0, 0, 0, 0, 1}, Permanent: true}}})
	if !s.Verify() {
		t.Fatal("a deleted entry did not read as drift")
	}
}

// An IPv6 route asked for with link scope (the wireguard backend's, on a
// point-to-point device) is reported by the kernel with universe scope:
// what the sync wrote still matches what it reads back, so nothing reads
// as drift and nothing is replaced at the next sync.
func TestRouteSyncIPv6ScopeIsTheKernels(t *testing.T) {
	k := &nlfake.Kernel{}
	wg := k.AddLink("twill-wg-v6", 1420, true, pfx("fd00:10:0:1::/128"))
	s := &RouteSync{NL: k}
	desired := emitRoutes(nl.Route{Dst: pfx("fd00:10:0:2::/64"), LinkIndex: wg.Index, Scope: nl.ScopeLink},
		nl.Route{Dst: pfx("10.244.2.0/24"), LinkIndex: wg.Index, Scope: nl.ScopeLink})
	if _, err := s.Sync(desired); err != nil {
		t.Fatal(err)
	}
	if s.Verify() {
		t.Fatal("the kernel reads as different from what the sync just wrote")
	}
	st, err := s.Sync(desired)
	if err != nil || st.Added+st.Replaced+st.Deleted != 0 {
		t.Fatalf("a second sync changed %+v (%v), want nothing", st, err)
	}
}
