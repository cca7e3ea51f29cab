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
		Watch: func(ctx context.Context, subscribed, _ func()) error {
			subscribed()
			<-ctx.Done()
			return nil
		}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- k.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	for deadline := time.Now().Add(20 * time.Second); rules.n.Load() < 2; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d checks in 20 s: the failed one was not retried (both resync periods are an hour)", rules.n.Load())
		}
	}
}
