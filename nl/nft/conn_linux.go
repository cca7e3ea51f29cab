package nft

import (
	"encoding/binary"
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/twill-net/twill/nl"
)

// Conn is the kernel's nftables, through netlink. Each call opens its own
// socket.
type Conn struct {
	// NetNS, when set, is the network namespace's file descriptor (the
	// caller's namespace when zero).
	NetNS int
}

var _ Kernel = Conn{}

// bufferSize bounds one transaction and one dump: a node's whole policy
// table, thousands of rules and tens of thousands of set elements, goes in
// one message, which the socket's default buffer (rmem/wmem_max) is too
// small for. Forcing a larger one takes CAP_NET_ADMIN, as writing does;
// without it the default stands.
const bufferSize = 64 << 20

func (c Conn) dial() (*nftables.Conn, error) {
	opts := []nftables.ConnOption{nftables.WithSockOptions(bigBuffers)}
	if c.NetNS != 0 {
		opts = append(opts, nftables.WithNetNSFd(c.NetNS))
	}
	conn, err := nftables.New(opts...)
	if err != nil {
		return nil, fmt.Errorf("opening nftables: %w", err)
	}
	return conn, nil
}

func bigBuffers(c *netlink.Conn) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	err = rc.Control(func(fd uintptr) {
		for _, opt := range []int{unix.SO_SNDBUFFORCE, unix.SO_RCVBUFFORCE} {
			if e := unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, opt, bufferSize); e != nil && !errors.Is(e, unix.EPERM) && serr == nil {
				serr = fmt.Errorf("setting the nftables socket's buffer: %w", e)
			}
		}
	})
	return errors.Join(err, serr)
}

// Tables lists every table of every family.
func (c Conn) Tables() ([]*nftables.Table, error) {
	return list(c, "tables", (*nftables.Conn).ListTables)
}

// Chains lists every chain of every table.
func (c Conn) Chains() ([]*nftables.Chain, error) {
	return list(c, "chains", (*nftables.Conn).ListChains)
}

// list opens nftables and lists what f lists, named what in an error.
func list[T any](c Conn, what string, f func(*nftables.Conn) ([]T, error)) ([]T, error) {
	conn, err := c.dial()
	if err != nil {
		return nil, err
	}
	out, err := f(conn)
	if err != nil {
		return nil, fmt.Errorf("listing nftables %s: %w", what, err)
	}
	return out, nil
}

// Table reads one table whole, nil when there is none.
func (c Conn) Table(family nftables.TableFamily, name string) (*Table, error) {
	conn, err := c.dial()
	if err != nil {
		return nil, err
	}
	what := fmt.Sprintf("table %s %s", FamilyName(family), name)
	tables, err := conn.ListTablesOfFamily(family)
	if err != nil {
		return nil, fmt.Errorf("listing nftables tables: %w", err)
	}
	var out *Table
	for _, t := range tables {
		if t.Name == name {
			out = &Table{Table: t}
		}
	}
	if out == nil {
		return nil, nil
	}
	chains, err := conn.ListChainsOfTableFamily(family)
	if err != nil {
		return nil, fmt.Errorf("listing the chains of %s: %w", what, err)
	}
	for _, ch := range chains {
		if ch.Table.Name != name {
			continue
		}
		rules, err := conn.GetRules(ch.Table, ch)
		if err != nil {
			return nil, fmt.Errorf("listing the rules of chain %s in %s: %w", ch.Name, what, err)
		}
		out.Chains = append(out.Chains, Chain{Chain: ch, Rules: rules})
	}
	sets, err := conn.GetSets(out.Table)
	if err != nil {
		return nil, fmt.Errorf("listing the sets of %s: %w", what, err)
	}
	for _, s := range sets {
		elems, err := conn.GetSetElements(s)
		if err != nil {
			return nil, fmt.Errorf("listing set %s of %s: %w", s.Name, what, err)
		}
		st := Set{Set: s, Elems: make([]Elem, len(elems))}
		for i, e := range elems {
			st.Elems[i] = Elem{Key: e.Key}
			if s.IsMap {
				st.Elems[i].Jump, st.Elems[i].Goto = elementJump(e.Val)
			}
		}
		out.Sets = append(out.Sets, st)
	}
	return out, nil
}

// Rules reads one chain's rules.
func (c Conn) Rules(t *nftables.Table, chain string) ([]*nftables.Rule, error) {
	conn, err := c.dial()
	if err != nil {
		return nil, err
	}
	rules, err := conn.GetRules(t, &nftables.Chain{Table: t, Name: chain})
	if err != nil {
		return nil, fmt.Errorf("listing the rules of chain %s in table %s %s: %w", chain, FamilyName(t.Family), t.Name, err)
	}
	return rules, nil
}

