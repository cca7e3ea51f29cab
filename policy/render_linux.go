package policy

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/twill-net/twill/internal/nftexpr"
)

func table() *nftables.Table {
	return &nftables.Table{Family: nftables.TableFamilyINet, Name: TableName}
}

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
	return &nftables.Chain{Table: table(), Name: name, Type: nftables.ChainTypeFilter,
		Hooknum: hook, Priority: &prio, Policy: &accept}
}

// kernelChain is chain name as written: a base chain, or a regular one.
func kernelChain(name string) *nftables.Chain {
	if c := baseChain(name); c != nil {
		return c
	}
	return &nftables.Chain{Table: table(), Name: name}
}

func kernelSet(s Set) *nftables.Set {
	kt := nftables.TypeIPAddr
	if s.V6 {
		kt = nftables.TypeIP6Addr
	}
	if s.VMap {
		return &nftables.Set{Table: table(), Name: s.Name, KeyType: kt, IsMap: true, DataType: nftables.TypeVerdict}
	}
	return &nftables.Set{Table: table(), Name: s.Name, KeyType: kt}
}

func elements(s Set) []nftables.SetElement {
	out := make([]nftables.SetElement, len(s.Elems))
	for i, a := range s.Elems {
		out[i] = element(a, s.VMap, s.jump(i))
	}
	return out
}

// element is an address of a set, or of a verdict map with its jump.
func element(a netip.Addr, vmap bool, jump string) nftables.SetElement {
	if !vmap {
		return nftables.SetElement{Key: a.AsSlice()}
	}
	return nftables.SetElement{Key: a.AsSlice(), VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: jump}}
}

// elementJump reads the chain a verdict map's element jumps to, from the
// element's data as the library hands it over (the verdict's attributes).
func elementJump(val []byte) string {
	ad, err := netlink.NewAttributeDecoder(val)
	if err != nil {
		return ""
	}
	ad.ByteOrder = binary.BigEndian
	var code uint32
	var chain string
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_VERDICT_CODE:
			code = ad.Uint32()
		case unix.NFTA_VERDICT_CHAIN:
			chain = ad.String()
		}
	}
	if ad.Err() != nil || int32(code) != int32(expr.VerdictJump) {
		return "?" // equals no wanted jump
	}
	return chain
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
	if a.VMap != "" {
		es = append(es, load(), &expr.Lookup{SourceRegister: 1, SetName: a.VMap, DestRegister: 0, IsDestRegSet: true})
	}
	return es
}

func comment(s string) []byte {
	if s == "" {
		return nil
	}
	return userdata.AppendString(nil, userdata.TypeComment, s)
}

// fingerprint is a rule's expressions in netlink form, its counters
// zeroed: equal fingerprints are equal rules.
func fingerprint(es []expr.Any) ([]byte, error) {
	var b bytes.Buffer
	for _, e := range es {
		if _, ok := e.(*expr.Counter); ok {
			e = &expr.Counter{}
		}
		m, err := expr.Marshal(byte(nftables.TableFamilyINet), e)
		if err != nil {
			return nil, fmt.Errorf("encoding %T: %w", e, err)
		}
		b.Write(m)
	}
	return b.Bytes(), nil
}
