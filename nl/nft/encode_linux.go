package nft

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// encoder writes a batch as the kernel reads one transaction: every
// message, between the batch's begin and end, sent at once. It writes the
// library's objects as the library would, but for two flags: no message
// asks for its rule back (NLM_F_ECHO), and only the last one asks for an
// acknowledgement (the kernel reports every error anyway). At 47,000
// messages those replies cost twilld more memory than the table itself.
//
// The messages go, as written, into chunks of chunkSize bytes that the
// kernel reads as one (sendmsg's iovecs): the batch is never copied to
// grow, and the transaction costs twilld its size once.
type encoder struct {
	msg  []byte   // the message being written
	out  [][]byte // the messages written, in chunks
	size int      // their bytes
	seq  uint32
	last uint32  // the sequence number of the last operation's message
	ops  []int32 // the Op each message after the begin came from
	sets map[*nftables.Set]uint32
	err  error // an attribute too long for its 16-bit length
}

// chunkSize is the size of a chunk of the encoded batch.
const chunkSize = 1 << 20

// The header flags of the messages.
const (
	flagsAdd    = unix.NLM_F_REQUEST | unix.NLM_F_CREATE
	flagsAppend = flagsAdd | unix.NLM_F_APPEND
	flagsDel    = unix.NLM_F_REQUEST
)

func encode(b *Batch, firstSeq uint32) (*encoder, error) {
	e := &encoder{seq: firstSeq, sets: map[*nftables.Set]uint32{}}
	e.batchMark(unix.NFNL_MSG_BATCH_BEGIN)
	for i, op := range b.Ops {
		if err := errors.Join(e.op(op, int32(i)), e.err); err != nil {
			return nil, fmt.Errorf("nftables batch, operation %d: %w", i, err)
		}
	}
	e.ackLast()
	e.batchMark(unix.NFNL_MSG_BATCH_END)
	e.flush()
	return e, nil
}

func (e *encoder) op(op Op, i int32) error {
	switch op.Kind {
	case AddTable, DelTable:
		e.table(op, i)
	case AddChain, FlushChain, DelChain:
		e.chain(op, i)
	case AddRule, DelRule:
		return e.rule(op, i)
	case AddRules:
		rules, err := op.Rules()
		if err != nil {
			return fmt.Errorf("rendering the rules of chain %s: %w", op.Chain.Name, err)
		}
		for _, r := range rules {
			if err := e.rule(Op{Kind: AddRule, Table: op.Table, Chain: op.Chain, Rule: r}, i); err != nil {
				return err
			}
		}
	case AddSet, DelSet, AddElems, DelElems:
		return e.set(op, i)
	default:
		return fmt.Errorf("unknown operation %d", op.Kind)
	}
	return nil
}

func (e *encoder) table(op Op, i int32) {
	if op.Kind == AddTable {
		e.begin(unix.NFT_MSG_NEWTABLE, flagsAdd, op.Table.Family, i)
	} else {
		e.begin(unix.NFT_MSG_DELTABLE, flagsDel, op.Table.Family, i)
	}
	e.strz(unix.NFTA_TABLE_NAME, op.Table.Name)
	e.u32(unix.NFTA_TABLE_FLAGS, 0)
	e.end()
}

func (e *encoder) chain(op Op, i int32) {
	c := op.Chain
	switch op.Kind {
	case FlushChain: // the deletion of every rule of the chain
		e.begin(unix.NFT_MSG_DELRULE, flagsDel, c.Table.Family, i)
		e.strz(unix.NFTA_RULE_TABLE, c.Table.Name)
		e.strz(unix.NFTA_RULE_CHAIN, c.Name)
		e.end()
		return
	case DelChain:
		e.begin(unix.NFT_MSG_DELCHAIN, flagsDel, c.Table.Family, i)
	default:
		e.begin(unix.NFT_MSG_NEWCHAIN, flagsAdd, c.Table.Family, i)
	}
	e.strz(unix.NFTA_CHAIN_TABLE, c.Table.Name)
	e.strz(unix.NFTA_CHAIN_NAME, c.Name)
	if op.Kind == AddChain {
		if c.Hooknum != nil && c.Priority != nil {
			n := e.nest(unix.NFTA_CHAIN_HOOK)
			e.u32(unix.NFTA_HOOK_HOOKNUM, uint32(*c.Hooknum))
			e.u32(unix.NFTA_HOOK_PRIORITY, uint32(*c.Priority))
			if c.Device != "" {
				e.strz(unix.NFTA_HOOK_DEV, c.Device)
			}
			e.close(n)
		}
		if c.Policy != nil {
			e.u32(unix.NFTA_CHAIN_POLICY, uint32(*c.Policy))
		}
		if c.Type != "" {
			e.strz(unix.NFTA_CHAIN_TYPE, string(c.Type))
		}
	}
	e.end()
}

