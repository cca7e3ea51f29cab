package nft_test

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/twill-net/twill/nl/nft"
	"github.com/twill-net/twill/nl/nftsync"
	"github.com/twill-net/twill/nl/nlfake"
	"github.com/twill-net/twill/testsupport/netnstest"
)

var (
	tbl    = &nftables.Table{Family: nftables.TableFamilyINet, Name: "m"}
	accept = nftables.ChainPolicyAccept
	prio   = *nftables.ChainPriorityFilter + 10
	fwd    = &nftables.Chain{Table: tbl, Name: "forward", Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookForward, Priority: &prio, Policy: &accept}
	input  = &nftables.Chain{Table: tbl, Name: "forward", Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookInput, Priority: &prio, Policy: &accept}
	c1     = &nftables.Chain{Table: tbl, Name: "c1"}
	c2     = &nftables.Chain{Table: tbl, Name: "c2"}
	addrs  = &nftables.Set{Table: tbl, Name: "addrs", KeyType: nftables.TypeIPAddr}
	addrs6 = &nftables.Set{Table: tbl, Name: "addrs", KeyType: nftables.TypeIP6Addr}
	jumps  = &nftables.Set{Table: tbl, Name: "jumps", KeyType: nftables.TypeIPAddr, IsMap: true, DataType: nftables.TypeVerdict}
)

func elem(last byte, jump string) nft.Elem { return nft.Elem{Key: []byte{10, 0, 0, last}, Jump: jump} }

// rule is a rule of chain c: an optional lookup of set, a counter, then
// a verdict (jumping to target when set).
func rule(c *nftables.Chain, comment, set string, vmap bool, target string) *nftables.Rule {
	es := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
	}
	if set != "" {
		es = append(es, &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
			&expr.Lookup{SourceRegister: 1, SetName: set, IsDestRegSet: vmap})
	}
	es = append(es, &expr.Counter{})
	switch {
	case vmap:
	case target != "":
		es = append(es, &expr.Verdict{Kind: expr.VerdictJump, Chain: target})
	default:
		es = append(es, &expr.Verdict{Kind: expr.VerdictAccept})
	}
	return &nftables.Rule{Table: c.Table, Chain: c, Exprs: es, UserData: nftsync.Comment(comment)}
}

// full is a table with every kind of object and reference: a base chain
// looking up a verdict map that jumps to a chain, which looks up a set
// and jumps to another chain.
func full(b *nft.Batch) {
	b.AddTable(tbl)
	b.AddSet(addrs, []nft.Elem{elem(1, ""), elem(2, "")})
	b.AddChain(fwd)
	b.AddChain(c1)
	b.AddChain(c2)
	b.AddSet(jumps, []nft.Elem{elem(1, "c1")})
	b.AddRule(rule(c2, "c2 accepts", "", false, ""))
	b.AddRule(rule(c1, "c1 to c2", "addrs", false, "c2"))
	b.AddRule(rule(fwd, "by map", "jumps", true, ""))
}

