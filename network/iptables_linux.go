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

// IPTables is what Chains reads and changes: Sync reads each table as
// iptables-save prints it and writes a family's changes with one
// iptables-restore, each table's in one commit; Drift (twillctl status)
// asks iptables about each rule. execTables runs the binaries;
// testsupport/iptfake models the tables.
type IPTables interface {
	ChainExists(table, chain string) (bool, error)
	List(table, chain string) ([]string, error)
	Exists(table, chain string, rulespec ...string) (bool, error)
	// Save is the table as iptables-save -t table prints it, a line each.
	Save(table string) ([]string, error)
	// Restore applies input as iptables-restore --noflush does: each
	// table's section (*table ... COMMIT) commits whole or not at all,
	// and a user chain declared in it (:CHAIN - [0:0]) is created, or
	// flushed when it exists.
	Restore(input string) error
}

// execTables is one family's iptables binaries: go-iptables for single
// rules, iptables-save and iptables-restore for whole tables.
type execTables struct {
	*iptables.IPTables
	bin string // iptables or ip6tables
}

var _ IPTables = execTables{}

// OpenIPTables opens the machine's iptables for one family.
func OpenIPTables(v6 bool) (IPTables, error) {
	proto, bin := iptables.ProtocolIPv4, "iptables"
	if v6 {
		proto, bin = iptables.ProtocolIPv6, "ip6tables"
	}
	ipt, err := iptables.New(iptables.IPFamily(proto), iptables.Timeout(5))
	if err != nil {
		return nil, err
	}
	return execTables{IPTables: ipt, bin: bin}, nil
}

func (e execTables) Save(table string) ([]string, error) {
	var stderr strings.Builder
	cmd := exec.Command(e.bin+"-save", "-t", table)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s-save -t %s: %w: %s", e.bin, table, err, strings.TrimSpace(stderr.String()))
	}
	return strings.Split(strings.TrimRight(string(out), "\n"), "\n"), nil
}

