// Package nftexpr builds the nftables expressions that match a packet's
// IP addresses, shared by twill's netfilter rules (network/nftables) and
// its NetworkPolicy enforcer (policy).
package nftexpr

import (
	"net"
	"net/netip"

	"github.com/google/nftables/expr"
)

// LoadAddr loads the packet's source address (dst: its destination) into
// register 1: 4 bytes from offset 12 of the IPv4 header (destination at 16),
// 16 bytes from offset 8 of the IPv6 header (destination at 24).
func LoadAddr(v6, dst bool) expr.Any {
	offset, n := addr(v6, dst)
	return &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: n}
}

// MatchPrefix loads the source (dst: destination) address, masks it to p's
// length and compares it with p's address: op CmpOpEq matches addresses in
// p, CmpOpNeq those outside it.
func MatchPrefix(p netip.Prefix, v6, dst bool, op expr.CmpOp) []expr.Any {
	_, n := addr(v6, dst)
	es := []expr.Any{LoadAddr(v6, dst)}
	if bits := p.Bits(); bits < int(n)*8 {
		es = append(es, &expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: n, Mask: net.CIDRMask(bits, int(n)*8), Xor: make([]byte, n)})
	}
	return append(es, &expr.Cmp{Op: op, Register: 1, Data: p.Masked().Addr().AsSlice()})
}

func addr(v6, dst bool) (offset, n uint32) {
	offset, n = 12, 4 // IPv4 saddr; daddr follows it
	if v6 {
		offset, n = 8, 16
	}
	if dst {
		offset += n
	}
	return offset, n
}
