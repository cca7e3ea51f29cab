package nft

import (
	"encoding/binary"
	"fmt"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// AppendExpr appends x as the kernel reads an expression (its name and its
// data, the contents of one NFTA_LIST_ELEM) to b: byte for byte what
// expr.Marshal gives. The expressions twill's tables are made of (counter,
// cmp, payload, meta, lookup, immediate and verdicts) are written straight
// into b, with no allocation; expr.Marshal builds each attribute in a
// slice of its own, ten times slower. Every rule is encoded twice, to
// fingerprint it and to send it: in the first write of a 43,000-rule
// policy table, expr.Marshal took half of twilld's own CPU time (2026-11-29).
// Others go through expr.Marshal.
func AppendExpr(b []byte, fam byte, x expr.Any) ([]byte, error) {
	switch x := x.(type) {
	case *expr.Counter:
		return appendCounter(b, x.Bytes, x.Packets), nil
	case *expr.Cmp:
		b, data := exprStart(b, "cmp")
		b = attrU32(b, unix.NFTA_CMP_SREG, x.Register)
		b = attrU32(b, unix.NFTA_CMP_OP, uint32(x.Op))
		cmp := attrStart(&b, unix.NLA_F_NESTED|unix.NFTA_CMP_DATA)
		b = attrBytes(b, unix.NFTA_DATA_VALUE, x.Data)
		return attrEnd(b, cmp, data), nil
	case *expr.Payload:
		if x.OperationType == expr.PayloadWrite || x.CsumType > 0 {
			break
		}
		b, data := exprStart(b, "payload")
		b = attrU32(b, unix.NFTA_PAYLOAD_DREG, x.DestRegister)
		b = attrU32(b, unix.NFTA_PAYLOAD_BASE, uint32(x.Base))
		b = attrU32(b, unix.NFTA_PAYLOAD_OFFSET, x.Offset)
		b = attrU32(b, unix.NFTA_PAYLOAD_LEN, x.Len)
		return attrEnd(b, data), nil
	case *expr.Meta:
		b, data := exprStart(b, "meta")
		b = attrU32(b, unix.NFTA_META_KEY, uint32(x.Key))
		reg := uint16(unix.NFTA_META_DREG)
		if x.SourceRegister {
			reg = unix.NFTA_META_SREG
		}
		b = attrU32(b, reg, x.Register)
		return attrEnd(b, data), nil
	case *expr.Lookup:
		b, data := exprStart(b, "lookup")
		if x.SourceRegister != 0 {
			b = attrU32(b, unix.NFTA_LOOKUP_SREG, x.SourceRegister)
		}
		if x.IsDestRegSet {
			b = attrU32(b, unix.NFTA_LOOKUP_DREG, x.DestRegister)
		}
		if x.Invert {
			b = attrU32(b, unix.NFTA_LOOKUP_FLAGS, unix.NFT_LOOKUP_F_INV)
		}
		b = attrString(b, unix.NFTA_LOOKUP_SET, x.SetName)
		b = attrU32(b, unix.NFTA_LOOKUP_SET_ID, x.SetID)
		return attrEnd(b, data), nil
	case *expr.Immediate:
		b, data := exprStart(b, "immediate")
		b = attrU32(b, unix.NFTA_IMMEDIATE_DREG, x.Register)
		imm := attrStart(&b, unix.NLA_F_NESTED|unix.NFTA_IMMEDIATE_DATA)
		b = attrBytes(b, unix.NFTA_DATA_VALUE, x.Data)
		return attrEnd(b, imm, data), nil
	case *expr.Verdict:
		b, data := exprStart(b, "immediate")
		b = attrU32(b, unix.NFTA_IMMEDIATE_DREG, unix.NFT_REG_VERDICT)
		imm := attrStart(&b, unix.NLA_F_NESTED|unix.NFTA_IMMEDIATE_DATA)
		v := attrStart(&b, unix.NLA_F_NESTED|unix.NFTA_DATA_VERDICT)
		b = attrU32(b, unix.NFTA_VERDICT_CODE, uint32(x.Kind))
		if x.Chain != "" {
			b = attrString(b, unix.NFTA_VERDICT_CHAIN, x.Chain)
		}
		return attrEnd(b, v, imm, data), nil
	}
	m, err := expr.Marshal(fam, x)
	if err != nil {
		return b, err
	}
	return append(b, m...), nil
}

// appendCounter appends a counter expression holding bytes and packets.
func appendCounter(b []byte, bytes, packets uint64) []byte {
	b, data := exprStart(b, "counter")
	b = attrU64(b, unix.NFTA_COUNTER_BYTES, bytes)
	b = attrU64(b, unix.NFTA_COUNTER_PACKETS, packets)
	return attrEnd(b, data)
}

// AppendExprs appends the expressions as AppendExpr does, one after the
// other, counters as if they had counted nothing: what a rule does, the
// same whatever its counters hold (nftsync.Fingerprint hashes it).
func AppendExprs(b []byte, fam byte, xs []expr.Any) ([]byte, error) {
	var err error
	for _, x := range xs {
		if _, ok := x.(*expr.Counter); ok {
			b = appendCounter(b, 0, 0)
			continue
		}
		if b, err = AppendExpr(b, fam, x); err != nil {
			return b, fmt.Errorf("encoding %T: %w", x, err)
		}
	}
	return b, nil
}

// exprStart appends an expression's name and opens its data, which
// attrEnd closes.
func exprStart(b []byte, name string) ([]byte, int) {
	b = attrString(b, unix.NFTA_EXPR_NAME, name)
	at := attrStart(&b, unix.NLA_F_NESTED|unix.NFTA_EXPR_DATA)
	return b, at
}

// attrStart appends an attribute header whose length attrEnd fills in,
// and returns where it starts.
func attrStart(b *[]byte, typ uint16) int {
	at := len(*b)
	*b = binary.NativeEndian.AppendUint16(binary.NativeEndian.AppendUint16(*b, 0), typ)
	return at
}

// attrEnd closes the attributes opened at ats, innermost first: each
// one's length is what it holds by then. Nested contents are aligned
// already.
func attrEnd(b []byte, ats ...int) []byte {
	for _, at := range ats {
		binary.NativeEndian.PutUint16(b[at:], uint16(len(b)-at))
	}
	return b
}

// attrBytes appends an attribute holding v, padded to 4 bytes as netlink
// aligns attributes (the length says v's).
func attrBytes(b []byte, typ uint16, v []byte) []byte {
	b = binary.NativeEndian.AppendUint16(b, uint16(4+len(v)))
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = append(b, v...)
	return pad(b, len(v))
}

func attrString(b []byte, typ uint16, s string) []byte {
	b = binary.NativeEndian.AppendUint16(b, uint16(4+len(s)+1))
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = append(b, s...)
	b = append(b, 0)
	return pad(b, len(s)+1)
}

func attrU32(b []byte, typ uint16, v uint32) []byte {
	b = binary.NativeEndian.AppendUint16(b, 8)
	b = binary.NativeEndian.AppendUint16(b, typ)
	return binary.BigEndian.AppendUint32(b, v)
}

func attrU64(b []byte, typ uint16, v uint64) []byte {
	b = binary.NativeEndian.AppendUint16(b, 12)
	b = binary.NativeEndian.AppendUint16(b, typ)
	return binary.BigEndian.AppendUint64(b, v)
}

// pad appends the zeros that align n bytes of data to 4.
func pad(b []byte, n int) []byte {
	for ; n%4 != 0; n++ {
		b = append(b, 0)
	}
	return b
}
