package nftables

import (
	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/twill-net/twill/internal/nftexpr"
	"github.com/twill-net/twill/network"
)

// TableName is twill's table, in the inet family (both address families).
const TableName = "twill"

// Chain names in twill's table. Each is a base chain, so an accept in it
// cannot override a drop in another table's chain at the same hook.
const (
	ChainPostrouting = "postrouting" // nat, hook postrouting, priority srcnat
	ChainForward     = "forward"     // filter, hook forward, priority filter
)

// twillTable is twill's table, afresh for each use (the library's objects
// are pointers; none is shared).
func twillTable() *nftables.Table {
	return &nftables.Table{Family: nftables.TableFamilyINet, Name: TableName}
}

// chainFor maps a rule's iptables table to twill's nftables chain.
func chainFor(iptablesTable string) string {
	switch iptablesTable {
	case "nat":
		return ChainPostrouting
	case "filter":
		return ChainForward
	}
	return ""
}

// baseChains are the chains of twill's table, in the order they are written.
func baseChains() []*nftables.Chain {
	accept := nftables.ChainPolicyAccept
	table := twillTable()
	return []*nftables.Chain{
		{Table: table, Name: ChainPostrouting, Type: nftables.ChainTypeNAT, Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource, Policy: &accept},
		{Table: table, Name: ChainForward, Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accept},
	}
}

// ruleExprs renders a rule as nftables expressions: the family, then the
// address matches, then the verdict.
func ruleExprs(r network.Rule) []expr.Any {
	v6 := r.Src.Prefix.Addr().Is6() || r.Dst.Prefix.Addr().Is6()
	proto := byte(unix.NFPROTO_IPV4)
	if v6 {
		proto = unix.NFPROTO_IPV6
	}
	es := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
	}
	es = append(es, addrMatch(r.Src, v6, false)...)
	es = append(es, addrMatch(r.Dst, v6, true)...)
	switch r.Verdict {
	case network.Return:
		es = append(es, &expr.Verdict{Kind: expr.VerdictReturn})
	case network.Masquerade:
		es = append(es, &expr.Masq{FullyRandom: true})
	case network.Accept:
		es = append(es, &expr.Verdict{Kind: expr.VerdictAccept})
	}
	return es
}

// addrMatch loads the source or destination address, masks it to the
// prefix's length and compares it.
func addrMatch(m network.Match, v6, dst bool) []expr.Any {
	if !m.Prefix.IsValid() {
		return nil
	}
	op := expr.CmpOpEq
	if m.Not {
		op = expr.CmpOpNeq
	}
	return nftexpr.MatchPrefix(m.Prefix, v6, dst, op)
}
