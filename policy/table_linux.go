package policy

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Table writes a Ruleset to the kernel's policy table.
type Table struct {
	// NetNS, when set, is the network namespace's file descriptor (the
	// caller's namespace when zero).
	NetNS int

	mu     sync.Mutex
	cached *kernelState // guarded by mu: the table as last written, nil to read it
}

// Changes counts what one Sync wrote; zero when the kernel was equal.
type Changes struct {
	Full                     bool // the table was (re)created
	Chains, Elems, Sets, Del int
}

// Clean says nothing was written.
func (c Changes) Clean() bool { return c == Changes{} }

func (t *Table) dial() (*nftables.Conn, error) {
	opts := []nftables.ConnOption{nftables.WithSockOptions(bigBuffers)}
	if t.NetNS != 0 {
		opts = append(opts, nftables.WithNetNSFd(t.NetNS))
	}
	c, err := nftables.New(opts...)
	if err != nil {
		return nil, fmt.Errorf("opening nftables: %w", err)
	}
	return c, nil
}

// bufferSize bounds one transaction and one dump: a node's whole table,
// thousands of rules and tens of thousands of set elements, goes in one
// message, which the socket's default buffer (rmem/wmem_max) is too small
// for. twilld runs as root, which may force a larger buffer.
const bufferSize = 64 << 20

func bigBuffers(c *netlink.Conn) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	err = rc.Control(func(fd uintptr) {
		for _, opt := range []int{unix.SO_SNDBUFFORCE, unix.SO_RCVBUFFORCE} {
			if e := unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, opt, bufferSize); e != nil && serr == nil {
				serr = fmt.Errorf("setting the nftables socket's buffer: %w", e)
			}
		}
	})
	return errors.Join(err, serr)
}

type kernelRule struct {
	handle  uint64
	comment string
	fp      []byte
	packets uint64
}

type kernelState struct {
	exists bool
	bases  map[string]*nftables.Chain // the base chains it holds
	chains map[string][]kernelRule
	sets   map[string]*kernelSetState
	// rules, in the table as last written (model), are its chains' rules
	// as written, compared without rendering them.
	rules map[string][]Rule
}

type kernelSetState struct {
	set   *nftables.Set
	vmap  bool
	elems map[netip.Addr]string // a verdict map's element → its jump; "" in a set
}

// read returns the policy table as the kernel holds it.
func read(conn *nftables.Conn) (kernelState, error) {
	ks := kernelState{chains: map[string][]kernelRule{}, sets: map[string]*kernelSetState{}, bases: map[string]*nftables.Chain{}}
	tables, err := conn.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		return ks, fmt.Errorf("listing nftables tables: %w", err)
	}
	if !slices.ContainsFunc(tables, func(t *nftables.Table) bool { return t.Name == TableName }) {
		return ks, nil
	}
	ks.exists = true
	chains, err := conn.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		return ks, fmt.Errorf("listing nftables chains: %w", err)
	}
	for _, c := range chains {
		if c.Table.Name != TableName {
			continue
		}
		if IsBase(c.Name) {
			ks.bases[c.Name] = c
		}
		rules, err := conn.GetRules(c.Table, c)
		if err != nil {
			return ks, fmt.Errorf("listing the rules of chain inet %s %s: %w", TableName, c.Name, err)
		}
		krs := []kernelRule{}
		for _, r := range rules {
			kr := kernelRule{handle: r.Handle}
			kr.comment, _ = userdata.GetString(r.UserData, userdata.TypeComment)
			if kr.fp, err = fingerprint(r.Exprs); err != nil {
				kr.fp = []byte("unreadable") // equals no wanted rule
			}
			for _, e := range r.Exprs {
				if c, ok := e.(*expr.Counter); ok {
					kr.packets = c.Packets
				}
			}
			krs = append(krs, kr)
		}
		ks.chains[c.Name] = krs
	}
	sets, err := conn.GetSets(table())
	if err != nil {
		return ks, fmt.Errorf("listing the sets of table inet %s: %w", TableName, err)
	}
	for _, s := range sets {
		elems, err := conn.GetSetElements(s)
		if err != nil {
			return ks, fmt.Errorf("listing set %s: %w", s.Name, err)
		}
		st := &kernelSetState{set: s, vmap: s.IsMap, elems: map[netip.Addr]string{}}
		for _, e := range elems {
			if a, ok := netip.AddrFromSlice(e.Key); ok {
				st.elems[a] = ""
				if s.IsMap {
					st.elems[a] = elementJump(e.Val)
				}
			}
		}
		ks.sets[s.Name] = st
	}
	return ks, nil
}

