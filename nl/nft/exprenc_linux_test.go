package nft

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
)

// AppendExpr writes what expr.Marshal writes, byte for byte, for every
// kind of expression it writes itself (with every optional attribute on
// and off, data of every length mod 4) and for those it hands on.
func TestAppendExprIsMarshal(t *testing.T) {
	rnd := rand.New(rand.NewPCG(1, 2))
	data := func() []byte {
		b := make([]byte, rnd.IntN(20))
		for i := range b {
			b[i] = byte(rnd.Uint32())
		}
		return b
	}
	name := func() string { return strings.Repeat("s", rnd.IntN(12)) }
	kinds := []func() expr.Any{
		func() expr.Any { return &expr.Counter{Bytes: rnd.Uint64(), Packets: rnd.Uint64()} },
		func() expr.Any {
			return &expr.Cmp{Op: expr.CmpOp(rnd.IntN(6)), Register: rnd.Uint32N(20), Data: data()}
		},
		func() expr.Any {
			return &expr.Payload{DestRegister: rnd.Uint32N(20), Base: expr.PayloadBase(rnd.IntN(3)), Offset: rnd.Uint32N(64), Len: rnd.Uint32N(16)}
		},
		func() expr.Any {
			return &expr.Payload{OperationType: expr.PayloadWrite, SourceRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 8, Len: 1}
		},
		func() expr.Any {
			return &expr.Payload{DestRegister: 1, Offset: 8, Len: 1, CsumType: expr.CsumTypeInet, CsumOffset: 10, CsumFlags: rnd.Uint32N(2)}
		},
		func() expr.Any {
			return &expr.Meta{Key: expr.MetaKey(rnd.IntN(30)), SourceRegister: rnd.IntN(2) == 0, Register: rnd.Uint32N(20)}
		},
		func() expr.Any {
			return &expr.Lookup{SourceRegister: rnd.Uint32N(3), DestRegister: rnd.Uint32N(3), IsDestRegSet: rnd.IntN(2) == 0,
				SetID: rnd.Uint32(), SetName: name(), Invert: rnd.IntN(2) == 0}
		},
		func() expr.Any { return &expr.Immediate{Register: rnd.Uint32N(20), Data: data()} },
		func() expr.Any {
			return &expr.Verdict{Kind: []expr.VerdictKind{expr.VerdictAccept, expr.VerdictDrop, expr.VerdictReturn, expr.VerdictJump, expr.VerdictGoto}[rnd.IntN(5)], Chain: name()}
		},
		func() expr.Any { return &expr.Masq{Random: true, FullyRandom: rnd.IntN(2) == 0} },
		func() expr.Any { return &expr.Ct{Register: 1, Key: expr.CtKeySTATE} },
	}
	for i := range 5000 {
		x := kinds[i%len(kinds)]()
		want, err := expr.Marshal(byte(nftables.TableFamilyINet), x)
		if err != nil {
			t.Fatal(err)
		}
		prefix := []byte{1, 2, 3, 4}
		got, err := AppendExpr(bytes.Clone(prefix), byte(nftables.TableFamilyINet), x)
		if err != nil {
			t.Fatalf("%#v: %v", x, err)
		}
		if !bytes.Equal(got[:4], prefix) || !bytes.Equal(got[4:], want) {
			t.Fatalf("%#v:\n got %x\nwant %x", x, got[4:], want)
		}
	}
}

// AppendExprs writes each counter as one that counted nothing, and the
// rest as AppendExpr does.
func TestAppendExprsZeroesCounters(t *testing.T) {
	xs := []expr.Any{&expr.Counter{Bytes: 9, Packets: 3}, &expr.Verdict{Kind: expr.VerdictDrop}}
	got, err := AppendExprs(nil, byte(nftables.TableFamilyINet), xs)
	if err != nil {
		t.Fatal(err)
	}
	var want []byte
	for _, x := range []expr.Any{&expr.Counter{}, xs[1]} {
		m, _ := expr.Marshal(byte(nftables.TableFamilyINet), x)
		want = append(want, m...)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("got %x, want %x", got, want)
	}
}

func BenchmarkAppendExpr(b *testing.B) {
	rule := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{2}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
		&expr.Lookup{SourceRegister: 1, SetName: "sel-0123456789abcdef-4"},
		&expr.Counter{},
		&expr.Verdict{Kind: expr.VerdictReturn},
	}
	for _, tc := range []struct {
		name string
		enc  func(buf []byte, x expr.Any) ([]byte, error)
	}{
		{"AppendExpr", func(buf []byte, x expr.Any) ([]byte, error) { return AppendExpr(buf, 1, x) }},
		{"expr.Marshal", func(buf []byte, x expr.Any) ([]byte, error) {
			m, err := expr.Marshal(1, x)
			return append(buf, m...), err
		}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			buf := make([]byte, 0, 1024)
			for range b.N {
				buf = buf[:0]
				for _, x := range rule {
					var err error
					if buf, err = tc.enc(buf, x); err != nil {
						b.Fatal(fmt.Errorf("%T: %w", x, err))
					}
				}
			}
		})
	}
}