func (e *encoder) rule(op Op, i int32) error {
	r := op.Rule
	if op.Kind == DelRule {
		if r.Handle == 0 {
			return fmt.Errorf("deleting a rule of chain %s: the rule has no handle", op.Chain.Name)
		}
		e.begin(unix.NFT_MSG_DELRULE, flagsDel, op.Table.Family, i)
		e.strz(unix.NFTA_RULE_TABLE, op.Table.Name)
		e.strz(unix.NFTA_RULE_CHAIN, op.Chain.Name)
		e.u64(unix.NFTA_RULE_HANDLE, r.Handle)
		e.end()
		return nil
	}
	e.begin(unix.NFT_MSG_NEWRULE, flagsAppend, op.Table.Family, i)
	e.strz(unix.NFTA_RULE_TABLE, op.Table.Name)
	e.strz(unix.NFTA_RULE_CHAIN, op.Chain.Name)
	list := e.nest(unix.NFTA_RULE_EXPRESSIONS)
	for _, x := range r.Exprs {
		el := e.nest(unix.NFTA_LIST_ELEM)
		var err error
		if e.msg, err = AppendExpr(e.msg, byte(op.Table.Family), x); err != nil {
			return fmt.Errorf("adding a rule to chain %s: encoding %T: %w", op.Chain.Name, x, err)
		}
		e.close(el)
	}
	e.close(list)
	if r.UserData != nil {
		e.attr(unix.NFTA_RULE_USERDATA, r.UserData)
	}
	e.end()
	return nil
}

// set writes a set's operation; a set's elements go in messages of at
// most elemsPerMessage bytes of elements each.
func (e *encoder) set(op Op, i int32) error {
	s := op.Set
	switch op.Kind {
	case DelSet:
		e.begin(unix.NFT_MSG_DELSET, flagsDel, s.Table.Family, i)
		e.strz(unix.NFTA_SET_TABLE, s.Table.Name)
		e.strz(unix.NFTA_SET_NAME, s.Name)
		e.end()
		return nil
	case AddSet:
		if err := e.newSet(s, i); err != nil {
			return err
		}
	}
	typ := uint16(unix.NFT_MSG_NEWSETELEM)
	if op.Kind == DelElems {
		typ = unix.NFT_MSG_DELSETELEM
	}
	for _, c := range chunked(op.Elems) {
		if len(c) > 0 {
			e.elems(typ, s, c, i)
		}
	}
	return nil
}

// newSet writes a set's creation: a plain set or a verdict map, all that
// twill makes; anything else is refused rather than written wrong.
func (e *encoder) newSet(s *nftables.Set, i int32) error {
	for _, f := range []struct {
		name string
		set  bool
	}{{"Anonymous", s.Anonymous}, {"Constant", s.Constant}, {"Interval", s.Interval}, {"HasTimeout", s.HasTimeout},
		{"Dynamic", s.Dynamic}, {"Concatenation", s.Concatenation}, {"Counter", s.Counter}, {"Size", s.Size > 0},
		{"Comment", s.Comment != ""}, {"DataType " + s.DataType.Name, s.IsMap && s.DataType.Name != nftables.TypeVerdict.Name}} {
		if f.set {
			return fmt.Errorf("adding set %s: %s is set: only plain sets and verdict maps are written", s.Name, f.name)
		}
	}
	flags := uint32(0)
	if s.IsMap {
		flags |= unix.NFT_SET_MAP
	}
	id := uint32(len(e.sets) + 1)
	e.sets[s] = id
	e.begin(unix.NFT_MSG_NEWSET, flagsAdd, s.Table.Family, i)
	e.strz(unix.NFTA_SET_TABLE, s.Table.Name)
	e.strz(unix.NFTA_SET_NAME, s.Name)
	e.u32(unix.NFTA_SET_FLAGS, flags)
	e.u32(unix.NFTA_SET_KEY_TYPE, s.KeyType.GetNFTMagic())
	e.u32(unix.NFTA_SET_KEY_LEN, s.KeyType.Bytes)
	e.u32(unix.NFTA_SET_ID, id)
	if s.IsMap {
		e.u32(unix.NFTA_SET_DATA_TYPE, unix.NFT_DATA_VERDICT)
		e.u32(unix.NFTA_SET_DATA_LEN, s.DataType.Bytes)
	}
	e.end()
	return nil
}

