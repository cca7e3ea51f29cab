package network

import (
	"context"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twill-net/twill/testsupport/iptfake"
)

// Chains.Sync against testsupport/iptfake, without root: the tables are
// asserted as iptables -S would print them.

var _ IPTables = (*iptfake.Tables)(nil)

func fakeChains(t *testing.T, ipMasq bool) (*Chains, *iptfake.Tables, *strings.Builder) {
	t.Helper()
	tables := &iptfake.Tables{}
	var log strings.Builder
	c := &Chains{Logger: slog.New(slog.NewTextHandler(&log, nil)), IPMasq: ipMasq,
		Networks: []NetworkPair{{Cluster: netip.MustParsePrefix("10.244.0.0/16"), Local: netip.MustParsePrefix("10.244.1.0/24")}},
		Open:     func(bool) (IPTables, error) { return tables, nil }}
	return c, tables, &log
}

func list(t *testing.T, tables *iptfake.Tables, table, chain string) []string {
	t.Helper()
	got, err := tables.List(table, chain)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func wantChain(t *testing.T, tables *iptfake.Tables, table, chain string, rules []Rule) {
	t.Helper()
	want := []string{"-N " + chain}
	for _, r := range rules {
		want = append(want, "-A "+chain+" "+strings.Join(r.Spec(), " "))
	}
	if got := list(t, tables, table, chain); !slices.Equal(got, want) {
		t.Fatalf("%s/%s:\n got  %q\n want %q", table, chain, got, want)
	}
}

func TestChainsSyncAndRepair(t *testing.T) {
	c, tables, log := fakeChains(t, true)
	repairs := 0
	c.Repaired = func() { repairs++ }
	cluster, local := netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("10.244.1.0/24")
	// Someone's own rule in FORWARD, before twill starts.
	if err := tables.Append("filter", "FORWARD", "-i", "eth9", "-j", "DROP"); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := c.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	wantChain(t, tables, "nat", "TWILL-POSTRTG", MasqRules(cluster, local))
	wantChain(t, tables, "filter", "TWILL-FWD", ForwardRules(cluster))
	jumpFwd := "-A FORWARD -m comment --comment twill -j TWILL-FWD"
	if got := list(t, tables, "filter", "FORWARD"); !slices.Equal(got, []string{"-P FORWARD ACCEPT", jumpFwd, "-A FORWARD -i eth9 -j DROP"}) {
		t.Fatalf("FORWARD %q: want twill's jump first, once, and the other rule kept", got)
	}
	if got := list(t, tables, "nat", "POSTROUTING"); !slices.Equal(got, []string{"-P POSTROUTING ACCEPT", "-A POSTROUTING -m comment --comment twill -j TWILL-POSTRTG"}) {
		t.Fatalf("POSTROUTING %q", got)
	}

	// Someone deletes a masquerade rule and the FORWARD jump: the next
	// sync puts both back, in order.
	m := MasqRules(cluster, local)
	if err := tables.Delete("nat", "TWILL-POSTRTG", m[1].Spec()...); err != nil {
		t.Fatal(err)
	}
	if err := tables.Delete("filter", "FORWARD", "-m", "comment", "--comment", "twill", "-j", "TWILL-FWD"); err != nil {
		t.Fatal(err)
	}
	if err := c.Sync(); err != nil {
		t.Fatal(err)
	}
	wantChain(t, tables, "nat", "TWILL-POSTRTG", m)
	if got := list(t, tables, "filter", "FORWARD"); got[1] != jumpFwd {
		t.Fatalf("FORWARD after repair %q", got)
	}
	if repairs != 2 {
		t.Errorf("%d repairs reported for a rule and a jump put back, want 2", repairs)
	}
	if !strings.Contains(log.String(), "iptables chain drifted; rewriting") {
		t.Errorf("the repair was not logged:\n%s", log)
	}
}

func TestChainsWithoutMasquerade(t *testing.T) {
	c, tables, _ := fakeChains(t, false)
	if err := c.Sync(); err != nil {
		t.Fatal(err)
	}
	if got := list(t, tables, "nat", "TWILL-POSTRTG"); !slices.Equal(got, []string{"-N TWILL-POSTRTG"}) {
		t.Fatalf("masquerade chain without --ip-masq: %q, want it empty", got)
	}
	wantChain(t, tables, "filter", "TWILL-FWD", ForwardRules(netip.MustParsePrefix("10.244.0.0/16")))
}

// A burst of rule changes (kube-proxy rewriting its rules) costs at most
// one check a second, and the last change is still checked.
func TestChainsRunCoalescesChanges(t *testing.T) {
	c, _, _ := fakeChains(t, true)
	var checks atomic.Int32
	k := &Keeper{Logger: c.Logger, Rules: countingSyncer{c, &checks}, Resync: time.Hour, WatchedResync: time.Hour}
	burstDone := make(chan struct{})
	k.Watch = func(ctx context.Context, subscribed, changed func()) error {
		subscribed()
		for range 50 {
			changed()
			time.Sleep(10 * time.Millisecond)
		}
		close(burstDone)
		<-ctx.Done()
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- k.Run(ctx) }()
	<-burstDone // 0.5 s of changes
	deadline := time.Now().Add(10 * time.Second)
	for checks.Load() < 2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(1500 * time.Millisecond) // room for any check too many
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := checks.Load(); n != 2 {
		t.Errorf("%d checks for one subscription and a 0.5 s burst of 50 changes, want 2 (at once, then the burst's end a second later)", n)
	}
}

// countingSyncer counts the checks a Keeper makes.
type countingSyncer struct {
	Syncer
	n *atomic.Int32
}

func (s countingSyncer) Sync() error { s.n.Add(1); return s.Syncer.Sync() }

// flushedWhileWritten is iptables where someone flushes a chain between
// twill's writing it and listing it, at each of its first `times` listings.
type flushedWhileWritten struct {
	*iptfake.Tables
	table, chain string
	times        int
	written      bool
}

func (f *flushedWhileWritten) Restore(input string) error {
	if strings.Contains(input, "\n*"+f.table+"\n") || strings.HasPrefix(input, "*"+f.table+"\n") {
		f.written = f.written || strings.Contains(input, "\n-A "+f.chain+" ")
	}
	return f.Tables.Restore(input)
}

func (f *flushedWhileWritten) Save(table string) ([]string, error) {
	if table == f.table && f.written && f.times > 0 {
		f.times--
		f.written = false
		if err := f.Tables.ClearChain(table, f.chain); err != nil {
			return nil, err
		}
	}
	return f.Tables.Save(table)
}

// TestChainsFlushedWhileWritten: a chain flushed between twill's write
// and its listing is not taken for twill's own state: the sync writes it
// again. (Under load, with iptables-nft, the flush's notification came
// during the write, the next check found the chain as it had listed it,
// and the chain stayed empty.) A chain flushed after every write is an
// error that says so, and the next sync, undisturbed, writes it.
func TestChainsFlushedWhileWritten(t *testing.T) {
	fwd := ForwardRules(netip.MustParsePrefix("10.244.0.0/16"))
	c, tables, _ := fakeChains(t, true)
	f := &flushedWhileWritten{Tables: tables, table: "filter", chain: "TWILL-FWD", times: 1}
	c.Open = func(bool) (IPTables, error) { return f, nil }
	if err := c.Sync(); err != nil {
		t.Fatal(err)
	}
	wantChain(t, tables, "filter", "TWILL-FWD", fwd)

	c, tables, _ = fakeChains(t, true)
	f = &flushedWhileWritten{Tables: tables, table: "filter", chain: "TWILL-FWD", times: rewriteAttempts}
	c.Open = func(bool) (IPTables, error) { return f, nil }
	err := c.Sync()
	if err == nil || !strings.Contains(err.Error(), "filter/TWILL-FWD changed each time twill wrote it") {
		t.Fatalf("sync with the chain flushed after every write: %v, want it said", err)
	}
	if err := c.Sync(); err != nil {
		t.Fatal(err)
	}
	wantChain(t, tables, "filter", "TWILL-FWD", fwd)
}
