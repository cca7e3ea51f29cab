package network

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coreos/go-iptables/iptables"
)

// Chains keeps twill's iptables chains equal to the desired rules, for each
// address family in use, and repairs them periodically.
type Chains struct {
	Logger *slog.Logger
	// Families maps each address family's cluster Network to the local
	// node's subnet in it.
	Networks []NetworkPair
	IPMasq   bool
	// Resync is the period of the check while no Watch reports changes.
	Resync time.Duration
	// Watch, when set, follows the rules' changes (nl.WatchNftables, for
	// iptables-nft): it calls subscribed once it sees every change, then
	// changed after each, until ctx ends.
	Watch func(ctx context.Context, subscribed, changed func()) error
	// WatchedResync is the period of the check while Watch works (5 min
	// when zero): a safety net, the changes themselves trigger checks.
	WatchedResync time.Duration
	// Open gives the iptables of one family (OpenIPTables when nil; a
	// model of the tables in unit tests).
	Open func(v6 bool) (IPTables, error)

	mu       sync.Mutex
	observed map[string][]string // guarded by mu; chain listing as iptables printed it after the last write
}

// NetworkPair is the cluster Network and this node's subnet in it.
type NetworkPair struct {
	Cluster, Local netip.Prefix
}

// IPTables is what Chains reads and changes: *iptables.IPTables has it,
// internal/iptfake models the tables.
type IPTables interface {
	ChainExists(table, chain string) (bool, error)
	NewChain(table, chain string) error
	List(table, chain string) ([]string, error)
	ClearChain(table, chain string) error
	Append(table, chain string, rulespec ...string) error
	Exists(table, chain string, rulespec ...string) (bool, error)
	Insert(table, chain string, pos int, rulespec ...string) error
}

var _ IPTables = (*iptables.IPTables)(nil)

// OpenIPTables opens the machine's iptables for one family.
func OpenIPTables(v6 bool) (IPTables, error) {
	proto := iptables.ProtocolIPv4
	if v6 {
		proto = iptables.ProtocolIPv6
	}
	return iptables.New(iptables.IPFamily(proto), iptables.Timeout(5))
}