func (e execTables) Restore(input string) error {
	cmd := exec.Command(e.bin+"-restore", "--noflush", "-w", "5")
	cmd.Stdin = strings.NewReader(input)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s-restore: %w: %s", e.bin, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Sync makes every chain match once: for each family it reads the tables
// twill has chains in, and writes what differs in one iptables-restore
// (three iptables runs a family when a chain is written, two when none
// is; each rule took one of its own before).
func (c *Chains) Sync() error {
	var errs []error
	for _, np := range c.Networks {
		v6 := np.Cluster.Addr().Is6()
		ipt, err := c.open(v6)
		if err != nil {
			errs = append(errs, fmt.Errorf("opening iptables: %w", err))
			continue
		}
		if err := c.syncFamily(ipt, v6, DesiredRules(np.Cluster, np.Local, c.IPMasq)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// chainPlan is what a sync writes of one of twill's chains.
type chainPlan struct {
	j       Jump
	key     string // in observed
	rules   []Rule
	rewrite bool // the chain, afresh
	jump    bool // the jump to it, first in its built-in chain
	listed  int  // rules listed after the last write, when not len(rules)
}

// syncFamily diffs the family's chains and jumps against what it last
// wrote (a chain unknown or changed since is written afresh, in
// DesiredRules' order) and writes the differences.
func (c *Chains) syncFamily(ipt IPTables, v6 bool, rules []Rule) error {
	saved, err := saveTables(ipt)
	if err != nil {
		return err
	}
	var plans []chainPlan
	for _, j := range Jumps {
		p := chainPlan{j: j, key: fmt.Sprintf("%v/%s/%s", v6, j.Table, j.To)}
		for _, r := range rules {
			if r.Chain == j.To {
				p.rules = append(p.rules, r)
			}
		}
		t := saved[j.Table]
		got, exists := t.rules[j.To], t.chains[j.To]
		c.mu.Lock()
		want, known := c.observed[p.key]
		c.mu.Unlock()
		if p.rewrite = !exists || !known || !slices.Equal(got, want); p.rewrite && known {
			// Unknown or changed behind our back: write the chain afresh.
			c.Logger.Info("iptables chain drifted; rewriting", "table", j.Table, "chain", j.To)
			c.repaired()
		}
		if p.jump = !slices.Contains(t.rules[j.From], jumpLine(j)); p.jump && known {
			c.Logger.Info("iptables jump missing; adding it", "table", j.Table, "chain", j.From, "to", j.To)
			c.repaired()
		}
		if p.rewrite || p.jump {
			plans = append(plans, p)
		}
	}
	if len(plans) == 0 {
		return nil
	}
	return c.write(ipt, plans)
}

// rewriteAttempts bounds how often a sync writes a chain that someone
// else changes while it is written.
const rewriteAttempts = 3

// write applies plans in one iptables-restore and records each rewritten
// chain's listing, which the next sync compares with. A listing that is
// not the rules just written (a flush or a delete between the write and
// the listing) would make that change look like twill's own: the chain is
// written again, up to rewriteAttempts times, and never recorded so.
func (c *Chains) write(ipt IPTables, plans []chainPlan) error {
	for range rewriteAttempts {
		if err := ipt.Restore(restoreInput(plans)); err != nil {
			return fmt.Errorf("writing twill's iptables chains: %w", err)
		}
		saved, err := saveTables(ipt)
		if err != nil {
			return err
		}
		var again []chainPlan
		for _, p := range plans {
			if !p.rewrite {
				continue
			}
			got := saved[p.j.Table].rules[p.j.To]
			c.mu.Lock()
			if len(got) == len(p.rules) {
				if c.observed == nil {
					c.observed = map[string][]string{}
				}
				c.observed[p.key] = got
			} else {
				delete(c.observed, p.key)
				again = append(again, chainPlan{j: p.j, key: p.key, rules: p.rules, rewrite: true, listed: len(got)})
			}
			c.mu.Unlock()
		}
		if len(again) == 0 {
			return nil
		}
		plans = again
	}
	p := plans[0]
	return fmt.Errorf("chain %s/%s changed each time twill wrote it (%d rules listed after writing %d, %d times)", p.j.Table, p.j.To, p.listed, len(p.rules), rewriteAttempts)
}

// savedTable is a table as iptables-save lists it: its chains, and each
// chain's rules ("-A CHAIN spec", in order).
type savedTable struct {
	chains map[string]bool
	rules  map[string][]string
}

// saveTables reads the tables twill has chains in.
func saveTables(ipt IPTables) (map[string]savedTable, error) {
	saved := map[string]savedTable{}
	for _, j := range Jumps {
		if _, ok := saved[j.Table]; ok {
			continue
		}
		lines, err := ipt.Save(j.Table)
		if err != nil {
			return nil, fmt.Errorf("reading iptables table %s: %w", j.Table, err)
		}
		saved[j.Table] = parseSave(lines)
	}
	return saved, nil
}

func parseSave(lines []string) savedTable {
	t := savedTable{chains: map[string]bool{}, rules: map[string][]string{}}
	for _, l := range lines {
		switch {
		case strings.HasPrefix(l, ":"):
			if name, _, ok := strings.Cut(l[1:], " "); ok {
				t.chains[name] = true
			}
		case strings.HasPrefix(l, "-A "):
			if name, _, ok := strings.Cut(l[3:], " "); ok {
				t.rules[name] = append(t.rules[name], l)
			}
		}
	}
	return t
}

// jumpLine is the jump into twill's chain as iptables-save lists it.
func jumpLine(j Jump) string {
	return "-A " + j.From + " -m comment --comment twill -j " + j.To
}

// restoreInput is plans as iptables-restore --noflush reads them: per
// table, each chain to rewrite declared (which flushes it) and its rules,
// then the missing jumps, inserted first.
func restoreInput(plans []chainPlan) string {
	var b strings.Builder
	var tables []string
	for _, j := range Jumps {
		if !slices.Contains(tables, j.Table) {
			tables = append(tables, j.Table)
		}
	}
	for _, table := range tables {
		var body strings.Builder
		for _, p := range plans {
			if p.j.Table != table || !p.rewrite {
				continue
			}
			fmt.Fprintf(&body, ":%s - [0:0]\n", p.j.To)
			for _, r := range p.rules {
				body.WriteString("-A " + r.Chain + " " + restoreArgs(r.Spec()) + "\n")
			}
		}
		for _, p := range plans {
			if p.j.Table == table && p.jump {
				body.WriteString("-I " + p.j.From + " 1 -m comment --comment twill -j " + p.j.To + "\n")
			}
		}
		if body.Len() > 0 {
			b.WriteString("*" + table + "\n" + body.String() + "COMMIT\n")
		}
	}
	return b.String()
}

// restoreArgs joins a rule's arguments for iptables-restore, quoting
// those with spaces (comments).
func restoreArgs(args []string) string {
	q := make([]string, len(args))
	for i, a := range args {
		q[i] = a
		if a == "" || strings.ContainsAny(a, " \t\"'\\") {
			q[i] = `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(a) + `"`
		}
	}
	return strings.Join(q, " ")
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
