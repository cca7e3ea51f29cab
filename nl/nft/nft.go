// Package nft is the kernel seam for nftables: what twill reads of the
// kernel's tables and the transactions it writes, in one narrow interface.
// Conn is the kernel's, through netlink; nlfake.Nftables models the same
// state without root. package nftsync, the table engine that twill's
// netfilter rules and its NetworkPolicy enforcer share, is written against
// it.
package nft

import (
	"fmt"

	"github.com/google/nftables"
)

// Kernel is the kernel's nftables in one network namespace. Its errors
// wrap the kernel's errno (unix.ENOENT for an object that is not there,
// EBUSY for one still in use, EEXIST), which callers test with errors.Is.
type Kernel interface {
	// Tables lists every table of every family.
	Tables() ([]*nftables.Table, error)
	// Chains lists every chain of every table.
	Chains() ([]*nftables.Chain, error)
	// Table reads one table whole: its chains and their rules, its sets
	// and their elements. It returns nil when there is no such table.
	// Reading sends no change notifications.
	Table(family nftables.TableFamily, name string) (*Table, error)
	// Rules reads one chain's rules, in order: one request, for a caller
	// that needs no more. A missing table or chain has none (the
	// kernel's dump says no more).
	Rules(t *nftables.Table, chain string) ([]*nftables.Rule, error)
	// Apply commits the batch in one transaction: the kernel applies all
	// of it or, with an error, none of it.
	Apply(b *Batch) error
	// Generation is nftables' generation: the kernel moves it with every
	// transaction it commits, of any table and any writer.
	Generation() (uint32, error)
}

// Table is one table as the kernel holds it.
type Table struct {
	Table  *nftables.Table
	Chains []Chain // in the kernel's order
	Sets   []Set
}

// Chain is a chain and its rules, in order.
type Chain struct {
	Chain *nftables.Chain
	Rules []*nftables.Rule
}

// Set is a set, or a verdict map, and its elements.
type Set struct {
	Set   *nftables.Set
	Elems []Elem
}

// Elem is a set's element: its key and, in a verdict map, the chain it
// jumps to (or, with Goto, goes to: the chain's return is the caller's).
type Elem struct {
	Key  []byte
	Jump string
	Goto bool
}

// Target is a verdict map element's verdict as one string: its chain for
// a jump, "goto " and its chain for a goto ("" in a set). Chains whose
// names open with "goto " are not told apart from a goto.
func (e Elem) Target() string {
	if e.Goto {
		return "goto " + e.Jump
	}
	return e.Jump
}

// Batch is a transaction under construction: operations queued in order,
// committed by Kernel.Apply. Its methods take the library's objects, which
// the batch keeps (the caller must not change them after queueing).
type Batch struct {
	Ops []Op
}

// OpKind is what an Op does.
type OpKind int

// The operations a batch holds.
const (
	AddTable OpKind = iota + 1 // created if missing
	DelTable
	AddChain // created if missing
	FlushChain
	DelChain
	AddRule  // appended to its chain
	AddRules // rendered as the batch is applied, appended to their chain
	DelRule  // by its handle
	AddSet   // created if missing, with Elems
	DelSet
	AddElems
	DelElems
)

// Op is one queued operation: Table for a table's, Chain for a chain's,
// Rule, Rules, Set and Elems for theirs.
type Op struct {
	Kind  OpKind
	Table *nftables.Table
	Chain *nftables.Chain
	Rule  *nftables.Rule
	Rules func() ([]*nftables.Rule, error)
	Set   *nftables.Set
	Elems []Elem
}

func (b *Batch) add(op Op) { b.Ops = append(b.Ops, op) }

// AddTable queues t's creation, if it is missing.
func (b *Batch) AddTable(t *nftables.Table) { b.add(Op{Kind: AddTable, Table: t}) }

// DelTable queues t's deletion, with all it holds.
func (b *Batch) DelTable(t *nftables.Table) { b.add(Op{Kind: DelTable, Table: t}) }

// AddChain queues c's creation, if it is missing.
func (b *Batch) AddChain(c *nftables.Chain) { b.add(Op{Kind: AddChain, Table: c.Table, Chain: c}) }

// FlushChain queues the deletion of c's rules.
func (b *Batch) FlushChain(c *nftables.Chain) { b.add(Op{Kind: FlushChain, Table: c.Table, Chain: c}) }

// DelChain queues c's deletion, with its rules.
func (b *Batch) DelChain(c *nftables.Chain) { b.add(Op{Kind: DelChain, Table: c.Table, Chain: c}) }

// AddRule queues r, appended to its chain (r.Chain).
func (b *Batch) AddRule(r *nftables.Rule) {
	b.add(Op{Kind: AddRule, Table: r.Table, Chain: r.Chain, Rule: r})
}

// AddRules queues the rules render returns, appended to chain c in
// order. Applying the batch calls render, once, and writes what it
// returns before it renders the next chain's: a batch of a whole table
// never holds every rule's expressions at once.
func (b *Batch) AddRules(c *nftables.Chain, render func() ([]*nftables.Rule, error)) {
	b.add(Op{Kind: AddRules, Table: c.Table, Chain: c, Rules: render})
}

// DelRule queues the deletion of r, found by its handle in its chain
// (r.Chain), as read from the kernel.
func (b *Batch) DelRule(r *nftables.Rule) {
	b.add(Op{Kind: DelRule, Table: r.Table, Chain: r.Chain, Rule: r})
}

// AddSet queues s's creation with elems, if it is missing.
func (b *Batch) AddSet(s *nftables.Set, elems []Elem) {
	b.add(Op{Kind: AddSet, Table: s.Table, Set: s, Elems: elems})
}

// DelSet queues s's deletion.
func (b *Batch) DelSet(s *nftables.Set) { b.add(Op{Kind: DelSet, Table: s.Table, Set: s}) }

// AddElems queues elems' addition to s.
func (b *Batch) AddElems(s *nftables.Set, elems []Elem) {
	b.add(Op{Kind: AddElems, Table: s.Table, Set: s, Elems: elems})
}

// DelElems queues the deletion of the elements of s with elems' keys.
func (b *Batch) DelElems(s *nftables.Set, elems []Elem) {
	b.add(Op{Kind: DelElems, Table: s.Table, Set: s, Elems: elems})
}

// Len is the number of operations queued.
func (b *Batch) Len() int { return len(b.Ops) }

// FamilyName is a table family as nft names it.
func FamilyName(f nftables.TableFamily) string {
	switch f {
	case nftables.TableFamilyINet:
		return "inet"
	case nftables.TableFamilyIPv4:
		return "ip"
	case nftables.TableFamilyIPv6:
		return "ip6"
	case nftables.TableFamilyARP:
		return "arp"
	case nftables.TableFamilyBridge:
		return "bridge"
	case nftables.TableFamilyNetdev:
		return "netdev"
	}
	return fmt.Sprint(f)
}
