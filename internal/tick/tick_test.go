package tick

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// Every calls fn repeatedly, and returns once its context is done.
func TestEvery(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var calls atomic.Int32
	done := make(chan error, 1)
	go func() {
		done <- Every(ctx, time.Millisecond, func() {
			if calls.Add(1) == 3 {
				cancel()
			}
		})
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Every: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Every did not return after its context was canceled")
	}
	if n := calls.Load(); n != 3 {
		t.Errorf("fn called %d times, want 3 (no call after cancel)", n)
	}
}

// A context done before the first tick means no call at all.
func TestEveryCanceledFirst(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	called := false
	if err := Every(ctx, time.Hour, func() { called = true }); err != nil || called {
		t.Errorf("err %v, called %v; want nil and no call", err, called)
	}
}

// Restart runs again what failed, tells of each failure, and stops once
// its context is done, without telling of that last return.
func TestRestart(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	runs, failures := 0, 0
	done := make(chan struct{})
	go func() {
		defer close(done)
		Restart(ctx, time.Millisecond, func(ctx context.Context) error {
			runs++
			if runs == 3 {
				cancel()
				<-ctx.Done()
				return ctx.Err()
			}
			return errors.New("watch lost")
		}, func(err error) { failures++ })
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("Restart did not return after its context was canceled")
	}
	if runs != 3 || failures != 2 {
		t.Errorf("%d runs and %d failures told, want 3 and 2", runs, failures)
	}
}
