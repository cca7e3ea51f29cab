package nlfake

import (
	"fmt"
	"maps"
	"slices"
	"sync"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"

	"github.com/twill-net/twill/nl/nft"
)

var _ nft.Kernel = (*Nftables)(nil)

// Nftables models one network namespace's nftables: its tables, their
// chains and rules, sets and elements, and the references between them.
// A batch applies as a transaction does: all of it, or, when one
// operation is refused as the kernel would refuse it, none of it, with
// the kernel's errno. The zero value is empty and ready; it is safe for
// concurrent use.
type Nftables struct {
	mu     sync.Mutex
	tables []*fakeTable // guarded by mu
	gen    uint32       // guarded by mu
	handle uint64       // guarded by mu: the last rule handle given
}

type fakeTable struct {
	table  nftables.Table
	chains []*fakeChain
	sets   []*fakeSet
}

type fakeChain struct {
	chain nftables.Chain
	rules []*nftables.Rule
}

type fakeSet struct {
	set   nftables.Set
	elems map[string]nft.Elem // key → the element (its Jump "" in a set)
}

func (t *fakeTable) clone() *fakeTable {
	c := &fakeTable{table: t.table}
	for _, ch := range t.chains {
		c.chains = append(c.chains, &fakeChain{chain: ch.chain, rules: slices.Clone(ch.rules)})
	}
	for _, s := range t.sets {
		c.sets = append(c.sets, &fakeSet{set: s.set, elems: maps.Clone(s.elems)})
	}
	return c
}

func (f *Nftables) find(family nftables.TableFamily, name string) int {
	return slices.IndexFunc(f.tables, func(t *fakeTable) bool { return t.table.Family == family && t.table.Name == name })
}

// Tables lists every table.
func (f *Nftables) Tables() ([]*nftables.Table, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]*nftables.Table, len(f.tables))
	for i, t := range f.tables {
		tt := t.table
		out[i] = &tt
	}
	return out, nil
}

// Chains lists every chain of every table.
func (f *Nftables) Chains() ([]*nftables.Chain, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*nftables.Chain
	for _, t := range f.tables {
		tt := t.table
		for _, c := range t.chains {
			cc := c.chain
			cc.Table = &tt
			out = append(out, &cc)
		}
	}
	return out, nil
}

// Table reads one table whole, nil when there is none.
func (f *Nftables) Table(family nftables.TableFamily, name string) (*nft.Table, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	i := f.find(family, name)
	if i < 0 {
		return nil, nil
	}
	t := f.tables[i]
	tt := t.table
	out := &nft.Table{Table: &tt}
	for _, c := range t.chains {
		cc := c.chain
		cc.Table = &tt
		ch := nft.Chain{Chain: &cc}
		for _, r := range c.rules {
			rr := *r
			rr.Table, rr.Chain = &tt, &cc
			rr.Exprs = slices.Clone(r.Exprs)
			ch.Rules = append(ch.Rules, &rr)
		}
		out.Chains = append(out.Chains, ch)
	}
	for _, s := range t.sets {
		ss := s.set
		ss.Table = &tt
		st := nft.Set{Set: &ss}
		for _, k := range slices.Sorted(maps.Keys(s.elems)) {
			el := s.elems[k]
			el.Key = []byte(k)
			st.Elems = append(st.Elems, el)
		}
		out.Sets = append(out.Sets, st)
	}
	return out, nil
}

// Rules reads one chain's rules.
func (f *Nftables) Rules(t *nftables.Table, chain string) ([]*nftables.Rule, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	i := f.find(t.Family, t.Name)
	if i < 0 {
		return nil, nil
	}
	ft := f.tables[i]
	j := ft.chain(chain)
	if j < 0 {
		return nil, nil
	}
	tt, cc := ft.table, ft.chains[j].chain
	cc.Table = &tt
	var out []*nftables.Rule
	for _, r := range ft.chains[j].rules {
		rr := *r
		rr.Table, rr.Chain = &tt, &cc
		rr.Exprs = slices.Clone(r.Exprs)
		out = append(out, &rr)
	}
	return out, nil
}

// Generation is the number of transactions committed.
func (f *Nftables) Generation() (uint32, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.gen, nil
}

// Count sets the packet counter of every rule whose comment is cmt, in
// every table, to packets: traffic, as far as a counter can tell.
func (f *Nftables) Count(cmt string, packets uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, t := range f.tables {
		for _, c := range t.chains {
			for i, r := range c.rules {
				if got, _ := userdata.GetString(r.UserData, userdata.TypeComment); got != cmt {
					continue
				}
				rr := *r
				rr.Exprs = slices.Clone(r.Exprs)
				for j, e := range rr.Exprs {
					if _, ok := e.(*expr.Counter); ok {
						rr.Exprs[j] = &expr.Counter{Packets: packets}
					}
				}
				c.rules[i] = &rr
			}
		}
	}
}

// Apply commits the batch in one transaction, or refuses it whole.
func (f *Nftables) Apply(b *nft.Batch) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	tx := &fakeTx{tables: slices.Clone(f.tables), handle: f.handle, cloned: map[*fakeTable]bool{}}
	for i, op := range b.Ops {
		if err := tx.apply(op); err != nil {
			return fmt.Errorf("nftables transaction, operation %d of %d: %w", i+1, len(b.Ops), err)
		}
	}
	if err := tx.check(); err != nil {
		return fmt.Errorf("nftables transaction: %w", err)
	}
	f.tables, f.handle = tx.tables, tx.handle
	if len(b.Ops) > 0 {
		f.gen++
	}
	return nil
}

// fakeTx is a transaction under way: tables it changes are copied first.
type fakeTx struct {
	tables []*fakeTable
	handle uint64
	cloned map[*fakeTable]bool // copies this transaction made
}

func (tx *fakeTx) table(t *nftables.Table) (*fakeTable, int) {
	if t == nil {
		return nil, -1
	}
	i := slices.IndexFunc(tx.tables, func(ft *fakeTable) bool { return ft.table.Family == t.Family && ft.table.Name == t.Name })
	if i < 0 {
		return nil, -1
	}
	ft := tx.tables[i]
	if !tx.cloned[ft] {
		ft = ft.clone()
		tx.cloned[ft] = true
		tx.tables[i] = ft
	}
	return ft, i
}

func errno(what string, e unix.Errno) error { return fmt.Errorf("%s: %w", what, e) }

func (tx *fakeTx) apply(op nft.Op) error {
	if op.Kind == nft.AddTable {
		if t, _ := tx.table(op.Table); t == nil {
			nt := &fakeTable{table: nftables.Table{Family: op.Table.Family, Name: op.Table.Name}}
			tx.cloned[nt] = true
			tx.tables = append(tx.tables, nt)
		}
		return nil
	}
	t, i := tx.table(op.Table)
	if t == nil {
		return errno(fmt.Sprintf("no table %v", op.Table), unix.ENOENT)
	}
	switch op.Kind {
	case nft.DelTable:
		tx.tables = slices.Delete(tx.tables, i, i+1)
		return nil
	case nft.AddChain, nft.FlushChain, nft.DelChain:
		return t.chainOp(op)
	case nft.AddRule:
		return tx.addRule(t, op.Rule)
	case nft.AddRules:
		rules, err := op.Rules()
		for _, r := range rules {
			if err == nil {
				rr := *r
				rr.Table, rr.Chain = op.Table, op.Chain
				err = tx.addRule(t, &rr)
			}
		}
		return err
	case nft.DelRule:
		return t.delRule(op.Rule)
	default:
		return t.setOp(op)
	}
}