// Sync makes every chain match once.
func (c *Chains) Sync() error {
	var errs []error
	open := c.Open
	if open == nil {
		open = OpenIPTables
	}
	for _, np := range c.Networks {
		ipt, err := open(np.Cluster.Addr().Is6())
		if err != nil {
			errs = append(errs, fmt.Errorf("opening iptables: %w", err))
			continue
		}
		rules := DesiredRules(np.Cluster, np.Local, c.IPMasq)
		for _, j := range Jumps {
			var mine []Rule
			for _, r := range rules {
				if r.Chain == j.To {
					mine = append(mine, r)
				}
			}
			if err := c.syncChain(ipt, np.Cluster.Addr().Is6(), j, mine); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

func (c *Chains) syncChain(ipt IPTables, v6 bool, j Jump, rules []Rule) error {
	key := fmt.Sprintf("%v/%s/%s", v6, j.Table, j.To)
	exists, err := ipt.ChainExists(j.Table, j.To)
	if err != nil {
		return fmt.Errorf("checking chain %s/%s: %w", j.Table, j.To, err)
	}
	if !exists {
		if err := ipt.NewChain(j.Table, j.To); err != nil {
			return fmt.Errorf("creating chain %s/%s: %w", j.Table, j.To, err)
		}
	}
	got, err := ipt.List(j.Table, j.To)
	if err != nil {
		return fmt.Errorf("listing chain %s/%s: %w", j.Table, j.To, err)
	}
	c.mu.Lock()
	want, known := c.observed[key]
	c.mu.Unlock()
	if !known || !slices.Equal(got, want) {
		// Unknown or changed behind our back: write the chain afresh. A
		// missing rule is appended by ClearChain+Append in order, so the
		// order stays the one DesiredRules gives.
		if known {
			c.Logger.Info("iptables chain drifted; rewriting", "table", j.Table, "chain", j.To)
		}
		if err := ipt.ClearChain(j.Table, j.To); err != nil {
			return fmt.Errorf("flushing chain %s/%s: %w", j.Table, j.To, err)
		}
		for _, r := range rules {
			if err := ipt.Append(r.Table, r.Chain, r.Spec...); err != nil {
				return fmt.Errorf("adding rule to %s/%s (%s): %w", r.Table, r.Chain, strings.Join(r.Spec, " "), err)
			}
		}
		got, err = ipt.List(j.Table, j.To)
		if err != nil {
			return fmt.Errorf("listing chain %s/%s: %w", j.Table, j.To, err)
		}
		c.mu.Lock()
		if c.observed == nil {
			c.observed = map[string][]string{}
		}
		c.observed[key] = got
		c.mu.Unlock()
	}
	jump := []string{"-m", "comment", "--comment", "twill", "-j", j.To}
	ok, err := ipt.Exists(j.Table, j.From, jump...)
	if err != nil {
		return fmt.Errorf("checking jump %s/%s -> %s: %w", j.Table, j.From, j.To, err)
	}
	if !ok {
		if err := ipt.Insert(j.Table, j.From, 1, jump...); err != nil {
			return fmt.Errorf("adding jump %s/%s -> %s: %w", j.Table, j.From, j.To, err)
		}
	}
	return nil
}

// Run syncs every Resync until ctx is done, and, while Watch reports
// changes, at once after each change and otherwise only every
// WatchedResync. Failures are logged and retried at the next tick; they do
// not stop the daemon.
func (c *Chains) Run(ctx context.Context) error {
	resync, watched := c.Resync, c.WatchedResync
	if resync <= 0 {
		resync = 5 * time.Second
	}
	if watched <= 0 {
		watched = 5 * time.Minute
	}
	changed := make(chan struct{}, 1)
	var watching atomic.Bool
	if c.Watch != nil {
		go c.watch(ctx, &watching, changed)
	}
	t := time.NewTimer(resync)
	defer t.Stop()
	var last time.Time
	for {
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
		}
		last = time.Now()
		if err := c.Sync(); err != nil {
			c.Logger.Warn("iptables resync failed", "err", err)
		}
		if watching.Load() {
			t.Reset(watched)
		} else {
			t.Reset(resync)
		}
	}
}

// watch runs Watch until ctx is done, poking changed after each change and
// once per (re)subscription (changes before it went unseen), and says
// whether it is watching. A broken watch is retried every 5 s; meanwhile
// Run polls.
func (c *Chains) watch(ctx context.Context, watching *atomic.Bool, changed chan<- struct{}) {
	poke := func() {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	for ctx.Err() == nil {
		err := c.Watch(ctx, func() { watching.Store(true); poke() }, poke)
		watching.Store(false)
		if ctx.Err() != nil {
			return
		}
		c.Logger.Warn("watching iptables for changes failed; checking every resync period instead", "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(5 * time.Second):
		}
	}
}

// UsesNFTables reports whether the iptables binary of the family writes
// nftables (iptables-nft), whose changes nl.WatchNftables reports; the
// legacy one sends no notifications.
func UsesNFTables(v6 bool) bool {
	bin := "iptables"
	if v6 {
		bin = "ip6tables"
	}
	out, err := exec.Command(bin, "--version").Output()
	return err == nil && strings.Contains(string(out), "nf_tables")
}

// CleanupChains removes twill's jumps and chains for both families. Chains
// that do not exist, or an iptables binary missing for a family, are fine.
func CleanupChains() error {
	var errs []error
	for _, proto := range []iptables.Protocol{iptables.ProtocolIPv4, iptables.ProtocolIPv6} {
		ipt, err := iptables.New(iptables.IPFamily(proto), iptables.Timeout(5))
		if err != nil {
			if proto == iptables.ProtocolIPv4 {
				errs = append(errs, fmt.Errorf("opening iptables: %w", err))
			}
			continue
		}
		for _, j := range Jumps {
			jump := []string{"-m", "comment", "--comment", "twill", "-j", j.To}
			if err := ipt.DeleteIfExists(j.Table, j.From, jump...); err != nil {
				var e *iptables.Error
				if !errors.As(err, &e) || !e.IsNotExist() {
					errs = append(errs, fmt.Errorf("removing jump %s/%s -> %s: %w", j.Table, j.From, j.To, err))
				}
			}
			if err := ipt.ClearAndDeleteChain(j.Table, j.To); err != nil {
				errs = append(errs, fmt.Errorf("removing chain %s/%s: %w", j.Table, j.To, err))
			}
		}
	}
	return errors.Join(errs...)
}
