package policy

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/twill-net/twill/internal/tick"
)

// Source is the informers' state: what Compile reads, and a signal when it
// changes.
type Source interface {
	// Start begins watching; synced is closed once every list is complete.
	Start(ctx context.Context, changed func()) (synced <-chan struct{})
	Snapshot() Snapshot // Pods, Namespaces, Policies
}

// Kernel is where the ruleset goes: Table, or a fake in tests.
type Kernel interface {
	// Sync writes what differs from the table as last written, or, when
	// reread, from the kernel's.
	Sync(rs Ruleset, reread bool) (Changes, error)
}

// Enforcer keeps the policy table equal to what the informers' state
// says: at once after each change, and at every Resync or watched table
// change (drift).
type Enforcer struct {
	Logger *slog.Logger
	Source Source
	Kernel Kernel
	Node   string
	// LogDenied, LogAllowed and LogSample are Snapshot's; LogOff turns
	// every log rule off, the namespaces' annotations' too (set before Run).
	LogDenied  bool
	LogAllowed bool
	LogSample  uint32
	LogOff     bool
	// Allocations, when set, lists the addresses the CNI plugin gave on
	// the node (an unmanaged pod's is allowed after UnmanagedGrace).
	Allocations func() ([]Allocation, error)
	// Resync is the period of the drift check while Watch does not work
	// (2 s when zero); with Watch, 5 min.
	Resync time.Duration
	// Watch, when set, follows nftables changes (nl.WatchNftables).
	Watch func(ctx context.Context, subscribed, changed func()) error
	// Synced, when set, is called after the first sync that followed the
	// informers' complete lists.
	Synced func()
	// Applied, when set, gets the time each change took to reach the
	// kernel, from the event.
	Applied func(time.Duration)
	// Repaired, when set, is called after each repair of drift.
	Repaired func()
	// Compiled, when set, gets each snapshot written and its compile
	// (ClusterStatus.Update).
	Compiled func(Snapshot, Result)

	compiler Compiler // syncOnce's alone

	mu       sync.Mutex // guards the fields below
	local    []netip.Prefix
	selected map[string]Selection
	problems map[string]bool // policy + "\x00" + problem, as last reported
	last     Ruleset         // as last written
	pods     []*corev1.Pod   // of the last snapshot
	records  []*podRecord    // of the last snapshot
	byIP     map[netip.Addr]string
}

// Ruleset is the table as last written.
func (e *Enforcer) Ruleset() Ruleset {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.last
}

// PodByIP names the pod (namespace/name) that holds ip, as of the last
// sync, or "".
func (e *Enforcer) PodByIP(ip netip.Addr) string {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.byIP == nil {
		e.byIP = map[netip.Addr]string{}
		add := func(p *pod) {
			if p != nil {
				for _, a := range p.ips {
					e.byIP[a] = p.key
				}
			}
		}
		for _, p := range e.pods {
			add(podOf(p, ""))
		}
		for _, r := range e.records {
			add(r.pod)
		}
	}
	return e.byIP[ip.Unmap()]
}

// Selected says which policies select a local pod (namespace/name).
func (e *Enforcer) Selected(pod string) Selection {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.selected[pod]
}

// Run enforces for the node's pod CIDRs until ctx is done. The table stays
// when it returns: stopping twilld leaves pods isolated (fail closed).
func (e *Enforcer) Run(ctx context.Context, local []netip.Prefix) error {
	e.mu.Lock()
	e.local = slices.Clone(local)
	e.mu.Unlock()
	kick, drift := make(chan struct{}, 1), make(chan struct{}, 1)
	pend := &pending{}
	synced := e.Source.Start(ctx, func() { pend.mark(); poke(kick) })
	select {
	case <-synced:
	case <-ctx.Done():
		return nil
	}
	watching := make(chan bool, 1)
	if e.Watch != nil {
		go e.watch(ctx, func() { poke(drift) }, watching)
	}
	if e.Allocations != nil {
		go e.ageAllocations(ctx, func() { pend.mark(); poke(kick) })
	}
	return e.loop(ctx, kick, drift, watching, pend)
}

// allocationsEvery is how often the CNI plugin's allocations are read for
// addresses that came of age (UnmanagedGrace).
const allocationsEvery = 5 * time.Second

// ageAllocations calls changed whenever the set of allocations older than
// UnmanagedGrace changes, until ctx is done.
func (e *Enforcer) ageAllocations(ctx context.Context, changed func()) {
	var last []netip.Addr
	_ = tick.Every(ctx, allocationsEvery, func() {
		as, err := e.Allocations()
		if err != nil {
			return // the next sync reports it
		}
		var aged []netip.Addr
		for _, a := range as {
			if time.Since(a.At) >= UnmanagedGrace {
				aged = append(aged, a.IP)
			}
		}
		slices.SortFunc(aged, netip.Addr.Compare)
		if !slices.Equal(aged, last) {
			last = aged
			changed()
		}
	})
}

func poke(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// pending is when the oldest change not yet applied came.
type pending struct {
	mu    sync.Mutex
	first time.Time // guarded by mu
}

func (p *pending) mark() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.first.IsZero() {
		p.first = time.Now()
	}
}

// take returns the oldest change's time (zero when none) and forgets it.
func (p *pending) take() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	t := p.first
	p.first = time.Time{}
	return t
}

