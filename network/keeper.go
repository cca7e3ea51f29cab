package network

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/twill-net/twill/internal/tick"
)

// Syncer makes one mode's rules equal to the desired ones, writing only
// what differs.
type Syncer interface {
	Sync() error
}

// Keeper keeps a Syncer's rules in place: it syncs when Watch reports a
// change and periodically.
type Keeper struct {
	Logger *slog.Logger
	Rules  Syncer
	// Resync is the period of the check while no Watch reports changes
	// (5 s when zero).
	Resync time.Duration
	// Watch, when set, follows the rules' changes (nl.WatchNftables, for
	// nftables and iptables-nft): it calls subscribed once it sees every
	// change, then changed after each, until ctx ends.
	Watch func(ctx context.Context, subscribed, changed func()) error
	// WatchedResync is the period of the check while Watch works (5 min
	// when zero): a safety net, the changes themselves trigger checks.
	WatchedResync time.Duration
	// Generation, when set beside Watch, reads nftables' generation
	// (nl.NftGeneration), which every committed change of any table moves.
	// The safety net then checks only when it moved since the last clean
	// check began: an idle node runs no check, and in the iptables mode
	// spawns no iptables.
	Generation func() (uint32, error)
}

// retryFailed is how soon a failed sync is tried again.
const retryFailed = time.Second

// Run syncs every Resync until ctx is done, and, while Watch reports
// changes, at once after each change and otherwise only every
// WatchedResync. Failures are logged and retried after retryFailed (or
// Resync, if shorter), watch or not: no change may come to trigger the
// retry. They do not stop the daemon.
func (k *Keeper) Run(ctx context.Context) error {
	resync, watched := k.Resync, k.WatchedResync
	if resync <= 0 {
		resync = 5 * time.Second
	}
	if watched <= 0 {
		watched = 5 * time.Minute
	}
	changed := make(chan struct{}, 1)
	var watching atomic.Bool
	if k.Watch != nil {
		go k.watch(ctx, &watching, changed)
	}
	t := time.NewTimer(resync)
	defer t.Stop()
	var (
		last time.Time
		gen  genMark
	)
	for {
		safetyNet := false // the check is the safety net's, not a change's
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
			// A busy node's rules change often (kube-proxy rewrites its
			// own every second at most): check at most once a second,
			// once the second is over.
			if wait := time.Second - time.Since(last); wait > 0 {
				t.Reset(wait)
				continue
			}
		case <-t.C:
			safetyNet = watching.Load()
		}
		now, read := k.generation()
		if safetyNet && gen.clean && read && now == gen.n {
			t.Reset(watched) // nothing committed since the last clean check
			continue
		}
		last = time.Now()
		err := k.Rules.Sync()
		// Marked at the generation read before the check: a change made
		// while it ran, a repair it wrote included, moves the generation
		// past it, so the next safety net checks again.
		gen = genMark{n: now, clean: err == nil && read}
		switch {
		case err != nil:
			k.Logger.Warn("netfilter resync failed", "err", err)
			t.Reset(min(resync, retryFailed))
		case watching.Load():
			t.Reset(watched)
		default:
			t.Reset(resync)
		}
	}
}

// genMark is nftables' generation as read before the last check, and
// whether that check succeeded with the generation read.
type genMark struct {
	n     uint32
	clean bool
}

// generation reads nftables' generation, and says whether it could (only
// with Generation and Watch set).
func (k *Keeper) generation() (uint32, bool) {
	if k.Generation == nil || k.Watch == nil {
		return 0, false
	}
	n, err := k.Generation()
	return n, err == nil
}

// watch runs Watch until ctx is done, poking changed after each change and
// once per (re)subscription (changes before it went unseen), and says
// whether it is watching. A broken watch is retried every 5 s; meanwhile
// Run polls.
func (k *Keeper) watch(ctx context.Context, watching *atomic.Bool, changed chan<- struct{}) {
	poke := func() {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	tick.Restart(ctx, 5*time.Second, func(ctx context.Context) error {
		err := k.Watch(ctx, func() { watching.Store(true); poke() }, poke)
		watching.Store(false)
		return err
	}, func(err error) {
		k.Logger.Warn("watching netfilter for changes failed; checking every resync period instead", "err", err)
	})
}
