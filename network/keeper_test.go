package network

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"
)

// failingOnce fails its first check, as iptables does when another writer
// races it, and succeeds after.
type failingOnce struct{ n atomic.Int32 }

func (f *failingOnce) Sync() error {
	if f.n.Add(1) == 1 {
		return errors.New("iptables: resource temporarily unavailable")
	}
	return nil
}

// A check that fails is tried again within seconds, even while a watch
// works and announces no further change: the rules it did not write would
// otherwise wait for the next change or the watched resync, minutes away.
func TestKeeperRetriesAFailedCheck(t *testing.T) {
	var rules failingOnce
	k := &Keeper{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Rules: &rules,
		Resync: time.Hour, WatchedResync: time.Hour,
		Watch: watchingQuietly}
	runKeeper(t, k)
	for deadline := time.Now().Add(20 * time.Second); rules.n.Load() < 2; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d checks in 20 s: the failed one was not retried (both resync periods are an hour)", rules.n.Load())
		}
	}
}

// counting counts its checks.
type counting struct{ n atomic.Int32 }

func (c *counting) Sync() error { c.n.Add(1); return nil }

// While the watch works, the safety net checks only when nftables'
// generation moved since the last clean check began: an idle node runs no
// check (in the iptables mode, execs no iptables), and a change the watch
// missed still gets one.
func TestKeeperSafetyNetChecksOnlyWhenTheGenerationMoved(t *testing.T) {
	var rules counting
	var gen atomic.Uint32
	k := &Keeper{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Rules: &rules,
		Resync: time.Hour, WatchedResync: 20 * time.Millisecond,
		Watch:      watchingQuietly,
		Generation: func() (uint32, error) { return gen.Load(), nil }}
	runKeeper(t, k)
	waitChecks := func(n int32) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); rules.n.Load() < n; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%d checks in 20 s, want %d", rules.n.Load(), n)
			}
		}
	}
	waitChecks(1) // the first check, and the one the subscription asks for
	time.Sleep(100 * time.Millisecond)
	idle := rules.n.Load()
	time.Sleep(300 * time.Millisecond) // 15 safety-net periods
	if got := rules.n.Load(); got != idle {
		t.Fatalf("%d checks while nothing was committed, want none", got-idle)
	}
	gen.Add(1) // a commit the watch did not report
	waitChecks(idle + 1)
	time.Sleep(300 * time.Millisecond)
	if got := rules.n.Load(); got != idle+1 {
		t.Fatalf("%d checks after one commit, want one", got-idle)
	}
}

// watchingQuietly is a watch that subscribes and then reports no change.
func watchingQuietly(ctx context.Context, subscribed, _ func()) error {
	subscribed()
	<-ctx.Done()
	return nil
}

// runKeeper runs k until the test ends, and fails it if Run fails.
func runKeeper(t *testing.T, k *Keeper) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- k.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
}
