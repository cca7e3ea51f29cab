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
	"strconv"
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

// Save lists a table as iptables-save -t prints it: "*table", each chain
// (":CHAIN ACCEPT [0:0]" built in, ":CHAIN - [0:0]" a user chain, the
// built-in ones first), each chain's rules ("-A CHAIN spec"), "COMMIT".
func (t *Tables) Save(table string) ([]string, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.initLocked()
	chains, ok := t.chains[table]
	if !ok {
		return nil, fmt.Errorf("iptables-save: Table `%s' does not exist", table)
	}
	names := slices.Clone(builtin[table])
	var user []string
	for c := range chains {
		if t.user[table+"/"+c] {
			user = append(user, c)
		}
	}
	slices.Sort(user)
	names = append(names, user...)
	out := []string{"*" + table}
	for _, c := range names {
		policy := "ACCEPT"
		if t.user[table+"/"+c] {
			policy = "-"
		}
		out = append(out, ":"+c+" "+policy+" [0:0]")
	}
	for _, c := range names {
		for _, r := range chains[c] {
			out = append(out, "-A "+c+" "+r)
		}
	}
	return append(out, "COMMIT"), nil
}

// Restore applies input as iptables-restore --noflush does: each table's
// section commits whole at its COMMIT, or, with an error, not at all; a
// declared user chain is created, or flushed. It reads "*table",
// ":CHAIN POLICY [0:0]", "-A CHAIN spec", "-I CHAIN [pos] spec" and
// "COMMIT"; double quotes group an argument.
func (t *Tables) Restore(input string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.initLocked()
	var table string
	var work map[string][]string
	var users []string
	for n, line := range strings.Split(input, "\n") {
		line = strings.TrimSpace(line)
		fail := func(format string, a ...any) error {
			return fmt.Errorf("iptables-restore: line %d failed (%s): %s", n+1, line, fmt.Sprintf(format, a...))
		}
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "*"):
			table = line[1:]
			chains, ok := t.chains[table]
			if !ok {
				return fail("no table %s", table)
			}
			work, users = map[string][]string{}, nil
			for c, rules := range chains {
				work[c] = slices.Clone(rules)
			}
		case work == nil:
			return fail("outside a table")
		case line == "COMMIT":
			t.chains[table] = work
			for _, c := range users {
				t.user[table+"/"+c] = true
			}
			work = nil
		case strings.HasPrefix(line, ":"):
			f := strings.Fields(line[1:])
			if len(f) < 2 {
				return fail("bad chain line")
			}
			if _, ok := work[f[0]]; ok && !slices.Contains(builtin[table], f[0]) {
				work[f[0]] = nil
			} else if !ok {
				if f[1] != "-" {
					return fail("no built-in chain %s", f[0])
				}
				work[f[0]], users = nil, append(users, f[0])
			}
		default:
			args, err := splitArgs(line)
			if err != nil {
				return fail("%v", err)
			}
			if len(args) < 2 || (args[0] != "-A" && args[0] != "-I") {
				return fail("not -A or -I")
			}
			rules, ok := work[args[1]]
			if !ok {
				return fail("no chain %s", args[1])
			}
			spec, pos := args[2:], len(rules)+1
			if args[0] == "-I" {
				pos = 1
				if len(spec) > 0 {
					if p, err := strconv.Atoi(spec[0]); err == nil {
						pos, spec = p, spec[1:]
					}
				}
			}
			if pos < 1 || pos > len(rules)+1 {
				return fail("index of insertion too big")
			}
			work[args[1]] = slices.Insert(rules, pos-1, strings.Join(spec, " "))
		}
	}
	if work != nil {
		return fmt.Errorf("iptables-restore: no COMMIT for table %s", table)
	}
	return nil
}

// splitArgs splits a restore line at spaces, double quotes grouping an
// argument (a backslash escapes the next character inside them).
func splitArgs(line string) ([]string, error) {
	var args []string
	var cur strings.Builder
	in, has := false, false
	for i := 0; i < len(line); i++ {
		ch := line[i]
		switch {
		case in && ch == '\\' && i+1 < len(line):
			i++
			cur.WriteByte(line[i])
		case ch == '"':
			in, has = !in, true
		case !in && (ch == ' ' || ch == '\t'):
			if has || cur.Len() > 0 {
				args = append(args, cur.String())
			}
			cur.Reset()
			has = false
		default:
			cur.WriteByte(ch)
		}
	}
	if in {
		return nil, fmt.Errorf("unterminated quote")
	}
	if has || cur.Len() > 0 {
		args = append(args, cur.String())
	}
	return args, nil
}
