package policy

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"

	"github.com/twill-net/twill/nl/nft"
	"github.com/twill-net/twill/nl/nftsync"
)

// Table writes a Ruleset to the kernel's policy table.
type Table struct {
	// NetNS, when set, is the network namespace's file descriptor (the
	// caller's namespace when zero).
	NetNS int
	// Kernel, when set, is the kernel's nftables, in place of NetNS's.
	Kernel nft.Kernel

	once   sync.Once
	engine *nftsync.Engine
	mu     sync.Mutex // guards elems
	// elems are each set's elements as last rendered, and what from.
	elems map[string]renderedSet
}

type renderedSet struct {
	src   setSource
	elems []nft.Elem
}

// Changes counts what one Sync wrote; zero when the kernel was equal.
type Changes = nftsync.Changes

func (t *Table) eng() *nftsync.Engine {
	t.once.Do(func() {
		k := t.Kernel
		if k == nil {
			k = nft.Conn{NetNS: t.NetNS}
		}
		t.engine = &nftsync.Engine{Kernel: k, Family: nftables.TableFamilyINet, Name: TableName, Same: sameRules, SameSet: sameSet}
	})
	return t.engine
}

// sameRules says whether two chains' rules (a Chain's Rules, as a
// nftsync.Chain's Src) are equal, compared without rendering them.
func sameRules(a, b any) bool {
	x, ok := a.([]Rule)
	y, ok2 := b.([]Rule)
	if !ok || !ok2 {
		return false
	}
	if len(x) > 0 && len(x) == len(y) && &x[0] == &y[0] {
		return true // the same rules: Compiler kept the chain, and no one writes to a compiled chain
	}
	return slices.EqualFunc(x, y, sameRule)
}

// Sync makes the kernel's policy table equal to rs, writing only what
// differs, in one transaction: a reader sees the old table or the new one.
// It diffs against the table as it last wrote it, unless reread (a drift
// check), or its last write failed: then it reads the kernel's.
func (t *Table) Sync(rs Ruleset, reread bool) (Changes, error) {
	ch, err := t.eng().Sync(t.desired(rs), reread)
	if errors.Is(err, unix.EMSGSIZE) {
		rules, elems := rs.size()
		return Changes{}, fmt.Errorf("table inet %s, %d chains, %d rules and %d set elements, is larger than one nftables transaction can carry: "+
			"fewer pods, policies or peers would fit (%w)", TableName, len(rs.Chains), rules, elems, err)
	}
	if err != nil {
		return Changes{}, fmt.Errorf("table inet %s: %w", TableName, err)
	}
	return ch, nil
}

// size counts the ruleset's rules and set elements.
func (rs Ruleset) size() (rules, elems int) {
	for _, c := range rs.Chains {
		rules += len(c.Rules)
	}
	for _, s := range rs.Sets {
		elems += len(s.Elems)
	}
	return rules, elems
}

// desired is rs as the engine writes it: each chain rendered only when the
// engine must compare or write it, each set's elements only when they are
// not those rendered last time.
func (t *Table) desired(rs Ruleset) nftsync.Table {
	want := nftsync.Table{Chains: make([]nftsync.Chain, len(rs.Chains)), Sets: make([]nftsync.Set, len(rs.Sets))}
	for i, c := range rs.Chains {
		want.Chains[i] = nftsync.Chain{Name: c.Name, Hook: baseChain(c.Name), Src: c.Rules,
			Rules: func() ([]nftsync.Rule, error) { return renderRules(c), nil }}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	next := make(map[string]renderedSet, len(rs.Sets))
	for i, s := range rs.Sets {
		src := sourceOf(s)
		r, ok := t.elems[s.Name]
		if !ok || !sameSet(r.src, src) {
			r = renderedSet{src: src, elems: elements(s)}
		}
		next[s.Name] = r
		want.Sets[i] = nftsync.Set{Name: s.Name, KeyType: keyType(s.V6), Map: s.VMap, Elems: r.elems, Src: src}
	}
	t.elems = next
	return want
}

// setSource is a set's identity: its elements' and jumps' arrays (a
// compiled set is never written to), its family and kind.
type setSource struct {
	elems             *netip.Addr
	jumps             *string
	n                 int
	v6, verdict, goes bool
}

func sourceOf(s Set) setSource {
	src := setSource{n: len(s.Elems), v6: s.V6, verdict: s.VMap, goes: s.Goto}
	if len(s.Elems) > 0 {
		src.elems = &s.Elems[0]
	}
	if len(s.Jumps) > 0 {
		src.jumps = &s.Jumps[0]
	}
	return src
}

// sameSet says whether two sets' sources (setSource) are the same
// arrays: an empty set is never the same, and is compared.
func sameSet(a, b any) bool {
	x, ok := a.(setSource)
	y, ok2 := b.(setSource)
	return ok && ok2 && x.elems != nil && x == y
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

// Generation is nftables' generation: it moves with every commit, of any
// table and any writer.
func (t *Table) Generation() (uint32, error) { return t.eng().Kernel.Generation() }

// Delete removes the policy table if it exists, and says whether it did.
func (t *Table) Delete() (bool, error) { return t.eng().Delete() }

// readKernel reads the kernel's table as it is now (not as last written).
func (t *Table) readKernel() (*nftsync.State, error) { return t.eng().Read() }

// Counters sums the packet counters of the table's rules by comment
// ("allow ns/name", "deny ns/pod", "unknown source", …).
func (t *Table) Counters() (map[string]uint64, error) {
	ks, err := t.readKernel()
	if err != nil {
		return nil, err
	}
	out := map[string]uint64{}
	for _, c := range ks.Chains {
		for _, r := range c.Rules {
			if r.Comment != "" {
				out[r.Comment] += r.Packets
			}
		}
	}
	return out, nil
}

var errNoNFTables = errors.New("the kernel has no nf_tables")

// Supported says whether the kernel speaks nf_tables.
func (t *Table) Supported() error {
	if _, err := t.eng().Kernel.Tables(); err != nil {
		if errors.Is(err, unix.EPROTONOSUPPORT) || errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("%w: %w", errNoNFTables, err)
		}
		return err
	}
	return nil
}

// Isolated reads, from the kernel's table, the local pods a policy of
// either API selects and the policies that select each (namespace/name;
// a ClusterNetworkPolicy as ClusterNetworkPolicy/<name>): what `twillctl
// status` shows. exists is false when there is no table (enforcement off).
func (t *Table) Isolated() (pods map[string]Selection, exists bool, err error) {
	ks, err := t.readKernel()
	if err != nil || !ks.Exists {
		return nil, false, err
	}
	// A pod's key, in full, from its default deny's comment (in its
	// chain, or its rest chain): its chain's name is cut when long.
	keys := map[string]string{}
	for _, c := range ks.Chains {
		for _, r := range c.Rules {
			for _, dir := range []string{"in", "eg"} {
				if key, ok := strings.CutPrefix(r.Comment, denyComment(dir, "")); ok {
					keys[ChainName(dir, key)] = key
				}
			}
		}
	}
	selectedBy := func(c *nftsync.ChainState) []string {
		var by []string
		for _, r := range c.Rules {
			if p, ok := strings.CutPrefix(r.Comment, SelectedBy); ok {
				by = append(by, p)
			}
		}
		return by
	}
	pods = map[string]Selection{}
	for name, c := range ks.Chains {
		by := selectedBy(c)
		for _, r := range c.Rules { // the policies of its shared Admin chain
			if shared, ok := strings.CutPrefix(r.Comment, AdminTier); ok && ks.Chains[shared] != nil {
				by = append(by, selectedBy(ks.Chains[shared])...)
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
