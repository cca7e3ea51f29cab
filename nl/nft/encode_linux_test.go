package nft

import (
	"encoding/binary"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"
)

var testTable = &nftables.Table{Family: nftables.TableFamilyINet, Name: "t"}

// What the encoder cannot write right it refuses, naming the operation:
// a set of a kind twill never makes, an attribute past 16 bits of length.
func TestEncodeRefuses(t *testing.T) {
	c := &nftables.Chain{Table: testTable, Name: "c"}
	for _, tc := range []struct {
		name string
		op   func(b *Batch)
		want string
	}{
		{"an interval set", func(b *Batch) {
			b.AddSet(&nftables.Set{Table: testTable, Name: "ranges", KeyType: nftables.TypeIPAddr, Interval: true}, nil)
		}, "operation 1: adding set ranges: Interval is set: only plain sets and verdict maps are written"},
		{"a rule's comment of 70,000 bytes", func(b *Batch) {
			b.AddRule(&nftables.Rule{Table: testTable, Chain: c, UserData: make([]byte, 70000)})
		}, "operation 1: an attribute of 70004 bytes"},
		{"a rule to delete without its handle", func(b *Batch) {
			b.DelRule(&nftables.Rule{Table: testTable, Chain: c})
		}, "operation 1: deleting a rule of chain c: the rule has no handle"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b Batch
			b.AddTable(testTable)
			tc.op(&b)
			if _, err := encode(&b, firstSeq); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%v, want it to say %q", err, tc.want)
			}
		})
	}
}

// The batch is framed as the kernel reads it: a begin, each operation's
// messages in order, an end; only the last operation asks for an
// acknowledgement, and set elements go in messages of at most
// elemsPerMessage bytes of them.
func TestEncodeFraming(t *testing.T) {
	s := &nftables.Set{Table: testTable, Name: "s", KeyType: nftables.TypeIPAddr}
	var elems []Elem
	for i := range 3000 {
		elems = append(elems, Elem{Key: []byte{10, 0, byte(i >> 8), byte(i)}})
	}
	var b Batch
	b.AddTable(testTable)
	b.AddSet(s, elems)
	b.AddChain(&nftables.Chain{Table: testTable, Name: "c"})
	e, err := encode(&b, firstSeq)
	if err != nil {
		t.Fatal(err)
	}
	var buf []byte
	for _, c := range e.out {
		buf = append(buf, c...)
	}
	if len(buf) != e.size || len(e.out) != (e.size+chunkSize-1)/chunkSize {
		t.Fatalf("%d bytes in %d chunks, %d counted", len(buf), len(e.out), e.size)
	}
	var types []uint16
	var acks []uint32
	for len(buf) > 0 {
		n := int(binary.NativeEndian.Uint32(buf))
		typ, flags, seq := binary.NativeEndian.Uint16(buf[4:]), binary.NativeEndian.Uint16(buf[6:]), binary.NativeEndian.Uint32(buf[8:])
		if typ>>8 == unix.NFNL_SUBSYS_NFTABLES {
			typ &= 0xff
		}
		types = append(types, typ)
		if flags&unix.NLM_F_ACK != 0 {
			acks = append(acks, seq)
		}
		if flags&unix.NLM_F_ECHO != 0 || n%4 != 0 || n > len(buf) {
			t.Fatalf("message %d: flags %#x, %d bytes of %d", len(types), flags, n, len(buf))
		}
		buf = buf[n:]
	}
	elemMsgs := len(chunked(elems))
	want := []uint16{unix.NFNL_MSG_BATCH_BEGIN, unix.NFT_MSG_NEWTABLE, unix.NFT_MSG_NEWSET}
	for range elemMsgs {
		want = append(want, unix.NFT_MSG_NEWSETELEM)
	}
	want = append(want, unix.NFT_MSG_NEWCHAIN, unix.NFNL_MSG_BATCH_END)
	if elemMsgs < 2 || !slices.Equal(types, want) {
		t.Errorf("message types %v, want %v", types, want)
	}
	if len(acks) != 1 || acks[0] != e.last || e.opOf(firstSeq, e.last) != 2 || e.opOf(firstSeq, firstSeq+1) != -1 {
		t.Errorf("acknowledgements asked of %v; the last operation's message is %d, of op %d", acks, e.last, e.opOf(firstSeq, e.last))
	}
}

// errorMsg is the kernel's error message about message seq, with an
// extended acknowledgement's text when msg is not empty.
func errorMsg(code int32, seq uint32, msg string) []byte {
	flags := uint16(unix.NLM_F_CAPPED)
	if msg != "" {
		flags |= unix.NLM_F_ACK_TLVS
	}
	b := binary.NativeEndian.AppendUint32(nil, 0)
	b = binary.NativeEndian.AppendUint16(b, unix.NLMSG_ERROR)
	b = binary.NativeEndian.AppendUint16(b, flags)
	b = binary.NativeEndian.AppendUint64(b, 0)
	b = binary.NativeEndian.AppendUint32(b, uint32(code))
	b = binary.NativeEndian.AppendUint32(b, 16)
	b = binary.NativeEndian.AppendUint32(b, 0)
	b = binary.NativeEndian.AppendUint32(b, seq)
	b = binary.NativeEndian.AppendUint32(b, 0)
	if msg != "" {
		n := unix.NLA_HDRLEN + len(msg) + 1
		b = binary.NativeEndian.AppendUint16(b, uint16(n))
		b = binary.NativeEndian.AppendUint16(b, unix.NLMSGERR_ATTR_MSG)
		b = append(append(b, msg...), 0)
		for len(b)%4 != 0 {
			b = append(b, 0)
		}
	}
	binary.NativeEndian.PutUint32(b, uint32(len(b)))
	return b
}

// The kernel's replies: an acknowledgement of the last operation ends
// the wait; an error names its message and carries the kernel's words.
func TestReply(t *testing.T) {
	e := &encoder{last: 7}
	if r, err := e.reply(errorMsg(0, 7, "")); err != nil || !r.done {
		t.Errorf("the last operation's acknowledgement: %+v, %v", r, err)
	}
	if r, err := e.reply(errorMsg(0, 5, "")); err != nil || r.done || r.code != 0 {
		t.Errorf("another's acknowledgement: %+v, %v", r, err)
	}
	two := append(errorMsg(-int32(unix.ENOENT), 5, "set does not exist"), errorMsg(0, 7, "")...)
	r, err := e.reply(two)
	if err != nil || r.code != -int32(unix.ENOENT) || r.seq != 5 || r.why != ": set does not exist" {
		t.Errorf("an error, then the acknowledgement: %+v, %v", r, err)
	}
	if _, err := e.reply(errorMsg(0, 7, "")[:20]); err == nil {
		t.Error("a cut reply: no error")
	}
	if !errors.Is(unix.Errno(-r.code), unix.ENOENT) {
		t.Error("the code is not the errno")
	}
}

// FuzzReply: no datagram makes the reply reader panic or read past it.
func FuzzReply(f *testing.F) {
	f.Add(errorMsg(0, 7, ""))
	f.Add(errorMsg(-2, 5, "why"))
	f.Add(append(errorMsg(-1, 1, "x"), errorMsg(0, 7, "")...))
	f.Fuzz(func(t *testing.T, b []byte) {
		e := &encoder{last: 7}
		_, _ = e.reply(b)
	})
}
