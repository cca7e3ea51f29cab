// Package tick is the periodic loops twill's background work shares: call
// a function every period until the context is done, and restart a watch
// a period after it fails.
package tick

import (
	"context"
	"time"
)

// Every calls fn every period (the first time one period from now) until
// ctx is done, and then returns nil. A call that outlasts the period delays
// the next; missed ticks are not made up.
func Every(ctx context.Context, period time.Duration, fn func()) error {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if ctx.Err() != nil {
			return nil
		}
		fn()
	}
}

// Restart runs run until ctx is done, starting it again a period after
// each time it returns while ctx is not done, and telling failed of what
// it returned first. It suits a watch that should never end.
func Restart(ctx context.Context, period time.Duration, run func(context.Context) error, failed func(error)) {
	for ctx.Err() == nil {
		err := run(ctx)
		if ctx.Err() != nil {
			return
		}
		failed(err)
		t := time.NewTimer(period)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
}
