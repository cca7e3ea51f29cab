// Package backoff is the one retry delay twill's loops share: it doubles
// from a floor to a ceiling while failures last, and starts again at the
// floor after a success.
package backoff

import (
	"context"
	"time"
)

// Backoff is a retry delay growing from Min to Max. The zero value of d
// means no failure yet; Reset returns to it.
type Backoff struct {
	Min, Max time.Duration
	d        time.Duration
}

// Next is the delay before the next retry: Min after a success, then
// twice the last delay, up to Max.
func (b *Backoff) Next() time.Duration {
	b.d = min(max(b.d*2, b.Min), b.Max)
	return b.d
}

// Reset starts the delay again at Min, after a success.
func (b *Backoff) Reset() { b.d = 0 }

// Sleep waits d, or until ctx is done; it reports whether it waited the
// whole of d.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
