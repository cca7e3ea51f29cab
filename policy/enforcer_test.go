package policy

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"
)

// fakeSource is a Source whose state the test sets.
type fakeSource struct {
	mu      sync.Mutex
	s       Snapshot
	changed func()
	synced  chan struct{}
	listing bool // Start reports a change, as the informers' first list does
}

func (f *fakeSource) Start(_ context.Context, changed func()) <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.changed = changed
	if f.listing {
		changed() // the informers' first list: an add for each object
	}
	return f.synced
}

func (f *fakeSource) Snapshot() Snapshot {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.s
}

func (f *fakeSource) set(s Snapshot) {
	f.mu.Lock()
	f.s = s
	changed := f.changed
	f.mu.Unlock()
	changed()
}

// fakeKernel holds the last ruleset written, as the kernel would, and
// nftables' generation, which each write moves.
type fakeKernel struct {
	mu      sync.Mutex
	rs      *Ruleset
	rereads int
	gen     uint32
	syncs   chan Ruleset
}

func (k *fakeKernel) Sync(rs Ruleset, reread bool) (Changes, error) {
	k.mu.Lock()
	if reread {
		k.rereads++
	}
	k.rs = &rs
	k.gen++
	k.mu.Unlock()
	k.syncs <- rs
	return Changes{Chains: 1}, nil
}

func (k *fakeKernel) Generation() (uint32, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.gen + 1, nil // never 0
}

// flushed is another writer's flush of the table.
func (k *fakeKernel) flushed() {
	k.mu.Lock()
	k.rs = nil
	k.gen++
	k.mu.Unlock()
}