// elems writes one message of a set's elements: keys, and a verdict
// map's jumps when added.
func (e *encoder) elems(typ uint16, s *nftables.Set, elems []Elem, i int32) {
	flags := uint16(flagsAdd)
	if typ == unix.NFT_MSG_DELSETELEM {
		flags = flagsDel
	}
	e.begin(typ, flags, s.Table.Family, i)
	e.strz(unix.NFTA_SET_ELEM_LIST_TABLE, s.Table.Name)
	e.strz(unix.NFTA_SET_ELEM_LIST_SET, s.Name)
	if id := e.sets[s]; id != 0 {
		e.u32(unix.NFTA_SET_ELEM_LIST_SET_ID, id)
	}
	list := e.nest(unix.NFTA_SET_ELEM_LIST_ELEMENTS)
	for _, el := range elems {
		item := e.nest(unix.NFTA_LIST_ELEM)
		key := e.nest(unix.NFTA_SET_ELEM_KEY)
		e.attr(unix.NFTA_DATA_VALUE, el.Key)
		e.close(key)
		if s.IsMap && typ == unix.NFT_MSG_NEWSETELEM {
			data := e.nest(unix.NFTA_SET_ELEM_DATA)
			v := e.nest(unix.NFTA_DATA_VERDICT)
			code := jumpCode
			if el.Goto {
				code = gotoCode
			}
			e.u32(unix.NFTA_VERDICT_CODE, code)
			e.strz(unix.NFTA_VERDICT_CHAIN, el.Jump)
			e.close(v)
			e.close(data)
		}
		e.close(item)
	}
	e.close(list)
	e.end()
}

// jumpCode and gotoCode are a jump's and a goto's verdict codes as they
// are written: NFT_JUMP, -3, and NFT_GOTO, -4.
const (
	jumpCode = uint32(1<<32 + expr.VerdictJump)
	gotoCode = uint32(1<<32 + expr.VerdictGoto)
)

// The messages' framing: a netlink header, nftables' own (the family),
// then attributes, each padded to four bytes.

// flush moves the message written last into the chunks.
func (e *encoder) flush() {
	b := e.msg
	for len(b) > 0 {
		if len(e.out) == 0 || len(e.out[len(e.out)-1]) == chunkSize {
			e.out = append(e.out, make([]byte, 0, chunkSize))
		}
		c := &e.out[len(e.out)-1]
		n := min(len(b), chunkSize-len(*c))
		*c = append(*c, b[:n]...)
		b = b[n:]
	}
	e.size += len(e.msg)
	e.msg = e.msg[:0]
}

// header starts a message, after the one before is flushed.
func (e *encoder) header(typ, flags uint16) {
	e.flush()
	e.seq++
	e.msg = binary.NativeEndian.AppendUint32(e.msg, 0) // its length, set by end
	e.msg = binary.NativeEndian.AppendUint16(e.msg, typ)
	e.msg = binary.NativeEndian.AppendUint16(e.msg, flags)
	e.msg = binary.NativeEndian.AppendUint32(e.msg, e.seq)
	e.msg = binary.NativeEndian.AppendUint32(e.msg, 0)
}

// begin starts an nftables message of Op i.
func (e *encoder) begin(typ, flags uint16, family nftables.TableFamily, i int32) {
	e.header(unix.NFNL_SUBSYS_NFTABLES<<8|typ, flags)
	e.msg = append(e.msg, byte(family), unix.NFNETLINK_V0, 0, 0)
	e.ops = append(e.ops, i)
	e.last = e.seq
}

// end sets the length of the message being written.
func (e *encoder) end() {
	binary.NativeEndian.PutUint32(e.msg, uint32(len(e.msg)))
}

// batchMark writes the batch's begin or end.
func (e *encoder) batchMark(typ uint16) {
	e.header(typ, unix.NLM_F_REQUEST)
	e.msg = append(e.msg, unix.AF_UNSPEC, unix.NFNETLINK_V0)
	e.msg = binary.BigEndian.AppendUint16(e.msg, unix.NFNL_SUBSYS_NFTABLES)
	e.end()
}

// ackLast asks for the last operation's acknowledgement, while its
// message is still the one being written: its arrival says the kernel
// has processed the whole batch.
func (e *encoder) ackLast() {
	if len(e.ops) > 0 {
		flags := binary.NativeEndian.Uint16(e.msg[6:])
		binary.NativeEndian.PutUint16(e.msg[6:], flags|unix.NLM_F_ACK)
	}
}

// opOf is the Op the message with sequence number seq came from, -1 for
// the batch's begin or end.
func (e *encoder) opOf(first, seq uint32) int32 {
	if n := int(seq - first - 2); seq > first+1 && n < len(e.ops) {
		return e.ops[n]
	}
	return -1
}

func (e *encoder) attr(typ uint16, data []byte) {
	e.attrHeader(typ, len(data))
	e.msg = append(e.msg, data...)
	e.pad()
}