// baseChainsOK says whether the kernel holds every base chain, hooked as
// baseChain says (a table written by an older twilld may lack one).
func baseChainsOK(ks kernelState) bool {
	for _, name := range BaseChains {
		c, want := ks.bases[name], baseChain(name)
		if c == nil || c.Hooknum == nil || *c.Hooknum != *want.Hooknum || c.Priority == nil || *c.Priority != *want.Priority ||
			c.Type != want.Type || c.Policy == nil || *c.Policy != *want.Policy {
			return false
		}
	}
	return true
}

type wantRule struct {
	rule *nftables.Rule
	fp   []byte
	cmt  string
}

func wantRules(c Chain) ([]wantRule, error) {
	out := make([]wantRule, len(c.Rules))
	for i, r := range c.Rules {
		es := ruleExprs(r)
		fp, err := fingerprint(es)
		if err != nil {
			return nil, fmt.Errorf("rendering chain %s rule %d: %w", c.Name, i, err)
		}
		out[i] = wantRule{rule: &nftables.Rule{Table: table(), Exprs: es, UserData: comment(r.Comment)}, fp: fp, cmt: r.Comment}
	}
	return out, nil
}

// Sync makes the kernel's policy table equal to rs, writing only what
// differs, in one transaction: a reader sees the old table or the new one.
// It diffs against the table as it last wrote it, unless reread (a drift
// check), or its last write failed: then it reads the kernel's.
func (t *Table) Sync(rs Ruleset, reread bool) (Changes, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	conn, err := t.dial()
	if err != nil {
		return Changes{}, err
	}
	ks := t.cached
	if reread || ks == nil {
		t.cached = nil
		k, err := read(conn)
		if err != nil {
			return Changes{}, err
		}
		ks = &k
	}
	var ch Changes
	if !ks.exists || !baseChainsOK(*ks) || setTypesDiffer(*ks, rs) {
		ch, err = writeAll(conn, rs)
	} else {
		ch, err = writeDiff(conn, *ks, rs)
	}
	if err != nil {
		return Changes{}, err
	}
	if !ch.Clean() {
		if err := conn.Flush(); err != nil {
			t.cached = nil
			if ch.Full {
				return Changes{}, fmt.Errorf("writing table inet %s: %w", TableName, err)
			}
			// A diff the kernel refused (the batch is all or nothing):
			// the whole table once more, in one transaction.
			if ch, err = t.rewrite(conn, rs, err); err != nil {
				return Changes{}, err
			}
		}
	}
	t.cached, err = model(rs)
	return ch, err
}

// rewrite writes the whole table after the kernel refused a diff (why).
func (t *Table) rewrite(conn *nftables.Conn, rs Ruleset, why error) (Changes, error) {
	ch, err := writeAll(conn, rs)
	if err == nil {
		err = conn.Flush()
	}
	if err != nil {
		return Changes{}, fmt.Errorf("writing table inet %s: %w (the change alone was refused too: %v)", TableName, err, why)
	}
	return ch, nil
}

// model is the kernel's table once rs is written.
func model(rs Ruleset) (*kernelState, error) {
	ks := &kernelState{exists: true, bases: map[string]*nftables.Chain{}, chains: map[string][]kernelRule{}, sets: map[string]*kernelSetState{}, rules: map[string][]Rule{}}
	for _, name := range BaseChains {
		ks.bases[name] = baseChain(name)
	}
	for _, c := range rs.Chains {
		ks.chains[c.Name] = nil
		ks.rules[c.Name] = c.Rules
	}
	for _, s := range rs.Sets {
		st := &kernelSetState{set: kernelSet(s), vmap: s.VMap, elems: make(map[netip.Addr]string, len(s.Elems))}
		for i, a := range s.Elems {
			st.elems[a] = s.jump(i)
		}
		ks.sets[s.Name] = st
	}
	return ks, nil
}

// sameRule compares two rules field by field.
func sameRule(a, b Rule) bool {
	return sameAddr(a.Src, b.Src) && sameAddr(a.Dst, b.Dst) && a.V6 == b.V6 && a.Established == b.Established &&
		a.Proto == b.Proto && a.NeighbourDiscovery == b.NeighbourDiscovery && a.PortLo == b.PortLo && a.PortHi == b.PortHi && a.Counter == b.Counter &&
		a.Verdict == b.Verdict && a.Target == b.Target && a.Comment == b.Comment && a.Log == b.Log &&
		a.Sample == b.Sample && a.Limit == b.Limit && a.LimitOver == b.LimitOver
}