// TestEnforcerWritesAfterTheListsAndOnEachChange: nothing is written
// before the informers have listed everything (a partial view would allow
// too much or too little); then the table follows each change, and a
// change to the table (drift) has it read back and rewritten.
func TestEnforcerWritesAfterTheListsAndOnEachChange(t *testing.T) {
	src := &fakeSource{s: snapshot(), synced: make(chan struct{})}
	k := &fakeKernel{syncs: make(chan Ruleset, 16)}
	var drift func()
	watched := make(chan struct{})
	e := &Enforcer{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Source: src, Kernel: k, Node: "n1",
		Watch: func(ctx context.Context, subscribed, changed func()) error {
			drift = changed
			subscribed()
			close(watched)
			<-ctx.Done()
			return nil
		}}
	synced := make(chan struct{})
	e.Synced = sync.OnceFunc(func() { close(synced) })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx, []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")}) }()
	select {
	case <-k.syncs:
		t.Fatal("the table was written before the informers had listed everything")
	case <-time.After(100 * time.Millisecond):
	}
	close(src.synced)
	first := wait(t, k.syncs)
	<-synced
	if slices.ContainsFunc(first.Chains, func(c Chain) bool { return c.Name == "in:x/a" }) {
		t.Fatal("x/a isolated with no policy")
	}
	s := snapshot(testPolicy("x", "deny", nil, nil))
	src.set(s)
	if rs := wait(t, k.syncs); !slices.ContainsFunc(rs.Chains, func(c Chain) bool { return c.Name == "in:x/a" }) {
		t.Fatalf("after a policy came, chains %v lack in:x/a", chainNames(rs))
	}
	// Selected says what the table enforces: it follows once Sync has
	// returned, which the fake kernel's channel does not wait for.
	deadline := time.Now().Add(10 * time.Second)
	for !slices.Equal(e.Selected("x/a").Ingress, []string{"x/deny"}) && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if got := e.Selected("x/a"); !slices.Equal(got.Ingress, []string{"x/deny"}) {
		t.Errorf("Selected(x/a) = %+v", got)
	}
	<-watched
	k.mu.Lock()
	before := k.rereads
	k.mu.Unlock()
	k.flushed()
	drift()
	wait(t, k.syncs)
	k.mu.Lock()
	after := k.rereads
	k.mu.Unlock()
	if after != before+1 {
		t.Errorf("a change to the table synced with %d rereads, want 1 (the kernel's table read back)", after-before)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// watchedEnforcer runs an enforcer on a fake kernel, its informers
// listed and its watch subscribed, until the test ends; it returns once
// the first sync is done, with the watch's signal of a change.
func watchedEnforcer(t *testing.T, listing bool) (*fakeSource, *fakeKernel, func()) {
	src := &fakeSource{s: snapshot(), synced: make(chan struct{}), listing: listing}
	close(src.synced)
	k := &fakeKernel{syncs: make(chan Ruleset, 16)}
	drifts := make(chan func(), 1)
	e := &Enforcer{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Source: src, Kernel: k, Node: "n1", Resync: time.Hour,
		Watch: func(ctx context.Context, subscribed, changed func()) error {
			drifts <- changed
			<-ctx.Done()
			return nil
		}}
	synced := make(chan struct{})
	e.Synced = sync.OnceFunc(func() { close(synced) })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = e.Run(ctx, []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")}) }()
	t.Cleanup(func() { cancel(); <-done })
	wait(t, k.syncs)
	drift := <-drifts
	<-synced // the loop past its first sync
	return src, k, drift
}

// TestEnforcerIgnoresItsOwnLostNotifications: a watch that says the
// table changed (its socket overflowed with the notifications of the
// enforcer's own large write) while nftables' generation is still the one
// that write left reads nothing back; once another writer has committed,
// it does.
func TestEnforcerIgnoresItsOwnLostNotifications(t *testing.T) {
	for _, listing := range []bool{false, true} {
		t.Run(fmt.Sprintf("listing=%v", listing), func(t *testing.T) { ignoresOwnLostNotifications(t, listing) })
	}
}

// ignoresOwnLostNotifications is TestEnforcerIgnoresItsOwnLostNotifications
// with a first sync that a timer starts, or (listing) the informers' first
// list, as in twilld.
func ignoresOwnLostNotifications(t *testing.T, listing bool) {
	_, k, drift := watchedEnforcer(t, listing)
	drift()
	select {
	case <-k.syncs:
		t.Fatal("lost notifications of its own write, nothing else committed: the table was read back")
	case <-time.After(1500 * time.Millisecond):
	}
	k.flushed()
	drift()
	wait(t, k.syncs)
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.rereads < 2 {
		t.Errorf("after another writer's commit, %d rereads, want the table read back", k.rereads)
	}
}

// TestEnforcerDriftBeforeAChangeIsReadBack: another writer flushes the
// table, then a change is written before the watch's signal of the flush
// is taken: that signal still has the table read back, though nothing was
// committed after the change's write.
func TestEnforcerDriftBeforeAChangeIsReadBack(t *testing.T) {
	src, k, drift := watchedEnforcer(t, false)
	k.flushed() // its signal comes after the change below is written
	src.set(snapshot(testPolicy("x", "deny", nil, nil)))
	wait(t, k.syncs)
	k.mu.Lock()
	before := k.rereads
	k.mu.Unlock()
	deadline := time.Now().Add(10 * time.Second)
	for len(k.syncs) == 0 && time.Now().Before(deadline) {
		drift() // until the loop, past the change's sync, takes it
		select {
		case rs := <-k.syncs:
			k.syncs <- rs
		case <-time.After(1500 * time.Millisecond):
		}
	}
	wait(t, k.syncs)
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.rereads != before+1 {
		t.Errorf("another writer's flush before a change: %d rereads after it, want the table read back", k.rereads-before)
	}
}

func wait(t *testing.T, c <-chan Ruleset) Ruleset {
	t.Helper()
	select {
	case rs := <-c:
		return rs
	case <-time.After(10 * time.Second):
		t.Fatal("no sync within 10 s")
	}
	return Ruleset{}
}

// TestEnforcerDriftSurvivesAChange: a change to the table (drift) that
// comes less than a second after a sync waits for that second; a change of
// the informers' state synced meanwhile must not drop it: the table is
// still read back and repaired.
func TestEnforcerDriftSurvivesAChange(t *testing.T) {
	src := &fakeSource{s: snapshot(), synced: make(chan struct{})}
	close(src.synced)
	k := &fakeKernel{syncs: make(chan Ruleset, 16)}
	drift := make(chan func(), 1)
	e := &Enforcer{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Source: src, Kernel: k, Node: "n1",
		Watch: func(ctx context.Context, subscribed, changed func()) error {
			subscribed()
			drift <- changed
			<-ctx.Done()
			return nil
		}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = e.Run(ctx, []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")}) }()
	wait(t, k.syncs)
	changed := <-drift
	for len(k.syncs) > 0 { // the subscription's own check
		wait(t, k.syncs)
	}
	src.set(snapshot(testPolicy("x", "deny", nil, nil)))
	wait(t, k.syncs) // the change, written at once
	k.mu.Lock()
	before := k.rereads
	k.mu.Unlock()
	k.flushed()
	changed()                                                // drift, within a second of that write: deferred
	src.set(snapshot(testPolicy("x", "deny-too", nil, nil))) // a change before the second is up
	deadline := time.After(5 * time.Second)
	for {
		select {
		case <-k.syncs:
		case <-deadline:
			t.Fatal("the flushed table was never read back: a change synced in the drift's second dropped it")
		}
		k.mu.Lock()
		n := k.rereads
		k.mu.Unlock()
		if n > before {
			return
		}
	}
}