// The model answers every batch as the kernel does, and holds what the
// kernel holds afterwards: the same error (by errno), the same tables,
// chains, rules, sets and elements. Each case starts from an empty
// namespace, applies setup (which both accept), then the batch.
func TestPrivilegedModelMatchesKernel(t *testing.T) {
	netnstest.RequireRoot(t)
	cases := []struct {
		name  string
		setup func(*nft.Batch)
		batch func(*nft.Batch)
		// read, when set, is the batch instead, for one that names what
		// it read of each kernel (a rule's handle)
		read func(*testing.T, nft.Kernel, *nft.Batch)
		want error // nil, or the errno both must answer
	}{
		{"a whole table", nil, full, nil, nil},
		{"a second identical batch", full, full, nil, nil},
		{"rules rendered as the batch is applied", nil, func(b *nft.Batch) {
			full(b)
			b.AddRules(c2, func() ([]*nftables.Rule, error) {
				return []*nftables.Rule{{Exprs: rule(c2, "", "", false, "").Exprs, UserData: nftsync.Comment("rendered 1")},
					{Exprs: rule(c2, "", "addrs", false, "").Exprs, UserData: nftsync.Comment("rendered 2")}}, nil
			})
		}, nil, nil},
		{"rules rendered into a missing chain", nil, func(b *nft.Batch) {
			b.AddTable(tbl)
			b.AddRules(c1, func() ([]*nftables.Rule, error) { return []*nftables.Rule{rule(c1, "x", "", false, "")}, nil })
		}, nil, unix.ENOENT},
		{"flush and delete chains that jump to each other", full, func(b *nft.Batch) {
			b.DelElems(jumps, []nft.Elem{elem(1, "")})
			b.FlushChain(c1)
			b.FlushChain(c2)
			b.DelChain(c1)
			b.DelChain(c2)
		}, nil, nil},
		{"delete the table", full, func(b *nft.Batch) { b.DelTable(tbl) }, nil, nil},
		{"delete a table that is not there", nil, func(b *nft.Batch) { b.DelTable(tbl) }, nil, unix.ENOENT},
		{"a rule into a missing chain, after a table", nil, func(b *nft.Batch) {
			b.AddTable(tbl)
			b.AddRule(rule(c1, "x", "", false, ""))
		}, nil, unix.ENOENT},
		{"a lookup of a missing set", nil, func(b *nft.Batch) {
			b.AddTable(tbl)
			b.AddChain(c1)
			b.AddRule(rule(c1, "x", "addrs", false, ""))
		}, nil, unix.ENOENT},
		{"a jump to a missing chain", nil, func(b *nft.Batch) {
			b.AddTable(tbl)
			b.AddChain(c1)
			b.AddRule(rule(c1, "x", "", false, "c2"))
		}, nil, unix.ENOENT},
		{"delete a chain a rule jumps to", full, func(b *nft.Batch) { b.DelChain(c2) }, nil, unix.EBUSY},
		{"delete a chain a map jumps to", full, func(b *nft.Batch) {
			b.FlushChain(c1)
			b.DelChain(c1)
		}, nil, unix.EBUSY},
		{"delete a chain with its rules", full, func(b *nft.Batch) {
			b.DelElems(jumps, []nft.Elem{elem(1, "")})
			b.DelChain(c1)
		}, nil, nil},
		{"delete a set a rule looks up", full, func(b *nft.Batch) { b.DelSet(addrs) }, nil, unix.EBUSY},
		{"delete a missing element", full, func(b *nft.Batch) { b.DelElems(addrs, []nft.Elem{elem(9, "")}) }, nil, unix.ENOENT},
		{"a map element to a missing chain", full, func(b *nft.Batch) { b.AddElems(jumps, []nft.Elem{elem(2, "c9")}) }, nil, unix.ENOENT},
		{"a map element added again, jumping elsewhere", full, func(b *nft.Batch) { b.AddElems(jumps, []nft.Elem{elem(1, "c2")}) }, nil, unix.EEXIST},
		{"an element's jump changed: deleted, then added", full, func(b *nft.Batch) {
			b.DelElems(jumps, []nft.Elem{elem(1, "")})
			b.AddElems(jumps, []nft.Elem{elem(1, "c2")})
		}, nil, nil},
		{"a map element that goes to a chain", full, func(b *nft.Batch) {
			b.AddElems(jumps, []nft.Elem{{Key: []byte{10, 0, 0, 2}, Jump: "c2", Goto: true}})
		}, nil, nil},
		{"a map element added again, going where it jumped", full, func(b *nft.Batch) {
			b.AddElems(jumps, []nft.Elem{{Key: []byte{10, 0, 0, 1}, Jump: "c1", Goto: true}})
		}, nil, unix.EEXIST},
		{"delete a chain a map goes to", func(b *nft.Batch) {
			full(b)
			b.AddElems(jumps, []nft.Elem{{Key: []byte{10, 0, 0, 2}, Jump: "c2", Goto: true}})
		}, func(b *nft.Batch) {
			b.FlushChain(c1)
			b.DelChain(c2)
		}, nil, unix.EBUSY},
		{"an element added again", full, func(b *nft.Batch) { b.AddElems(addrs, []nft.Elem{elem(1, "")}) }, nil, nil},
		{"a set made again, of another type", full, func(b *nft.Batch) { b.AddSet(addrs6, nil) }, nil, unix.EEXIST},
		{"a base chain hooked elsewhere", full, func(b *nft.Batch) { b.AddChain(input) }, nil, unix.EOPNOTSUPP},
		{"a refused batch leaves nothing: table, then a bad rule", nil, func(b *nft.Batch) {
			full(b)
			b.AddRule(rule(c1, "bad", "nosuchset", false, ""))
		}, nil, unix.ENOENT},
		{"delete a rule by its handle", func(b *nft.Batch) {
			full(b)
			b.AddRule(rule(c2, "c2 again", "", false, ""))
		}, nil, func(t *testing.T, k nft.Kernel, b *nft.Batch) {
			b.DelRule(&nftables.Rule{Table: tbl, Chain: c2, Handle: handleOf(t, k, "c2", 0)})
		}, nil},
		{"delete a rule that jumped: its chain may go", full, nil, func(t *testing.T, k nft.Kernel, b *nft.Batch) {
			b.DelRule(&nftables.Rule{Table: tbl, Chain: c1, Handle: handleOf(t, k, "c1", 0)})
			b.DelChain(c2)
		}, nil},
		{"delete a rule that is not there", full, nil, func(t *testing.T, k nft.Kernel, b *nft.Batch) {
			b.DelRule(&nftables.Rule{Table: tbl, Chain: c2, Handle: handleOf(t, k, "c2", 0) + 1000})
		}, unix.ENOENT},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			kernels := []nft.Kernel{kernelIn(t, "nftm"), &nlfake.Nftables{}}
			var errs [2]error
			var states [2]string
			for i, k := range kernels {
				if tc.setup != nil {
					var b nft.Batch
					tc.setup(&b)
					if err := k.Apply(&b); err != nil {
						t.Fatalf("setup, %T: %v", k, err)
					}
				}
				var b nft.Batch
				if tc.read != nil {
					tc.read(t, k, &b)
				} else {
					tc.batch(&b)
				}
				errs[i] = k.Apply(&b)
				states[i] = describe(t, k)
			}
			for i, k := range kernels {
				older := olderKernels[tc.name]
				if _, real := k.(nft.Conn); real && slices.ContainsFunc(older, func(e error) bool { return sameErrno(errs[i], e) }) {
					continue
				}
				if !sameErrno(errs[i], tc.want) {
					t.Errorf("%T: %v, want %v", k, errs[i], tc.want)
				}
			}
			if states[0] != states[1] {
				t.Errorf("the kernel holds\n%s\nthe model holds\n%s", states[0], states[1])
			}
		})
	}
}

