package network

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"sync"

	"github.com/coreos/go-iptables/iptables"
)

// Chains makes twill's iptables chains equal to the desired rules, for each
// address family in use (a Keeper runs it when the rules change, and
// periodically).
type Chains struct {
	Logger *slog.Logger
	// Families maps each address family's cluster Network to the local
	// node's subnet in it.
	Networks []NetworkPair
	IPMasq   bool
	// Repaired, when set, is called for each repair of rules that had
	// been written and then changed behind twill's back.
	Repaired func()
	// Open gives the iptables of one family (OpenIPTables when nil; a
	// model of the tables in unit tests).
	Open func(v6 bool) (IPTables, error)

	mu       sync.Mutex
	observed map[string][]string // guarded by mu; chain listing as iptables printed it after the last write
	opened   [2]IPTables         // guarded by mu; per family (v6 second), once opened
}

func (c *Chains) repaired() {
	if c.Repaired != nil {
		c.Repaired()
	}
}

// open gives the family's iptables, opened once (opening execs
// iptables --version).
func (c *Chains) open(v6 bool) (IPTables, error) {
	i := 0
	if v6 {
		i = 1
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.opened[i] != nil {
		return c.opened[i], nil
	}
	open := c.Open
	if open == nil {
		open = OpenIPTables
	}
	ipt, err := open(v6)
	if err != nil {
		return nil, err
	}
	c.opened[i] = ipt
	return ipt, nil
}

// NetworkPair is the cluster Network and this node's subnet in it.
type NetworkPair struct {
	Cluster, Local netip.Prefix
}

// IPTables is what Chains reads and changes: *iptables.IPTables has it,
// testsupport/iptfake models the tables.
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
	for _, np := range c.Networks {
		ipt, err := c.open(np.Cluster.Addr().Is6())
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
			c.repaired()
		}
		if err := c.rewriteChain(ipt, key, j, rules); err != nil {
			return err
		}
	}
	jump := []string{"-m", "comment", "--comment", "twill", "-j", j.To}
	ok, err := ipt.Exists(j.Table, j.From, jump...)
	if err != nil {
		return fmt.Errorf("checking jump %s/%s -> %s: %w", j.Table, j.From, j.To, err)
	}
	if !ok {
		if known {
			c.Logger.Info("iptables jump missing; adding it", "table", j.Table, "chain", j.From, "to", j.To)
			c.repaired()
		}
		if err := ipt.Insert(j.Table, j.From, 1, jump...); err != nil {
			return fmt.Errorf("adding jump %s/%s -> %s: %w", j.Table, j.From, j.To, err)
		}
	}
	return nil
}

// rewriteAttempts bounds how often rewriteChain writes a chain that
// someone else changes while it is written.
const rewriteAttempts = 3

// rewriteChain writes the chain afresh (ClearChain, then the rules in
// DesiredRules' order) and records its listing, which the next check
// compares with. A listing that is not the rules just written (a flush or
// a delete between the write and the listing) would make that change look
// like twill's own: the chain is written again, up to rewriteAttempts
// times, and never recorded so.
func (c *Chains) rewriteChain(ipt IPTables, key string, j Jump, rules []Rule) error {
	var listed int
	for range rewriteAttempts {
		if err := ipt.ClearChain(j.Table, j.To); err != nil {
			return fmt.Errorf("flushing chain %s/%s: %w", j.Table, j.To, err)
		}
		for _, r := range rules {
			if err := ipt.Append(r.Table, r.Chain, r.Spec()...); err != nil {
				return fmt.Errorf("adding rule to %s/%s (%s): %w", r.Table, r.Chain, strings.Join(r.Spec(), " "), err)
			}
		}
		got, err := ipt.List(j.Table, j.To)
		if err != nil {
			return fmt.Errorf("listing chain %s/%s: %w", j.Table, j.To, err)
		}
		if listed = listedRules(got, j.To); listed == len(rules) {
			c.mu.Lock()
			if c.observed == nil {
				c.observed = map[string][]string{}
			}
			c.observed[key] = got
			c.mu.Unlock()
			return nil
		}
	}
	c.mu.Lock()
	delete(c.observed, key)
	c.mu.Unlock()
	return fmt.Errorf("chain %s/%s changed each time twill wrote it (%d rules listed after writing %d, %d times)", j.Table, j.To, listed, len(rules), rewriteAttempts)
}

