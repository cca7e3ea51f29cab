package nftables

import (
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"

	"github.com/google/nftables"
	"github.com/google/nftables/userdata"

	"github.com/twill-net/twill/network"
)

// Table keeps twill's table equal to the desired rules of every address
// family in use.
type Table struct {
	Logger   *slog.Logger
	Networks []network.NetworkPair
	IPMasq   bool
	// Repaired, when set, is called for each repair of a table that had
	// been written and then changed behind twill's back.
	Repaired func()
	// Dial opens a connection to the kernel's nftables (in the caller's
	// network namespace when nil).
	Dial func() (*nftables.Conn, error)

	mu    sync.Mutex
	wrote bool // guarded by mu; a later difference is drift
}

var _ network.Syncer = (*Table)(nil)

func dial(f func() (*nftables.Conn, error)) (*nftables.Conn, error) {
	if f == nil {
		f = func() (*nftables.Conn, error) { return nftables.New() }
	}
	c, err := f()
	if err != nil {
		return nil, fmt.Errorf("opening nftables: %w", err)
	}
	return c, nil
}

// Sync rewrites twill's table, in one transaction, when it differs from
// the desired rules; it writes nothing when they are equal.
func (t *Table) Sync() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	conn, err := dial(t.Dial)
	if err != nil {
		return err
	}
	want, d, err := t.drift(conn)
	if err != nil {
		return err
	}
	if d.Clean() {
		return nil
	}
	if t.wrote {
		t.Logger.Info("nftables table drifted; rewriting", "table", "inet "+TableName,
			"missing", d.Missing, "extra", d.Extra, "wrong", d.Wrong)
		if t.Repaired != nil {
			defer t.Repaired()
		}
	}
	// Create the table if it is missing, so that deleting it cannot fail,
	// then write it afresh: readers see the old table or the new one.
	table := twillTable()
	conn.AddTable(table)
	conn.DelTable(table)
	conn.AddTable(table)
	for _, w := range want {
		conn.AddChain(w.chain)
		for _, r := range w.rules {
			conn.AddRule(r)
		}
	}
	if err := conn.Flush(); err != nil {
		return fmt.Errorf("writing table inet %s: %w", TableName, err)
	}
	t.wrote = true
	return nil
}

// Drift says how the kernel's table differs from the desired rules,
// without changing anything.
func (t *Table) Drift() (network.RuleDrift, error) {
	conn, err := dial(t.Dial)
	if err != nil {
		return network.RuleDrift{}, err
	}
	_, d, err := t.drift(conn)
	return d, err
}

func (t *Table) drift(conn *nftables.Conn) ([]wantChain, network.RuleDrift, error) {
	want, err := desired(t.Networks, t.IPMasq)
	if err != nil {
		return nil, network.RuleDrift{}, err
	}
	got, exists, err := read(conn)
	if err != nil {
		return nil, network.RuleDrift{}, err
	}
	states := make([]chainState, len(want))
	for i, w := range want {
		states[i] = w.state
	}
	return want, diff(states, got, exists), nil
}

// read returns the chains and rules of twill's table, and whether it
// exists. Reading sends no change notifications.
func read(conn *nftables.Conn) ([]chainState, bool, error) {
	exists, err := tableExists(conn)
	if err != nil || !exists {
		return nil, false, err
	}
	chains, err := conn.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		return nil, false, fmt.Errorf("listing nftables chains: %w", err)
	}
	var got []chainState
	for _, c := range chains {
		if c.Table.Name != TableName {
			continue
		}
		rules, err := conn.GetRules(c.Table, c)
		if err != nil {
			return nil, false, fmt.Errorf("listing the rules of chain inet %s %s: %w", TableName, c.Name, err)
		}
		cs := chainState{Name: c.Name, Def: chainDef(c)}
		for _, r := range rules {
			rs := ruleState{Handle: r.Handle}
			rs.Comment, _ = userdata.GetString(r.UserData, userdata.TypeComment)
			if rs.Exprs, err = fingerprint(r.Exprs); err != nil {
				rs.Exprs = []byte("unreadable: " + err.Error()) // equals no wanted rule
			}
			cs.Rules = append(cs.Rules, rs)
		}
		got = append(got, cs)
	}
	slices.SortFunc(got, func(a, b chainState) int { return strings.Compare(a.Name, b.Name) })
	return got, true, nil
}

func tableExists(conn *nftables.Conn) (bool, error) {
	tables, err := conn.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		return false, fmt.Errorf("listing nftables tables: %w", err)
	}
	return slices.ContainsFunc(tables, func(t *nftables.Table) bool { return t.Name == TableName }), nil
}

// Delete removes twill's table if it exists, and says whether it did.
func Delete(dialer func() (*nftables.Conn, error)) (bool, error) {
	conn, err := dial(dialer)
	if err != nil {
		return false, err
	}
	exists, err := tableExists(conn)
	if err != nil || !exists {
		return false, err
	}
	conn.DelTable(twillTable())
	if err := conn.Flush(); err != nil {
		return false, fmt.Errorf("deleting table inet %s: %w", TableName, err)
	}
	return true, nil
}

// List opens nftables in the caller's namespace and lists what list lists
// (its tables, its chains: (*nftables.Conn).ListTables, ListChains), named
// what in an error.
func List[T any](what string, list func(*nftables.Conn) ([]T, error)) ([]T, error) {
	conn, err := nftables.New()
	if err != nil {
		return nil, fmt.Errorf("opening nftables: %w", err)
	}
	out, err := list(conn)
	if err != nil {
		return nil, fmt.Errorf("listing nftables %s: %w", what, err)
	}
	return out, nil
}
