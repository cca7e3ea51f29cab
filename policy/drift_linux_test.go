package policy

import (
	"slices"
	"testing"

	"github.com/google/nftables"

	"github.com/twill-net/twill/nl/nft"
	"github.com/twill-net/twill/testsupport/netnstest"
)

// TestPrivilegedPolicyDrifted: Drifted finds nothing in a table as
// written, names a flushed pod chain, and a verdict map element deleted
// behind twilld's back, for the pods asked about and only for them.
func TestPrivilegedPolicyDrifted(t *testing.T) {
	n := newNode(t)
	s := snapshot(testPolicy("x", "deny", nil, nil), testPolicy("y", "deny", nil, nil))
	s.LogDenied = true
	full := Compile(s).Ruleset
	if _, err := n.tb.Sync(full, false); err != nil {
		t.Fatal(err)
	}
	sub := full.Subset([]string{"x/a"}, []string{"10.244.1.2"})
	drifted := func() []string {
		d, err := n.tb.Drifted(full, sub)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	if d := drifted(); len(d) != 0 {
		t.Fatalf("a table as written: drifted %v, want nothing", d)
	}
	run := func(args ...string) {
		if out, err := netnstest.Exec(n.name, "nft", args...); err != nil {
			t.Fatalf("nft %v: %v\n%s", args, err, out)
		}
	}
	flush := func(chain string) {
		var b nft.Batch
		b.FlushChain(&nftables.Chain{Table: &nftables.Table{Family: nftables.TableFamilyINet, Name: TableName}, Name: chain})
		if err := n.tb.eng().Kernel.Apply(&b); err != nil {
			t.Fatalf("flushing chain %s: %v", chain, err)
		}
	}
	flush("in:y/a") // not asked about
	if d := drifted(); len(d) != 0 {
		t.Errorf("another pod's chain flushed: drifted %v, want nothing for x/a", d)
	}
	flush("in:x/a")
	run("delete", "element", "inet", TableName, JumpMap("in", false), "{ 10.244.1.2 }")
	if d := drifted(); !slices.Contains(d, "chain in:x/a") || !slices.Contains(d, "set jump-in-4 (10.244.1.2)") {
		t.Errorf("x/a's chain flushed and its map element deleted: drifted %v", d)
	}
}