// listedRules counts the rules of chain in an `iptables -S chain` listing.
func listedRules(listing []string, chain string) int {
	n := 0
	for _, l := range listing {
		if strings.HasPrefix(l, "-A "+chain+" ") {
			n++
		}
	}
	return n
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

// HasChains reports whether twill's iptables chains exist in either family
// (an iptables mode ran here); a family whose iptables is missing has none.
func HasChains() (bool, error) { return AnyChain(Jumps) }

// AnyChain reports whether the chain a jump goes to (To, in Table) exists
// for one of jumps in either family's iptables; a family whose iptables
// is missing has none.
func AnyChain(jumps []Jump) (bool, error) {
	for _, v6 := range []bool{false, true} {
		ipt, err := OpenIPTables(v6)
		if err != nil {
			continue
		}
		for _, j := range jumps {
			ok, err := ipt.ChainExists(j.Table, j.To)
			if err != nil {
				return false, fmt.Errorf("checking chain %s/%s: %w", j.Table, j.To, err)
			}
			if ok {
				return true, nil
			}
		}
	}
	return false, nil
}

// Drift says how twill's iptables chains and jumps differ from the desired
// rules, without changing anything. A rule matches when iptables -C finds
// it; the chain's rules are then compared in order by their comments.
func (c *Chains) Drift() (RuleDrift, error) {
	var d RuleDrift
	for _, np := range c.Networks {
		v6 := np.Cluster.Addr().Is6()
		ipt, err := c.open(v6)
		if err != nil {
			return d, fmt.Errorf("opening iptables: %w", err)
		}
		rules := DesiredRules(np.Cluster, np.Local, c.IPMasq)
		for _, j := range Jumps {
			if err := chainDrift(&d, ipt, v6, j, rules); err != nil {
				return d, err
			}
		}
	}
	return d, nil
}

func chainDrift(d *RuleDrift, ipt IPTables, v6 bool, j Jump, rules []Rule) error {
	fam := "ipv4"
	if v6 {
		fam = "ipv6"
	}
	where := fmt.Sprintf("%s %s/%s", fam, j.Table, j.To)
	ok, err := ipt.Exists(j.Table, j.From, "-m", "comment", "--comment", "twill", "-j", j.To)
	if err != nil && !isNoChain(err) {
		return fmt.Errorf("checking jump %s/%s -> %s: %w", j.Table, j.From, j.To, err)
	}
	if !ok {
		d.Missing = append(d.Missing, fmt.Sprintf("jump %s %s/%s -> %s", fam, j.Table, j.From, j.To))
	}
	if exists, err := ipt.ChainExists(j.Table, j.To); err != nil {
		return fmt.Errorf("checking chain %s: %w", where, err)
	} else if !exists {
		d.Missing = append(d.Missing, "chain "+where)
		return nil
	}
	listed, err := ipt.List(j.Table, j.To)
	if err != nil {
		return fmt.Errorf("listing chain %s: %w", where, err)
	}
	listed = slices.DeleteFunc(listed, func(l string) bool { return !strings.HasPrefix(l, "-A ") })
	var mine []Rule
	for _, r := range rules {
		if r.Chain == j.To {
			mine = append(mine, r)
		}
	}
	present := 0
	for _, r := range mine {
		ok, err := ipt.Exists(r.Table, r.Chain, r.Spec()...)
		if err != nil {
			return fmt.Errorf("checking a rule in %s: %w", where, err)
		}
		if !ok {
			d.Missing = append(d.Missing, fmt.Sprintf("rule in %s: %s", where, r.Comment))
			continue
		}
		present++
	}
	extra := 0
	for _, l := range listed {
		if !slices.ContainsFunc(mine, func(r Rule) bool { return strings.Contains(l, r.Comment) }) {
			d.Extra = append(d.Extra, fmt.Sprintf("rule in %s: %s", where, l))
			extra++
		}
	}
	if dup := len(listed) - extra - present; dup > 0 {
		d.Extra = append(d.Extra, fmt.Sprintf("%d rules in %s repeat or alter twill's", dup, where))
	}
	if present == len(mine) && len(listed) == len(mine) {
		for i, r := range mine {
			if !strings.Contains(listed[i], r.Comment) {
				d.Wrong = append(d.Wrong, fmt.Sprintf("rules in %s: out of order", where))
				break
			}
		}
	}
	return nil
}

func isNoChain(err error) bool {
	var e *iptables.Error
	return errors.As(err, &e) && e.IsNotExist()
}