func (e *encoder) attrHeader(typ uint16, n int) {
	e.tooLong(unix.NLA_HDRLEN + n)
	e.msg = binary.NativeEndian.AppendUint16(e.msg, uint16(unix.NLA_HDRLEN+n))
	e.msg = binary.NativeEndian.AppendUint16(e.msg, typ)
}

func (e *encoder) pad() {
	for len(e.msg)%unix.NLA_ALIGNTO != 0 {
		e.msg = append(e.msg, 0)
	}
}

func (e *encoder) strz(typ uint16, s string) {
	e.attrHeader(typ, len(s)+1)
	e.msg = append(e.msg, s...)
	e.msg = append(e.msg, 0)
	e.pad()
}

func (e *encoder) u32(typ uint16, v uint32) {
	e.attrHeader(typ, 4)
	e.msg = binary.BigEndian.AppendUint32(e.msg, v)
}

func (e *encoder) u64(typ uint16, v uint64) {
	e.attrHeader(typ, 8)
	e.msg = binary.BigEndian.AppendUint64(e.msg, v)
}

// nest opens a nested attribute; close sets its length.
func (e *encoder) nest(typ uint16) int {
	start := len(e.msg)
	e.msg = binary.NativeEndian.AppendUint16(e.msg, 0)
	e.msg = binary.NativeEndian.AppendUint16(e.msg, typ|unix.NLA_F_NESTED)
	return start
}

func (e *encoder) close(start int) {
	n := len(e.msg) - start
	e.tooLong(n)
	binary.NativeEndian.PutUint16(e.msg[start:], uint16(n))
}

// tooLong notes an attribute of n bytes, with its header, when its
// 16-bit length cannot say it.
func (e *encoder) tooLong(n int) {
	if n > 0xffff && e.err == nil {
		e.err = fmt.Errorf("an attribute of %d bytes: longer than netlink's 65,535", n)
	}
}

// reply is what one datagram of the kernel's replies says.
type reply struct {
	done bool   // the last operation is acknowledged
	code int32  // a negative errno, 0 when none
	seq  uint32 // the message the error is about
	why  string // the kernel's own words, if any: ": …"
}

// reply reads a datagram of the kernel's replies to the batch: its
// errors (the first one found) and acknowledgements.
func (e *encoder) reply(b []byte) (reply, error) {
	var r reply
	for len(b) >= unix.NLMSG_HDRLEN {
		n := int(binary.NativeEndian.Uint32(b))
		if n < unix.NLMSG_HDRLEN || n > len(b) {
			return r, fmt.Errorf("a reply of %d bytes says it has %d", len(b), n)
		}
		m := b[:n]
		b = b[min(len(b), (n+unix.NLMSG_ALIGNTO-1)&^(unix.NLMSG_ALIGNTO-1)):]
		if binary.NativeEndian.Uint16(m[4:]) != unix.NLMSG_ERROR {
			continue
		}
		if n < unix.NLMSG_HDRLEN+4+unix.NLMSG_HDRLEN {
			return r, fmt.Errorf("an error message of %d bytes", n)
		}
		code := int32(binary.NativeEndian.Uint32(m[unix.NLMSG_HDRLEN:]))
		seq := binary.NativeEndian.Uint32(m[unix.NLMSG_HDRLEN+4+8:])
		if code != 0 {
			return reply{code: code, seq: seq, why: extack(m)}, nil
		}
		if seq == e.last {
			r.done = true
		}
	}
	return r, nil
}

// extack is an error message's own text (NLMSGERR_ATTR_MSG), as ": text".
func extack(m []byte) string {
	flags := binary.NativeEndian.Uint16(m[6:])
	if flags&unix.NLM_F_ACK_TLVS == 0 {
		return ""
	}
	off := unix.NLMSG_HDRLEN + 4 + unix.NLMSG_HDRLEN
	if flags&unix.NLM_F_CAPPED == 0 {
		off = unix.NLMSG_HDRLEN + 4 + int(binary.NativeEndian.Uint32(m[unix.NLMSG_HDRLEN+4:]))
	}
	for off+unix.NLA_HDRLEN <= len(m) {
		n := int(binary.NativeEndian.Uint16(m[off:]))
		if n < unix.NLA_HDRLEN || off+n > len(m) {
			return ""
		}
		if binary.NativeEndian.Uint16(m[off+2:])&^(unix.NLA_F_NESTED|unix.NLA_F_NET_BYTEORDER) == unix.NLMSGERR_ATTR_MSG {
			return ": " + strings.TrimRight(string(m[off+unix.NLA_HDRLEN:off+n]), "\x00")
		}
		off += (n + unix.NLA_ALIGNTO - 1) &^ (unix.NLA_ALIGNTO - 1)
	}
	return ""
}
