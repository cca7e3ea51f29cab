// Package nftsync keeps one nftables table equal to a desired one: it
// reads the table (or recalls it as it last wrote it), diffs it against
// the desired chains, rules and sets, and writes what differs in one
// transaction, so that a reader sees the old table or the new one. twill's
// netfilter rules (network/nftables) and its NetworkPolicy enforcer
// (policy) are both written with it, through the kernel seam nft.Kernel:
// the real kernel, or nlfake.Nftables in unit tests.
package nftsync

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"sync"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"

	"github.com/twill-net/twill/nl/nft"
)

// Rule is a rule as wanted: its comment names it (nft list shows it),
// its expressions are what it does.
type Rule struct {
	Comment string
	Exprs   []expr.Any
}

// Chain is a chain as wanted.
type Chain struct {
	Name string
	// Hook, when set, makes it a base chain: its Type, Hooknum, Priority
	// and Policy (the engine sets its table and name).
	Hook *nftables.Chain
	// Rules renders the chain's rules. The engine calls it only when it
	// must compare or write them, and may call it twice in one Sync (to
	// fingerprint them, then to write them): it must return the same
	// rules each time.
	Rules func() ([]Rule, error)
	// Src is what Rules renders from. With Engine.Same, a chain whose Src
	// is the same as when the engine last wrote it is neither rendered
	// nor compared.
	Src any
}

// Static is rules as a Chain's Rules.
func Static(rules []Rule) func() ([]Rule, error) {
	return func() ([]Rule, error) { return rules, nil }
}

// Set is a set of addresses, or a verdict map, as wanted.
type Set struct {
	Name    string
	KeyType nftables.SetDatatype
	Map     bool // a verdict map: each element jumps (or goes) to its Jump
	Elems   []nft.Elem
	// Src is what Elems were made from. With Engine.SameSet, a set whose
	// Src is the same as when the engine last wrote it is not compared.
	Src any
}

// Table is a table's content as wanted.
type Table struct {
	Chains []Chain // written in this order, base chains among them
	Sets   []Set
}

// Changes counts what one Sync wrote; zero when the kernel was equal.
type Changes struct {
	Full                     bool // the table was (re)created
	Chains, Elems, Sets, Del int
}

// Clean says nothing was written.
func (c Changes) Clean() bool { return c == Changes{} }

// Engine keeps one table equal to the desired one. Its methods are safe
// for concurrent use.
type Engine struct {
	Kernel nft.Kernel
	Family nftables.TableFamily
	Name   string
	// Same, when set, says whether two chains' Src render the same rules;
	// SameSet whether two sets' Src make the same elements.
	Same, SameSet func(a, b any) bool

	mu   sync.Mutex
	last *State // guarded by mu: the table as last written; nil to read it
}

func (e *Engine) table() *nftables.Table { return &nftables.Table{Family: e.Family, Name: e.Name} }

// What names the table as nft does ("table inet twill").
func (e *Engine) What() string { return "table " + nft.FamilyName(e.Family) + " " + e.Name }

// Sync makes the kernel's table equal to want, writing only what differs,
// in one transaction. It diffs against the table as it last wrote it,
// unless reread (a drift check) or its last write failed: then it reads
// the kernel's. When the kernel refuses a change, it writes the whole
// table once more, in one transaction.
func (e *Engine) Sync(want Table, reread bool) (Changes, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	have := e.last
	if reread || have == nil {
		e.last = nil
		k, err := e.read()
		if err != nil {
			return Changes{}, err
		}
		have = k
	}
	w := e.writer(want)
	full := !have.Exists || e.hooksDiffer(have, want) || setTypesDiffer(have, want)
	var err error
	if full {
		err = w.all()
	} else {
		err = w.diff(have)
	}
	if err != nil {
		return Changes{}, err
	}
	if w.batch.Len() > 0 {
		if err := e.Kernel.Apply(w.batch); err != nil {
			if full {
				return Changes{}, fmt.Errorf("writing %s: %w", e.What(), err)
			}
			if w, err = e.rewrite(want, err); err != nil {
				return Changes{}, err
			}
		}
	}
	e.last = w.model
	return w.ch, nil
}

// rewrite writes the whole table after the kernel refused a diff (why).
func (e *Engine) rewrite(want Table, why error) (*writer, error) {
	w := e.writer(want)
	err := w.all()
	if err == nil {
		err = e.Kernel.Apply(w.batch)
	}
	if err != nil {
		return nil, fmt.Errorf("writing %s: %w (the change alone was refused too: %v)", e.What(), err, why)
	}
	return w, nil
}

// Delete removes the table if it exists, and says whether it did.
func (e *Engine) Delete() (bool, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.last = nil
	t, err := e.Kernel.Table(e.Family, e.Name)
	if err != nil || t == nil {
		return false, err
	}
	var b nft.Batch
	b.DelTable(e.table())
	if err := e.Kernel.Apply(&b); err != nil {
		return false, fmt.Errorf("deleting %s: %w", e.What(), err)
	}
	return true, nil
}

// Comment is a rule's user data as nft writes a comment.
func Comment(s string) []byte {
	if s == "" {
		return nil
	}
	return userdata.AppendString(nil, userdata.TypeComment, s)
}

// Fingerprint is a digest of a rule's expressions in netlink form, its
// counters zeroed: equal fingerprints are equal rules. A node's table
// holds tens of thousands of rules; their model keeps 16 bytes each,
// not the rules' few hundred.
func Fingerprint(es []expr.Any) ([]byte, error) {
	b, err := nft.AppendExprs(make([]byte, 0, 512), byte(nftables.TableFamilyINet), es)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(b)
	return append(make([]byte, 0, 16), sum[:16]...), nil
}

// KernelRulesAre reports whether have holds want's rules, in order: the same
// expressions (counters aside) and comments.
func KernelRulesAre(have, want []*nftables.Rule) (bool, error) {
	if len(have) != len(want) {
		return false, nil
	}
	for i, w := range want {
		a, err := Fingerprint(have[i].Exprs)
		if err != nil {
			return false, err
		}
		b, err := Fingerprint(w.Exprs)
		if err != nil {
			return false, err
		}
		if !bytes.Equal(a, b) || RuleComment(have[i]) != RuleComment(w) {
			return false, nil
		}
	}
	return true, nil
}

// RuleComment is the comment a rule carries ("" without one).
func RuleComment(r *nftables.Rule) string {
	s, _ := userdata.GetString(r.UserData, userdata.TypeComment)
	return s
}
