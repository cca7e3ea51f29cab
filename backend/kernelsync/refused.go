package kernelsync

import (
	"log/slog"
	"slices"
	"strings"
	"sync"
)

// RefusedPeers logs the peers a backend refuses to program: each one by
// name and reason the first time it is refused, however many come at
// once, and never again while it stays refused, so that a steady state
// does not write a line per peer per resync. Safe for concurrent use.
type RefusedPeers struct {
	Log *slog.Logger
	// Message is the warning: what was refused, why, and what to do.
	Message string

	mu   sync.Mutex
	last []string // sorted
}

// Report takes the peers refused now ("<lease>: <reason>", any order) and
// logs, with attrs, the ones not refused at the last report: all of them,
// with the count of every peer refused now. It reports whether the set
// changed.
func (r *RefusedPeers) Report(refused []string, attrs ...any) bool {
	refused = slices.Clone(refused)
	slices.Sort(refused)
	refused = slices.Compact(refused)
	r.mu.Lock()
	changed := !slices.Equal(refused, r.last)
	var fresh []string
	if changed {
		for _, p := range refused {
			if _, was := slices.BinarySearch(r.last, p); !was {
				fresh = append(fresh, p)
			}
		}
	}
	r.last = refused
	r.mu.Unlock()
	if len(fresh) > 0 {
		r.Log.Warn(r.Message, append([]any{"count", len(refused), "new", len(fresh), "peers", strings.Join(fresh, "; ")}, attrs...)...)
	}
	return changed
}
