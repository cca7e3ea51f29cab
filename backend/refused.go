package backend

import (
	"log/slog"
	"slices"
	"strings"
	"sync"
)

// RefusedPeers logs the peers a backend refuses to program once per change
// of the set, so that a steady state does not write a line per peer per
// resync. Safe for concurrent use.
type RefusedPeers struct {
	Log *slog.Logger
	// Message is the warning: what was refused, why, and what to do.
	Message string

	mu   sync.Mutex
	last []string // sorted
}

// Report takes the peers refused now ("<lease>: <reason>", any order) and
// logs them, with attrs, when they differ from the last report. It reports
// whether the set changed.
func (r *RefusedPeers) Report(refused []string, attrs ...any) bool {
	refused = slices.Clone(refused)
	slices.Sort(refused)
	r.mu.Lock()
	changed := !slices.Equal(refused, r.last)
	r.last = refused
	r.mu.Unlock()
	if !changed || len(refused) == 0 {
		return changed
	}
	shown := refused[:min(5, len(refused))]
	r.Log.Warn(r.Message, append([]any{"count", len(refused), "peers", strings.Join(shown, "; ")}, attrs...)...)
	return true
}
