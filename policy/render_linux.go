package policy

import (
	"encoding/binary"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/twill-net/twill/internal/nftexpr"
	"github.com/twill-net/twill/nl/nft"
	"github.com/twill-net/twill/nl/nftsync"
)

// baseChain is a base chain of the table (BaseChains), nil for a pod's.
// Forward runs after twill's own forward chain (priority filter) and
// kube-proxy's, and its drop is final whatever they accepted: an accept in
// one base chain does not skip another. Input does the same on the input
// hook, for a local pod's packets to its own node.
func baseChain(name string) *nftables.Chain {
	hook := nftables.ChainHookForward
	switch name {
	case ChainForward:
	case ChainInput:
		hook = nftables.ChainHookInput
	default:
		return nil
	}
	accept := nftables.ChainPolicyAccept
	prio := *nftables.ChainPriorityFilter + 10
	return &nftables.Chain{Name: name, Type: nftables.ChainTypeFilter,
		Hooknum: hook, Priority: &prio, Policy: &accept}
}

func keyType(v6 bool) nftables.SetDatatype {
	if v6 {
		return nftables.TypeIP6Addr
	}
	return nftables.TypeIPAddr
}

// elements is a set's addresses, each with its jump in a verdict map.
func elements(s Set) []nft.Elem {
	out := make([]nft.Elem, len(s.Elems))
	for i, a := range s.Elems {
		out[i] = nft.Elem{Key: a.AsSlice(), Jump: s.jump(i), Goto: s.Goto}
	}
	return out
}

// renderRules is a chain's rules as nftables expressions.
func renderRules(c Chain) []nftsync.Rule {
	out := make([]nftsync.Rule, len(c.Rules))
	for i, r := range c.Rules {
		out[i] = nftsync.Rule{Comment: r.Comment, Exprs: ruleExprs(r)}
	}
	return out
}

// ruleExprs renders a rule as nftables expressions.
func ruleExprs(r Rule) []expr.Any {
	var es []expr.Any
	if r.Established {
		es = append(es,
			&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
				Mask: binary.NativeEndian.AppendUint32(nil, expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED), Xor: make([]byte, 4)},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)})
	}
	if !r.Src.empty() || !r.Dst.empty() {
		proto := byte(unix.NFPROTO_IPV4)
		if r.V6 {
			proto = unix.NFPROTO_IPV6
		}
		es = append(es, &expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}})
		es = append(es, addrExprs(r.Src, r.V6, false)...)
		es = append(es, addrExprs(r.Dst, r.V6, true)...)
	}
	if r.NeighbourDiscovery {
		es = append(es, &expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV6}},
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_ICMPV6}},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 1},
			&expr.Range{Op: expr.CmpOpEq, Register: 1, FromData: []byte{133}, ToData: []byte{137}})
	}
	if r.Proto != 0 {
		es = append(es, &expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{r.Proto}})
		if r.PortLo != 0 {
			es = append(es, &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2})
			if r.PortLo == r.PortHi {
				es = append(es, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.BigEndian.AppendUint16(nil, r.PortLo)})
			} else {
				es = append(es, &expr.Range{Op: expr.CmpOpEq, Register: 1,
					FromData: binary.BigEndian.AppendUint16(nil, r.PortLo), ToData: binary.BigEndian.AppendUint16(nil, r.PortHi)})
			}
		}
	}
	if r.Sample > 1 {
		es = append(es, &expr.Numgen{Register: 1, Modulus: r.Sample, Type: unix.NFT_NG_RANDOM},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: make([]byte, 4)})
	}
	if r.Limit != 0 {
		es = append(es, &expr.Limit{Type: expr.LimitTypePkts, Rate: uint64(r.Limit), Over: r.LimitOver, Unit: expr.LimitTimeSecond, Burst: r.Limit})
	}
	if r.Log != "" {
		// As the kernel dumps an NFLOG log: group, prefix, snaplen.
		es = append(es, &expr.Log{Key: 1<<unix.NFTA_LOG_GROUP | 1<<unix.NFTA_LOG_PREFIX | 1<<unix.NFTA_LOG_SNAPLEN,
			Group: LogGroup, Snaplen: LogSnaplen, Data: []byte(r.Log)})
	}
	if r.Counter {
		es = append(es, &expr.Counter{})
	}
	// A verdict map's lookup sets the verdict and ends the rule: it comes
	// after every match and the counter.
	es = append(es, vmapExprs(r.Src, r.V6, false)...)
	es = append(es, vmapExprs(r.Dst, r.V6, true)...)
	switch r.Verdict {
	case Accept:
		es = append(es, &expr.Verdict{Kind: expr.VerdictAccept})
	case Drop:
		es = append(es, &expr.Verdict{Kind: expr.VerdictDrop})
	case Return:
		es = append(es, &expr.Verdict{Kind: expr.VerdictReturn})
	case Jump:
		es = append(es, &expr.Verdict{Kind: expr.VerdictJump, Chain: r.Target})
	case Goto:
		es = append(es, &expr.Verdict{Kind: expr.VerdictGoto, Chain: r.Target})
	case Continue:
	}
	return es
}

// addrExprs matches the source or destination address against a.
func addrExprs(a Addr, v6, dst bool) []expr.Any {
	if a.empty() {
		return nil
	}
	load := func() expr.Any { return nftexpr.LoadAddr(v6, dst) }
	var es []expr.Any
	if a.Prefix.IsValid() {
		es = append(es, nftexpr.MatchPrefix(a.Prefix, v6, dst, expr.CmpOpEq)...)
	}
	for _, e := range a.Except {
		es = append(es, nftexpr.MatchPrefix(e, v6, dst, expr.CmpOpNeq)...)
	}
	if a.Set != "" {
		es = append(es, load(), &expr.Lookup{SourceRegister: 1, SetName: a.Set})
	}
	if a.NotSet != "" {
		es = append(es, load(), &expr.Lookup{SourceRegister: 1, SetName: a.NotSet, Invert: true})
	}
	return es
}

// vmapExprs looks the source or destination address up in a's verdict
// map, if it has one.
func vmapExprs(a Addr, v6, dst bool) []expr.Any {
	if a.VMap == "" {
		return nil
	}
	return []expr.Any{nftexpr.LoadAddr(v6, dst), &expr.Lookup{SourceRegister: 1, SetName: a.VMap, DestRegister: 0, IsDestRegSet: true}}
}
