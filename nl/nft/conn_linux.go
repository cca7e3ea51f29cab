package nft

import (
	"encoding/binary"
	"errors"
	"fmt"

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
				st.Elems[i].Jump = elementJump(e.Val)
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

// Apply commits the batch in one transaction.
func (c Conn) Apply(b *Batch) error {
	if b.Len() == 0 {
		return nil
	}
	conn, err := c.dial()
	if err != nil {
		return err
	}
	for _, op := range b.Ops {
		if err := queue(conn, op); err != nil {
			return err
		}
	}
	return conn.Flush()
}

// queue hands op to the library's connection.
func queue(conn *nftables.Conn, op Op) error {
	switch op.Kind {
	case AddTable, DelTable:
		queueTable(conn, op)
	case AddChain, FlushChain, DelChain:
		queueChain(conn, op)
	case AddRule:
		conn.AddRule(op.Rule)
	case DelRule:
		return conn.DelRule(op.Rule)
	case AddSet, DelSet, AddElems, DelElems:
		return queueSet(conn, op)
	default:
		return fmt.Errorf("nftables batch: unknown operation %d", op.Kind)
	}
	return nil
}

func queueTable(conn *nftables.Conn, op Op) {
	if op.Kind == AddTable {
		conn.AddTable(op.Table)
		return
	}
	conn.DelTable(op.Table)
}

func queueChain(conn *nftables.Conn, op Op) {
	switch op.Kind {
	case AddChain:
		conn.AddChain(op.Chain)
	case FlushChain:
		conn.FlushChain(op.Chain)
	default:
		conn.DelChain(op.Chain)
	}
}

// queueSet hands a set's operation to the library, which encodes the
// elements as it queues them: in messages of at most elemsPerMessage
// bytes of elements each.
func queueSet(conn *nftables.Conn, op Op) error {
	var err error
	switch op.Kind {
	case AddSet:
		chunks := chunked(op.Elems)
		err = conn.AddSet(op.Set, elements(op.Set, chunks[0]))
		for _, c := range chunks[1:] {
			if err == nil {
				err = conn.SetAddElements(op.Set, elements(op.Set, c))
			}
		}
	case AddElems:
		for _, c := range chunked(op.Elems) {
			if err == nil {
				err = conn.SetAddElements(op.Set, elements(op.Set, c))
			}
		}
	case DelElems:
		for _, c := range chunked(op.Elems) {
			if err == nil {
				err = conn.SetDeleteElements(op.Set, elements(&nftables.Set{}, c))
			}
		}
	default:
		conn.DelSet(op.Set)
	}
	if err != nil {
		return fmt.Errorf("queueing set %s: %w", op.Set.Name, err)
	}
	return nil
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

// elements is elems as the library writes them into s: a verdict map's
// with their jump.
func elements(s *nftables.Set, elems []Elem) []nftables.SetElement {
	out := make([]nftables.SetElement, len(elems))
	for i, e := range elems {
		out[i] = nftables.SetElement{Key: e.Key}
		if s.IsMap {
			out[i].VerdictData = &expr.Verdict{Kind: expr.VerdictJump, Chain: e.Jump}
		}
	}
	return out
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

// Generation reads nftables' generation; only in the caller's namespace.
func (c Conn) Generation() (uint32, error) {
	if c.NetNS != 0 {
		return 0, fmt.Errorf("reading nftables' generation in another network namespace: %w", errors.ErrUnsupported)
	}
	return nl.NftGeneration()
}
