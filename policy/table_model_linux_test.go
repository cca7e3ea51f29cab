package policy

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"

	"github.com/twill-net/twill/nl/nft"
	"github.com/twill-net/twill/nl/nlfake"
)

// modelNode is a Table writing into a modelled kernel.
type modelNode struct {
	t  *testing.T
	k  *nlfake.Nftables
	tb *Table
}

func newModelNode(t *testing.T) *modelNode {
	k := &nlfake.Nftables{}
	return &modelNode{t: t, k: k, tb: &Table{Kernel: k}}
}

func (n *modelNode) sync(s Snapshot, reread bool) Changes {
	n.t.Helper()
	ch, err := n.tb.Sync(Compile(s).Ruleset, reread)
	if err != nil {
		n.t.Fatalf("Sync: %v", err)
	}
	return ch
}

// behind applies a batch to the kernel as another writer would.
func (n *modelNode) behind(queue func(b *nft.Batch, t *nftables.Table)) {
	n.t.Helper()
	var b nft.Batch
	queue(&b, &nftables.Table{Family: nftables.TableFamilyINet, Name: TableName})
	if err := n.k.Apply(&b); err != nil {
		n.t.Fatal(err)
	}
}

// drifted is what Drifted finds of the whole table.
func (n *modelNode) drifted(s Snapshot) []string {
	n.t.Helper()
	rs := Compile(s).Ruleset
	d, err := n.tb.Drifted(rs, rs)
	if err != nil {
		n.t.Fatal(err)
	}
	return d
}

// The write path, on a modelled kernel: what each change writes, and that
// the table read back equals what was wanted after each.
func TestTableWritesOnlyWhatChanged(t *testing.T) {
	n := newModelNode(t)
	s := snapshot()
	if ch := n.sync(s, false); !ch.Full {
		t.Errorf("first Sync = %+v, want the table written whole", ch)
	}
	gen, _ := n.k.Generation()
	if ch := n.sync(s, false); !ch.Clean() {
		t.Errorf("second Sync of the same state wrote %+v", ch)
	}
	if ch := n.sync(s, true); !ch.Clean() {
		t.Errorf("Sync of the kernel's table, unchanged, wrote %+v", ch)
	}
	if again, _ := n.k.Generation(); again != gen {
		t.Errorf("Syncs of an unchanged table committed %d transactions", again-gen)
	}
	s.Policies = append(s.Policies, testPolicy("y", "deny", nil, nil))
	if ch := n.sync(s, false); ch.Full || ch.Chains == 0 {
		t.Errorf("Sync after a new policy wrote %+v, want y/a's chains alone", ch)
	}
	s.Policies = append(s.Policies, testPolicy("y", "from-x", nil, func(sp *networkingv1NetworkPolicySpec) {
		sp.Ingress = fromNamespaces("x")
	}))
	n.sync(s, false)
	s.Pods = append(s.Pods, testPod("x", "late", "n1", "10.244.1.4", nil))
	if ch := n.sync(s, false); ch != (Changes{Elems: 2}) {
		t.Errorf("Sync after a new pod wrote %+v, want two set elements and nothing else", ch)
	}
	if d := n.drifted(s); len(d) != 0 {
		t.Errorf("the kernel's table differs from the wanted one: %v", d)
	}
	isolated, exists, err := n.tb.Isolated()
	if err != nil || !exists || !slices.Equal(isolated["y/a"].Ingress, []string{"y/deny", "y/from-x"}) {
		t.Errorf("Isolated() = %+v, %v, %v; want y/a isolated by y/deny and y/from-x", isolated, exists, err)
	}
	// The policies go: their chains and y/a's jumps are deleted.
	s.Policies = nil
	if ch := n.sync(s, false); ch.Del == 0 {
		t.Errorf("Sync after the policies went wrote %+v, want chains deleted", ch)
	}
	if d := n.drifted(s); len(d) != 0 {
		t.Errorf("after the policies went, the table differs: %v", d)
	}
	if isolated, _, _ := n.tb.Isolated(); len(isolated) != 0 {
		t.Errorf("pods isolated with no policy: %v", isolated)
	}
}