// Apply commits the batch in one transaction: encoded (encoder), sent in
// one system call, and done when the kernel acknowledges its last
// operation, or failed at the first error the kernel reports.
func (c Conn) Apply(b *Batch) error {
	if b.Len() == 0 {
		return nil
	}
	enc, err := encode(b, firstSeq)
	if err != nil || len(enc.ops) == 0 {
		return err
	}
	conn, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: c.NetNS})
	if err != nil {
		return fmt.Errorf("opening nftables: %w", err)
	}
	defer conn.Close()
	if err := bigBuffers(conn); err != nil {
		return err
	}
	// Errors name the operation by their header alone, and say why.
	_ = conn.SetOption(netlink.CapAcknowledge, true)
	_ = conn.SetOption(netlink.ExtendedAcknowledge, true)
	rc, err := conn.SyscallConn()
	if err != nil {
		return fmt.Errorf("opening nftables: %w", err)
	}
	var serr error
	err = rc.Write(func(fd uintptr) bool {
		_, serr = unix.SendmsgBuffers(int(fd), enc.out, nil, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}, 0)
		return serr != unix.EAGAIN
	})
	if err = errors.Join(err, serr); err != nil {
		return fmt.Errorf("sending an nftables transaction of %d messages, %d bytes: %w", len(enc.ops), enc.size, err)
	}
	return acknowledged(conn, rc, enc, b)
}

// firstSeq numbers a batch's messages: the begin is firstSeq+1.
const firstSeq = 1 << 20

// ackTimeout bounds the wait for the kernel's acknowledgement, which it
// queues before the send returns.
const ackTimeout = 30 * time.Second

// acknowledged reads the kernel's replies to enc until the last
// operation's acknowledgement, or an error.
func acknowledged(conn *netlink.Conn, rc syscall.RawConn, enc *encoder, b *Batch) error {
	if err := conn.SetReadDeadline(time.Now().Add(ackTimeout)); err != nil {
		return fmt.Errorf("reading nftables' acknowledgement: %w", err)
	}
	buf := make([]byte, 64<<10)
	for range len(enc.ops) + 3 {
		var n int
		var rerr error
		err := rc.Read(func(fd uintptr) bool {
			n, _, rerr = unix.Recvfrom(int(fd), buf, 0)
			return rerr != unix.EAGAIN
		})
		if err = errors.Join(err, rerr); err != nil {
			return fmt.Errorf("reading nftables' acknowledgement: %w", err)
		}
		r, err := enc.reply(buf[:n])
		if err != nil {
			return fmt.Errorf("reading nftables' acknowledgement: %w", err)
		}
		if r.code != 0 {
			return fmt.Errorf("nftables refused the transaction at %s: %w%s", describe(b, enc.opOf(firstSeq, r.seq)), unix.Errno(-r.code), r.why)
		}
		if r.done {
			return nil
		}
	}
	return errors.New("reading nftables' acknowledgement: more replies than messages sent")
}

// describe names a batch's operation i (-1: the batch itself) in an error.
func describe(b *Batch, i int32) string {
	if i < 0 || int(i) >= len(b.Ops) {
		return "its start"
	}
	op := b.Ops[i]
	table := fmt.Sprintf("table %s %s", FamilyName(op.Table.Family), op.Table.Name)
	what := map[OpKind]string{AddTable: "adding", DelTable: "deleting", AddChain: "adding chain", FlushChain: "flushing chain",
		DelChain: "deleting chain", AddRule: "adding a rule to chain", DelRule: "deleting a rule of chain", AddSet: "adding set",
		DelSet: "deleting set", AddElems: "adding elements to set", DelElems: "deleting elements of set"}[op.Kind]
	switch {
	case op.Set != nil:
		what += " " + op.Set.Name + " of"
	case op.Chain != nil:
		what += " " + op.Chain.Name + " of"
	}
	return fmt.Sprintf("operation %d (%s %s)", i, what, table)
}

// elemsPerMessage bounds the elements' bytes in one message. Their list
// is one netlink attribute, whose length is 16 bits: the kernel reads a
// longer one cut at 64 KiB, and takes the first elements alone, without
// an error.
const elemsPerMessage = 16 << 10

// chunked splits elems into runs of at most elemsPerMessage bytes as
// encoded (an element's key and jump, and its attributes' headers, 64
// bytes at most); there is always one run, empty or not.
func chunked(elems []Elem) [][]Elem {
	out := [][]Elem{nil}
	size := 0
	for i, e := range elems {
		n := len(e.Key) + len(e.Jump) + 64
		if size+n > elemsPerMessage && size > 0 {
			out = append(out, nil)
			size = 0
		}
		out[len(out)-1] = append(out[len(out)-1], elems[i])
		size += n
	}
	return out
}

// elementJump reads the chain a verdict map's element jumps or goes to,
// and whether it goes, from the element's data as the library hands it
// over (the verdict's attributes).
func elementJump(val []byte) (string, bool) {
	ad, err := netlink.NewAttributeDecoder(val)
	if err != nil {
		return "", false
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
	switch {
	case ad.Err() != nil:
	case int32(code) == int32(expr.VerdictJump):
		return chain, false
	case int32(code) == int32(expr.VerdictGoto):
		return chain, true
	}
	return "?", false // equals no wanted jump
}

// Generation reads nftables' generation; only in the caller's namespace.
func (c Conn) Generation() (uint32, error) {
	if c.NetNS != 0 {
		return 0, fmt.Errorf("reading nftables' generation in another network namespace: %w", errors.ErrUnsupported)
	}
	return nl.NftGeneration()
}
