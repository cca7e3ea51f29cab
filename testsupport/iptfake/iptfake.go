// Package iptfake models iptables' tables and chains as lists of rule
// specifications, behind the methods network.Chains uses, so that the
// chain sync is tested without root. Listings are in iptables -S form:
// "-P CHAIN ACCEPT" for a built-in chain or "-N CHAIN" for a user chain,
// then "-A CHAIN spec…" per rule. Specs are kept as given (iptables would
// normalise them).
package iptfake

import (
	"fmt"
	"slices"
	"strings"
	"sync"
)

// Tables is one family's tables. The zero value holds the built-in chains
// of filter and nat, empty; it is safe for concurrent use.
type Tables struct {
	mu     sync.Mutex
	chains map[string]map[string][]string // table -> chain -> rules
	user   map[string]bool                // "table/chain" of user chains
}

var builtin = map[string][]string{
	"filter": {"INPUT", "FORWARD", "OUTPUT"},
	"nat":    {"PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"},
}

func (t *Tables) initLocked() {
	if t.chains != nil {
		return
	}
	t.chains, t.user = map[string]map[string][]string{}, map[string]bool{}
	for table, chains := range builtin {
		t.chains[table] = map[string][]string{}
		for _, c := range chains {
			t.chains[table][c] = nil
		}
	}
}

func (t *Tables) chainLocked(table, chain string) ([]string, error) {
	t.initLocked()
	rules, ok := t.chains[table][chain]
	if !ok {
		return nil, fmt.Errorf("iptables: No chain/target/match by that name (table %s, chain %s)", table, chain)
	}
	return rules, nil
}

// ChainExists reports whether the chain exists.
func (t *Tables) ChainExists(table, chain string) (bool, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, err := t.chainLocked(table, chain)
	return err == nil, nil
}

// NewChain creates a user chain.
func (t *Tables) NewChain(table, chain string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.initLocked()
	if _, ok := t.chains[table]; !ok {
		return fmt.Errorf("iptables: table %s does not exist", table)
	}
	if _, ok := t.chains[table][chain]; ok {
		return fmt.Errorf("iptables: Chain already exists (table %s, chain %s)", table, chain)
	}
	t.chains[table][chain] = nil
	t.user[table+"/"+chain] = true
	return nil
}

// List lists a chain in iptables -S form.
func (t *Tables) List(table, chain string) ([]string, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	rules, err := t.chainLocked(table, chain)
	if err != nil {
		return nil, err
	}
	head := "-P " + chain + " ACCEPT"
	if t.user[table+"/"+chain] {
		head = "-N " + chain
	}
	out := []string{head}
	for _, r := range rules {
		out = append(out, "-A "+chain+" "+r)
	}
	return out, nil
}

// ClearChain empties a chain, creating it if needed.
func (t *Tables) ClearChain(table, chain string) error {
	t.mu.Lock()
	if _, err := t.chainLocked(table, chain); err != nil {
		t.mu.Unlock()
		return t.NewChain(table, chain)
	}
	t.chains[table][chain] = nil
	t.mu.Unlock()
	return nil
}

// Append adds a rule at the end of a chain.
func (t *Tables) Append(table, chain string, spec ...string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	rules, err := t.chainLocked(table, chain)
	if err != nil {
		return err
	}
	t.chains[table][chain] = append(rules, strings.Join(spec, " "))
	return nil
}

// Insert adds a rule at position pos (1 is the first).
func (t *Tables) Insert(table, chain string, pos int, spec ...string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	rules, err := t.chainLocked(table, chain)
	if err != nil {
		return err
	}
	if pos < 1 || pos > len(rules)+1 {
		return fmt.Errorf("iptables: Index of insertion too big (chain %s, %d)", chain, pos)
	}
	t.chains[table][chain] = slices.Insert(slices.Clone(rules), pos-1, strings.Join(spec, " "))
	return nil
}

// Exists reports whether the chain holds the rule.
func (t *Tables) Exists(table, chain string, spec ...string) (bool, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	rules, err := t.chainLocked(table, chain)
	if err != nil {
		return false, err
	}
	return slices.Contains(rules, strings.Join(spec, " ")), nil
}

// Delete removes the first instance of a rule (a change behind twill's
// back, in tests).
func (t *Tables) Delete(table, chain string, spec ...string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	rules, err := t.chainLocked(table, chain)
	if err != nil {
		return err
	}
	i := slices.Index(rules, strings.Join(spec, " "))
	if i < 0 {
		return fmt.Errorf("iptables: Bad rule (does a matching rule exist in that chain?)")
	}
	t.chains[table][chain] = slices.Delete(slices.Clone(rules), i, i+1)
	return nil
}