// kernelIn is the kernel's nftables in a new namespace, removed at the
// test's end.
func kernelIn(t *testing.T, prefix string) nft.Conn {
	t.Helper()
	name := netnstest.New(t, prefix)
	f, err := os.Open("/var/run/netns/" + name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return nft.Conn{NetNS: int(f.Fd())}
}

// olderKernels is what the kernels before 6.12 answer where they differ
// from the newer ones, which the model follows (make test-kernels boots
// 5.10 and 6.1). twill relies on neither answer: nftsync rewrites the
// whole table when a set's type or a base chain's hook differs from the
// kernel's.
var olderKernels = map[string][]error{
	"a set made again, of another type": {nil},         // 5.10 accepts it, and keeps the set as it was
	"a base chain hooked elsewhere":     {unix.EEXIST}, // 5.10 and 6.1
}

// handleOf is the handle of the i-th rule of chain, in table tbl of k.
func handleOf(t *testing.T, k nft.Kernel, chain string, i int) uint64 {
	t.Helper()
	got, err := k.Table(tbl.Family, tbl.Name)
	if err != nil || got == nil {
		t.Fatalf("reading table %s: %v, %v", tbl.Name, got, err)
	}
	for _, c := range got.Chains {
		if c.Chain.Name == chain && i < len(c.Rules) {
			return c.Rules[i].Handle
		}
	}
	t.Fatalf("no rule %d in chain %s", i, chain)
	return 0
}

func sameErrno(err, want error) bool {
	if want == nil {
		return err == nil
	}
	return errors.Is(err, want)
}

// describe is every table of k, as text: chains with their hooks and
// rules (comment and fingerprint), sets with their kinds and elements.
func describe(t *testing.T, k nft.Kernel) string {
	t.Helper()
	tables, err := k.Tables()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, tb := range tables {
		got, err := k.Table(tb.Family, tb.Name)
		if err != nil || got == nil {
			t.Fatalf("reading table %s: %v, %v", tb.Name, got, err)
		}
		out = append(out, "table "+nft.FamilyName(tb.Family)+" "+tb.Name)
		for _, c := range got.Chains {
			hook := "regular"
			if c.Chain.Hooknum != nil {
				hook = fmt.Sprintf("%s hook %d priority %d", c.Chain.Type, *c.Chain.Hooknum, *c.Chain.Priority)
			}
			out = append(out, "  chain "+c.Chain.Name+" "+hook)
			for _, r := range c.Rules {
				fp, err := nftsync.Fingerprint(r.Exprs)
				if err != nil {
					t.Fatal(err)
				}
				out = append(out, fmt.Sprintf("    rule %q %x", r.UserData, fp))
			}
		}
		for _, s := range got.Sets {
			kind := "set " + s.Set.KeyType.Name
			if s.Set.IsMap {
				kind = "map"
			}
			var elems []string
			for _, e := range s.Elems {
				elems = append(elems, fmt.Sprintf("%x:%s", e.Key, e.Target()))
			}
			slices.Sort(elems)
			out = append(out, "  "+kind+" "+s.Set.Name+" {"+strings.Join(elems, " ")+"}")
		}
	}
	return strings.Join(out, "\n")
}

// Rules reads what Table reads of one chain, and nothing of a chain or a
// table that is not there, as the model does.
func TestPrivilegedModelRulesMatchesKernel(t *testing.T) {
	netnstest.RequireRoot(t)
	for _, k := range []nft.Kernel{kernelIn(t, "nftr"), &nlfake.Nftables{}} {
		if rules, err := k.Rules(tbl, "c1"); err != nil || len(rules) > 0 {
			t.Errorf("%T, no table: %v, %v; want no rules", k, rules, err)
		}
		var b nft.Batch
		full(&b)
		if err := k.Apply(&b); err != nil {
			t.Fatalf("%T: %v", k, err)
		}
		if rules, err := k.Rules(tbl, "c9"); err != nil || len(rules) > 0 {
			t.Errorf("%T, no chain: %v, %v; want no rules", k, rules, err)
		}
		rules, err := k.Rules(tbl, "c1")
		if err != nil || len(rules) != 1 || rules[0].Handle != handleOf(t, k, "c1", 0) || string(rules[0].UserData) != string(nftsync.Comment("c1 to c2")) {
			t.Errorf("%T: rules of c1: %v, %v; want the one rule Table reads", k, rules, err)
		}
	}
}

// TestPrivilegedLargeSets: a set or verdict map whose elements take more
// than one netlink attribute can hold (64 KiB) is written whole, made
// with its elements or given them later, and its elements deleted whole.
// The kernel took the first 64 KiB alone, without an error, when they
// went in one message.
func TestPrivilegedLargeSets(t *testing.T) {
	k := kernelIn(t, "nftl")
	const n = 5000
	var addrElems, jumpElems []nft.Elem
	for i := range n {
		key := []byte{10, 1, byte(i >> 8), byte(i)}
		addrElems = append(addrElems, nft.Elem{Key: key})
		jumpElems = append(jumpElems, nft.Elem{Key: key, Jump: "a-chain-with-a-name-as-long-as-a-pods-key"})
	}
	long := &nftables.Chain{Table: tbl, Name: "a-chain-with-a-name-as-long-as-a-pods-key"}
	count := func(what string) map[string]int {
		t.Helper()
		got, err := k.Table(tbl.Family, tbl.Name)
		if err != nil {
			t.Fatalf("%s: reading: %v", what, err)
		}
		out := map[string]int{}
		for _, s := range got.Sets {
			out[s.Set.Name] = len(s.Elems)
		}
		return out
	}
	apply := func(what string, ops func(b *nft.Batch)) {
		t.Helper()
		var b nft.Batch
		ops(&b)
		if err := k.Apply(&b); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	apply("made with their elements", func(b *nft.Batch) {
		b.AddTable(tbl)
		b.AddChain(long)
		b.AddSet(addrs, addrElems)
		b.AddSet(jumps, jumpElems)
	})
	if got := count("made with their elements"); got["addrs"] != n || got["jumps"] != n {
		t.Errorf("made with %d elements each: the kernel holds %v", n, got)
	}
	apply("deleted", func(b *nft.Batch) {
		b.DelElems(addrs, addrElems)
		b.DelElems(jumps, jumpElems)
	})
	if got := count("deleted"); got["addrs"] != 0 || got["jumps"] != 0 {
		t.Errorf("all %d deleted: the kernel holds %v", n, got)
	}
	apply("added", func(b *nft.Batch) {
		b.AddElems(addrs, addrElems)
		b.AddElems(jumps, jumpElems)
	})
	if got := count("added"); got["addrs"] != n || got["jumps"] != n {
		t.Errorf("%d added to each: the kernel holds %v", n, got)
	}
}

// A refused transaction's error names the operation the kernel refused,
// in the order the batch queued it, and wraps the kernel's errno.
func TestPrivilegedRefusalNamesTheOperation(t *testing.T) {
	k := kernelIn(t, "nfte")
	var b nft.Batch
	full(&b)
	b.AddRule(rule(c1, "bad", "nosuchset", false, ""))
	b.AddRule(rule(c2, "after it", "", false, ""))
	err := k.Apply(&b)
	if !errors.Is(err, unix.ENOENT) || !strings.Contains(err.Error(), "operation 9 (adding a rule to chain c1 of table inet m)") {
		t.Fatalf("a lookup of a missing set, 10th of 11 operations: %v", err)
	}
	if got, err := k.Table(tbl.Family, tbl.Name); err != nil || got != nil {
		t.Errorf("after the refusal the kernel holds %+v (%v), want no table", got, err)
	}
}

// A transaction of tens of thousands of rules, as a node's policy table
// is at 10,000 pods, commits whole: every rule is read back, in order.
func TestPrivilegedLargeTransaction(t *testing.T) {
	k := kernelIn(t, "nftb")
	const chains, rules = 200, 100
	var b nft.Batch
	b.AddTable(tbl)
	b.AddSet(addrs, []nft.Elem{elem(1, "")})
	for i := range chains {
		c := &nftables.Chain{Table: tbl, Name: fmt.Sprintf("c%d", i)}
		b.AddChain(c)
		for j := range rules {
			b.AddRule(rule(c, fmt.Sprintf("rule %d", j), "addrs", false, ""))
		}
	}
	if err := k.Apply(&b); err != nil {
		t.Fatal(err)
	}
	got, err := k.Table(tbl.Family, tbl.Name)
	if err != nil || got == nil {
		t.Fatalf("reading it back: %+v, %v", got, err)
	}
	n := 0
	for _, c := range got.Chains {
		for j, r := range c.Rules {
			if want := fmt.Sprintf("rule %d", j); !slices.Equal(r.UserData, nftsync.Comment(want)) {
				t.Fatalf("chain %s, rule %d: %q, want %q", c.Chain.Name, j, r.UserData, want)
			}
			n++
		}
	}
	if len(got.Chains) != chains || n != chains*rules {
		t.Errorf("the kernel holds %d chains, %d rules; want %d, %d", len(got.Chains), n, chains, chains*rules)
	}
}