func sameAddr(a, b Addr) bool {
	return a.Set == b.Set && a.Prefix == b.Prefix && a.NotSet == b.NotSet && a.NotSetV == b.NotSetV && slices.Equal(a.Except, b.Except) &&
		a.VMap == b.VMap
}

// setTypesDiffer says whether a set the kernel holds is of another kind
// or key type than wanted (a set cannot change either). The library reads
// a verdict map's key type as "verdict": a map's family is its name's.
func setTypesDiffer(ks kernelState, rs Ruleset) bool {
	for _, s := range rs.Sets {
		if k := ks.sets[s.Name]; k != nil && (k.vmap != s.VMap || !s.VMap && k.set.KeyType.Name != kernelSet(s).KeyType.Name) {
			return true
		}
	}
	return false
}

// Delete removes the policy table if it exists, and says whether it did.
func (t *Table) Delete() (bool, error) {
	conn, err := t.dial()
	if err != nil {
		return false, err
	}
	ks, err := read(conn)
	if err != nil || !ks.exists {
		return false, err
	}
	conn.DelTable(table())
	t.mu.Lock()
	t.cached = nil
	t.mu.Unlock()
	if err := conn.Flush(); err != nil {
		return false, fmt.Errorf("deleting table inet %s: %w", TableName, err)
	}
	return true, nil
}

// readKernel reads the kernel's table as it is now (not as last written).
func (t *Table) readKernel() (kernelState, error) {
	conn, err := t.dial()
	if err != nil {
		return kernelState{}, err
	}
	return read(conn)
}

// Counters sums the packet counters of the table's rules by comment
// ("allow ns/name", "deny ns/pod", "unknown source", …).
func (t *Table) Counters() (map[string]uint64, error) {
	ks, err := t.readKernel()
	if err != nil {
		return nil, err
	}
	out := map[string]uint64{}
	for _, rules := range ks.chains {
		for _, r := range rules {
			if r.comment != "" {
				out[r.comment] += r.packets
			}
		}
	}
	return out, nil
}

var errNoNFTables = errors.New("the kernel has no nf_tables")

// Supported says whether the kernel speaks nf_tables.
func (t *Table) Supported() error {
	conn, err := t.dial()
	if err != nil {
		return err
	}
	if _, err := conn.ListTablesOfFamily(nftables.TableFamilyINet); err != nil {
		if errors.Is(err, unix.EPROTONOSUPPORT) || errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("%w: %w", errNoNFTables, err)
		}
		return fmt.Errorf("listing nftables tables: %w", err)
	}
	return nil
}

// Isolated reads, from the kernel's table, the local pods a policy of
// either API selects and the policies that select each (namespace/name;
// a ClusterNetworkPolicy as ClusterNetworkPolicy/<name>): what `twillctl
// status` shows. exists is false when there is no table (enforcement off).
func (t *Table) Isolated() (pods map[string]Selection, exists bool, err error) {
	conn, err := t.dial()
	if err != nil {
		return nil, false, err
	}
	ks, err := read(conn)
	if err != nil || !ks.exists {
		return nil, false, err
	}
	// A pod's key, in full, from its default deny's comment (in its
	// chain, or its rest chain): its chain's name is cut when long.
	keys := map[string]string{}
	for _, rules := range ks.chains {
		for _, r := range rules {
			for _, dir := range []string{"in", "eg"} {
				if key, ok := strings.CutPrefix(r.comment, denyComment(dir, "")); ok {
					keys[ChainName(dir, key)] = key
				}
			}
		}
	}
	pods = map[string]Selection{}
	for name, rules := range ks.chains {
		var by []string
		for _, r := range rules {
			if p, ok := strings.CutPrefix(r.comment, SelectedBy); ok {
				by = append(by, p)
			}
		}
		dir, key, _ := strings.Cut(name, ":")
		if len(by) == 0 || dir != "in" && dir != "eg" {
			continue // a base chain, or a rest chain
		}
		if full, ok := keys[name]; ok {
			key = full
		}
		s := pods[key]
		if dir == "in" {
			s.Ingress = by
		} else {
			s.Egress = by
		}
		pods[key] = s
	}
	return pods, true, nil
}
