package nftables

import (
	"io"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/twill-net/twill/network"
	knft "github.com/twill-net/twill/nl/nft"
	"github.com/twill-net/twill/nl/nlfake"
)

// fakeTable is a Table writing the IPv4 rules into a modelled kernel.
func fakeTable(k *nlfake.Nftables, repaired *int) *Table {
	return &Table{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), IPMasq: true, Kernel: k,
		Networks: []network.NetworkPair{{Cluster: netip.MustParsePrefix("10.244.0.0/16"), Local: netip.MustParsePrefix("10.244.3.0/24")}},
		Repaired: func() { *repaired++ }}
}

// rewriteChain replaces a chain's rules, as another writer would.
func rewriteChain(t *testing.T, k *nlfake.Nftables, chain string, edit func([]*nftables.Rule) []*nftables.Rule) {
	t.Helper()
	tb, err := k.Table(nftables.TableFamilyINet, TableName)
	if err != nil || tb == nil {
		t.Fatalf("reading the table: %v (%v)", tb, err)
	}
	i := slices.IndexFunc(tb.Chains, func(c knft.Chain) bool { return c.Chain.Name == chain })
	if i < 0 {
		t.Fatalf("no chain %s", chain)
	}
	c := tb.Chains[i].Chain
	var b knft.Batch
	b.FlushChain(c)
	for _, r := range edit(tb.Chains[i].Rules) {
		r.Chain, r.Table = c, c.Table
		b.AddRule(r)
	}
	if err := k.Apply(&b); err != nil {
		t.Fatal(err)
	}
}

func apply(t *testing.T, k *nlfake.Nftables, queue func(b *knft.Batch)) {
	t.Helper()
	var b knft.Batch
	queue(&b)
	if err := k.Apply(&b); err != nil {
		t.Fatal(err)
	}
}

// Each way of breaking twill's table, in a modelled kernel: Drift names
// it, Sync repairs it and says so once, and an unchanged table is not
// written again.
func TestTableDriftRepaired(t *testing.T) {
	tw := &nftables.Table{Family: nftables.TableFamilyINet, Name: TableName}
	drop := nftables.ChainPolicyDrop
	for _, tc := range []struct {
		name    string
		breakIt func(t *testing.T, k *nlfake.Nftables)
		drift   string
	}{
		{"table deleted", func(t *testing.T, k *nlfake.Nftables) { apply(t, k, func(b *knft.Batch) { b.DelTable(tw) }) }, "missing table inet twill"},
		{"chain deleted", func(t *testing.T, k *nlfake.Nftables) {
			apply(t, k, func(b *knft.Batch) { b.DelChain(&nftables.Chain{Table: tw, Name: ChainForward}) })
		}, "missing chain inet twill forward"},
		{"extra chain", func(t *testing.T, k *nlfake.Nftables) {
			apply(t, k, func(b *knft.Batch) { b.AddChain(&nftables.Chain{Table: tw, Name: "mine"}) })
		}, "extra chain inet twill mine"},
		{"rule gone", func(t *testing.T, k *nlfake.Nftables) {
			rewriteChain(t, k, ChainPostrouting, func(rs []*nftables.Rule) []*nftables.Rule { return rs[1:] })
		}, "missing rule in postrouting: twill: pod to pod (ipv4)"},
		{"rule altered", func(t *testing.T, k *nlfake.Nftables) {
			rewriteChain(t, k, ChainForward, func(rs []*nftables.Rule) []*nftables.Rule {
				rs[0].Exprs = append(slices.Clone(rs[0].Exprs[:len(rs[0].Exprs)-1]), &expr.Verdict{Kind: expr.VerdictDrop})
				return rs
			})
		}, "wrong rule in forward (handle"},
		{"rule repeated", func(t *testing.T, k *nlfake.Nftables) {
			rewriteChain(t, k, ChainForward, func(rs []*nftables.Rule) []*nftables.Rule { return append(rs, rs[0]) })
		}, "extra rule in forward (handle"},
		{"foreign rule", func(t *testing.T, k *nlfake.Nftables) {
			rewriteChain(t, k, ChainForward, func(rs []*nftables.Rule) []*nftables.Rule {
				return append(rs, &nftables.Rule{Exprs: []expr.Any{&expr.Verdict{Kind: expr.VerdictDrop}}})
			})
		}, "no comment"},
		{"out of order", func(t *testing.T, k *nlfake.Nftables) {
			rewriteChain(t, k, ChainForward, func(rs []*nftables.Rule) []*nftables.Rule { rs[0], rs[1] = rs[1], rs[0]; return rs })
		}, "wrong rules in forward: out of order"},
		{"policy", func(t *testing.T, k *nlfake.Nftables) {
			c := baseChains()[1]
			c.Policy = &drop
			apply(t, k, func(b *knft.Batch) { b.AddChain(c) })
		}, "wrong chain inet twill forward: type filter hook 2 priority 0 policy drop, want"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k, repaired := &nlfake.Nftables{}, 0
			tb := fakeTable(k, &repaired)
			if err := tb.Sync(); err != nil {
				t.Fatal(err)
			}
			gen, _ := k.Generation()
			if err := tb.Sync(); err != nil {
				t.Fatal(err)
			}
			if again, _ := k.Generation(); again != gen {
				t.Fatalf("a Sync of an unchanged table wrote it")
			}
			tc.breakIt(t, k)
			d, err := tb.Drift()
			if err != nil {
				t.Fatal(err)
			}
			got := "missing " + strings.Join(d.Missing, "|missing ") + "|wrong " + strings.Join(d.Wrong, "|wrong ") + "|extra " + strings.Join(d.Extra, "|extra ")
			if !strings.Contains(got, tc.drift) {
				t.Errorf("drift %q lacks %q", got, tc.drift)
			}
			if err := tb.Sync(); err != nil {
				t.Fatal(err)
			}
			if d, err := tb.Drift(); err != nil || !d.Clean() {
				t.Fatalf("after Sync: %+v (%v)", d, err)
			}
			if repaired != 1 {
				t.Errorf("repairs counted: %d, want 1", repaired)
			}
		})
	}
}

// Delete removes twill's table and nothing else, and says whether there
// was one.
func TestDelete(t *testing.T) {
	k, n := &nlfake.Nftables{}, 0
	other := &nftables.Table{Family: nftables.TableFamilyIPv4, Name: "kube-proxy"}
	apply(t, k, func(b *knft.Batch) { b.AddTable(other) })
	if err := fakeTable(k, &n).Sync(); err != nil {
		t.Fatal(err)
	}
	for i, want := range []bool{true, false} {
		got, err := Delete(k)
		if err != nil || got != want {
			t.Fatalf("Delete #%d: %v (%v), want %v", i+1, got, err, want)
		}
	}
	if ts, _ := k.Tables(); len(ts) != 1 || ts[0].Name != "kube-proxy" {
		t.Errorf("tables left: %v, want kube-proxy's alone", ts)
	}
}
