// Package tick is the periodic loop twill's background checks share: call
// a function every period until the context is done.
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