// Drift, on a modelled kernel: Drifted names it, a Sync that rereads the
// kernel repairs exactly it, and a change the kernel refuses (the table
// changed behind a Sync that trusts its last write) is written whole.
func TestTableRepairsDrift(t *testing.T) {
	n := newModelNode(t)
	s := snapshot(testPolicy("y", "deny", nil, nil))
	n.sync(s, false)
	n.behind(func(b *nft.Batch, t *nftables.Table) {
		b.FlushChain(&nftables.Chain{Table: t, Name: ChainName("in", "y/a")})
	})
	n.behind(func(b *nft.Batch, t *nftables.Table) {
		b.DelElems(&nftables.Set{Table: t, Name: JumpMap("in", false), IsMap: true}, []nft.Elem{{Key: []byte{10, 244, 1, 3}}})
	})
	d := n.drifted(s)
	if !slices.Contains(d, "chain "+ChainName("in", "y/a")) || !slices.Contains(d, "set jump-in-4") {
		t.Errorf("drifted %v, want y/a's chain and its jump", d)
	}
	if ch := n.sync(s, true); ch != (Changes{Chains: 1, Elems: 1}) {
		t.Errorf("the repair wrote %+v, want the chain and the element", ch)
	}
	if d := n.drifted(s); len(d) != 0 {
		t.Errorf("after the repair: drifted %v", d)
	}

	// y/a's jump deleted behind the Sync's back, then y/a goes: deleting
	// the jump is refused, and the table is written whole.
	n.behind(func(b *nft.Batch, t *nftables.Table) {
		b.DelElems(&nftables.Set{Table: t, Name: JumpMap("in", false), IsMap: true}, []nft.Elem{{Key: []byte{10, 244, 1, 3}}})
	})
	s.Pods = slices.DeleteFunc(slices.Clone(s.Pods), func(p *corev1.Pod) bool { return p.Namespace == "y" && p.Name == "a" })
	if ch := n.sync(s, false); !ch.Full {
		t.Errorf("a change the kernel refused wrote %+v, want the table whole", ch)
	}
	if d := n.drifted(s); len(d) != 0 {
		t.Errorf("after the rewrite: drifted %v", d)
	}
	// Base chain hooked otherwise: the table is written afresh.
	n.behind(func(b *nft.Batch, t *nftables.Table) {
		b.DelChain(&nftables.Chain{Table: t, Name: ChainInput})
	})
	if ch := n.sync(s, true); !ch.Full {
		t.Errorf("a base chain gone: Sync wrote %+v, want the table whole", ch)
	}
}

// Counters read the rules' packet counters by comment; Delete removes the
// table once; Supported holds on a kernel with nf_tables.
func TestTableCountersAndDelete(t *testing.T) {
	n := newModelNode(t)
	if err := n.tb.Supported(); err != nil {
		t.Fatal(err)
	}
	s := snapshot(testPolicy("y", "deny", nil, nil))
	n.sync(s, false)
	n.k.Count(denyComment("in", "y/a"), 7)
	c, err := n.tb.Counters()
	if err != nil || c[denyComment("in", "y/a")] != 7 {
		t.Errorf("Counters() = %v, %v; want 7 packets for %q", c, err, denyComment("in", "y/a"))
	}
	for i, want := range []bool{true, false} {
		if ok, err := n.tb.Delete(); ok != want || err != nil {
			t.Fatalf("Delete #%d = %v, %v; want %v", i+1, ok, err, want)
		}
	}
	if _, exists, err := n.tb.Isolated(); exists || err != nil {
		t.Errorf("Isolated after Delete: exists %v (%v)", exists, err)
	}
	if d := n.drifted(s); !slices.Equal(d, []string{"table inet " + TableName}) {
		t.Errorf("Drifted after Delete = %v, want the table", d)
	}
	if ch := n.sync(s, false); !ch.Full {
		t.Errorf("Sync after Delete wrote %+v, want the table whole", ch)
	}
}

// A kernel without nf_tables is named as such.
func TestTableUnsupported(t *testing.T) {
	tb := &Table{Kernel: &noNFTables{}}
	if err := tb.Supported(); !errors.Is(err, errNoNFTables) {
		t.Errorf("Supported() = %v, want %v", err, errNoNFTables)
	}
}

type noNFTables struct{ nlfake.Nftables }

func (*noNFTables) Tables() ([]*nftables.Table, error) {
	return nil, fmt.Errorf("listing nftables tables: %w", unix.EPROTONOSUPPORT)
}