// loop syncs at once after each change of the informers' state, at most
// once a second after changes to the table, and every resync period.
func (e *Enforcer) loop(ctx context.Context, kick, drift <-chan struct{}, watching <-chan bool, pend *pending) error {
	resync, watched := e.Resync, 5*time.Minute
	if resync <= 0 {
		resync = 2 * time.Second
	}
	period := resync
	t := time.NewTimer(0)
	defer t.Stop()
	isFirst := true
	var last time.Time
	// drifted: the table changed behind our back and has not been read
	// back since. It outlives syncs that do not read the kernel.
	drifted := false
	var gen generations
	for {
		kicked := false
		select {
		case <-ctx.Done():
			return nil
		case w := <-watching:
			period = resync
			if w {
				period = watched
			}
			continue
		case <-drift:
			if gen.own != 0 && e.generation() == gen.own {
				continue // nothing committed since our write: its notifications, lost
			}
			drifted = true
			if wait := time.Second - time.Since(last); wait > 0 {
				t.Reset(wait)
				continue
			}
		case <-kick:
			kicked = true
		case <-t.C:
		}
		since := pend.take()
		if kicked && since.IsZero() {
			// The change it tells of was written by the sync before: the
			// first sync, started by the timer, takes the informers'
			// first list, whose kick then comes second.
			continue
		}
		last = time.Now()
		// A change of the informers' state diffs against what was
		// written; a timer or a change to the table reads the kernel, and
		// so does the first sync, which has nothing to diff against: its
		// generation is then known to be its own, and the notifications
		// of its write (a large one overflows the watch's socket) read
		// nothing back (at 10,000 pods, a read back is 360 MB of garbage
		// and a second of CPU).
		reread := since.IsZero() || drifted || isFirst
		before := e.generation()
		ch, err := e.syncOnce(reread)
		gen.synced(reread, ch, err, before, e.generation())
		if err == nil && reread {
			drifted = false
		}
		if err != nil {
			e.Logger.Warn("network policy sync failed; retrying", "err", err)
			t.Reset(min(period, time.Second))
			continue
		}
		e.report(ch, since, isFirst)
		isFirst = false
		t.Reset(period)
	}
}

// generations follows nftables' generation across the enforcer's syncs.
type generations struct {
	// own is the generation after the last sync when no one else has
	// committed since the table was last known: read back by that sync,
	// or left by the one before with nothing committed in between (0: not
	// known).
	own  uint32
	last uint32 // the generation after the last sync
}

// synced records a sync that read the kernel's table (reread) or not,
// between generations before and after.
func (g *generations) synced(reread bool, ch Changes, err error, before, after uint32) {
	g.own = 0
	if err == nil && before != 0 && (reread || before == g.last) && (ch.Clean() && after == before || !ch.Clean() && after == before+1) {
		g.own = after
	}
	g.last = after
}

// report tells of a sync: a repair of drift (a write no change asked
// for), the time a change took, the first sync.
func (e *Enforcer) report(ch Changes, since time.Time, first bool) {
	if since.IsZero() && !first && !ch.Clean() {
		e.Logger.Info("network policy table drifted; repaired", "chains", ch.Chains, "elements", ch.Elems, "sets", ch.Sets, "full", ch.Full)
		if e.Repaired != nil {
			e.Repaired()
		}
	}
	if !since.IsZero() && e.Applied != nil {
		e.Applied(time.Since(since))
	}
	if first && e.Synced != nil {
		e.Synced()
	}
}

// generation is nftables' generation, when the Kernel reads it (0: not
// known). A write of a large table overflows the watch's socket, which
// counts as a change of the table; when the generation is still the one
// the enforcer's own write left, nothing else wrote.
func (e *Enforcer) generation() uint32 {
	k, ok := e.Kernel.(interface{ Generation() (uint32, error) })
	if !ok {
		return 0
	}
	g, err := k.Generation()
	if err != nil {
		return 0
	}
	return g
}

// watch runs Watch, poking after each change of the table, and says on
// watching whether it works.
func (e *Enforcer) watch(ctx context.Context, poke func(), watching chan bool) {
	say := func(v bool) {
		select {
		case <-watching:
		default:
		}
		watching <- v
	}
	tick.Restart(ctx, 5*time.Second, func(ctx context.Context) error {
		err := e.Watch(ctx, func() { say(true); poke() }, poke)
		say(false)
		return err
	}, func(err error) {
		e.Logger.Warn("watching nftables for changes failed; checking the policy table every resync period instead", "err", err)
	})
}

// syncOnce compiles the current state and writes what differs.
func (e *Enforcer) syncOnce(reread bool) (Changes, error) {
	s := e.Source.Snapshot()
	e.mu.Lock()
	s.Node, s.LocalCIDRs, s.Now = e.Node, e.local, time.Now()
	e.mu.Unlock()
	s.LogDenied, s.LogAllowed, s.LogSample, s.LogOff = e.LogDenied, e.LogAllowed, e.LogSample, e.LogOff
	if e.Allocations != nil {
		var err error
		if s.Allocations, err = e.Allocations(); err != nil {
			return Changes{}, fmt.Errorf("reading the CNI plugin's allocations: %w", err)
		}
	}
	r := e.compiler.Compile(s)
	ch, err := e.Kernel.Sync(r.Ruleset, reread)
	if err != nil {
		return Changes{}, fmt.Errorf("syncing table inet %s: %w", TableName, err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.selected = r.Selected
	e.last, e.pods, e.records, e.byIP = r.Ruleset, s.Pods, s.podRecords, nil
	seen := map[string]bool{}
	for _, p := range r.Problems {
		key := p.Policy + "\x00" + p.Err.Error()
		seen[key] = true
		if !e.problems[key] {
			e.Logger.Warn("network policy cannot be applied in full; what cannot be read fails closed", "policy", p.Policy, "err", p.Err)
		}
	}
	e.problems = seen
	if e.Compiled != nil {
		e.Compiled(s, r)
	}
	if !ch.Clean() {
		e.Logger.Debug("network policy table written", "full", ch.Full, "chains", ch.Chains, "elements", ch.Elems, "sets", ch.Sets, "deleted", ch.Del)
	}
	return ch, nil
}
