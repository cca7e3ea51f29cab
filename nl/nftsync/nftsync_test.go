package nftsync

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/twill-net/twill/nl/nft"
	"github.com/twill-net/twill/nl/nlfake"
)

var (
	prio   = *nftables.ChainPriorityFilter + 10
	accept = nftables.ChainPolicyAccept
	hook   = &nftables.Chain{Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookForward, Priority: &prio, Policy: &accept}
)

func addr(last byte) []byte { return []byte{10, 0, 0, last} }

func accepting(comment string) Rule {
	return Rule{Comment: comment, Exprs: []expr.Any{&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictAccept}}}
}

func jumping(comment, to string) Rule {
	return Rule{Comment: comment, Exprs: []expr.Any{&expr.Verdict{Kind: expr.VerdictJump, Chain: to}}}
}

func lookingUp(comment, set string, vmap bool) Rule {
	es := []expr.Any{&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Lookup{SourceRegister: 1, SetName: set, IsDestRegSet: vmap}}
	if !vmap {
		es = append(es, &expr.Verdict{Kind: expr.VerdictDrop})
	}
	return Rule{Comment: comment, Exprs: es}
}

// policyLike is a table shaped as the policy table is: a base chain that
// looks up a verdict map, which jumps to each pod's chain; the pods'
// chains look up a set of addresses.
func policyLike(pods ...byte) Table {
	t := Table{Chains: []Chain{{Name: "forward", Hook: hook, Rules: Static([]Rule{lookingUp("to pods", "pods", true)})}}}
	pm := Set{Name: "pods", KeyType: nftables.TypeIPAddr, Map: true}
	bad := Set{Name: "bad", KeyType: nftables.TypeIPAddr, Elems: []nft.Elem{{Key: addr(99)}}}
	for _, p := range pods {
		name := "pod" + string('0'+p)
		t.Chains = append(t.Chains, Chain{Name: name, Rules: Static([]Rule{lookingUp("no bad", "bad", false), jumping("more", name+"+")})},
			Chain{Name: name + "+", Rules: Static([]Rule{accepting("allow " + name)})})
		pm.Elems = append(pm.Elems, nft.Elem{Key: addr(p), Jump: name})
	}
	t.Sets = []Set{bad, pm}
	return t
}

func engine(k nft.Kernel) *Engine {
	return &Engine{Kernel: k, Family: nftables.TableFamilyINet, Name: "t"}
}

func syncOK(t *testing.T, e *Engine, want Table, reread bool) Changes {
	t.Helper()
	ch, err := e.Sync(want, reread)
	if err != nil {
		t.Fatalf("Sync: %v", err)
	}
	if d, err := e.Drift(want); err != nil || !d.Clean() {
		t.Fatalf("after Sync, the kernel's table differs: %+v (%v)", d, err)
	}
	return ch
}

func gen(t *testing.T, k nft.Kernel) uint32 {
	t.Helper()
	g, err := k.Generation()
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// Each change writes what it changed and nothing else, in one
// transaction, and an unchanged table none.
func TestSyncWritesWhatChanged(t *testing.T) {
	k := &nlfake.Nftables{}
	e := engine(k)
	if ch := syncOK(t, e, policyLike(1, 2), false); !ch.Full || ch.Chains != 5 || ch.Sets != 2 {
		t.Errorf("first Sync: %+v, want the table whole: 5 chains, 2 sets", ch)
	}
	g := gen(t, k)
	for _, reread := range []bool{false, true} {
		if ch := syncOK(t, e, policyLike(1, 2), reread); !ch.Clean() {
			t.Errorf("Sync of an unchanged table (reread %v) wrote %+v", reread, ch)
		}
	}
	if gen(t, k) != g {
		t.Error("Syncs of an unchanged table committed a transaction")
	}
	if ch := syncOK(t, e, policyLike(1, 2, 3), false); ch != (Changes{Chains: 2, Elems: 1}) {
		t.Errorf("a pod more: %+v, want its two chains and its jump", ch)
	}
	if gen(t, k) != g+1 {
		t.Errorf("a pod more took %d transactions, want 1", gen(t, k)-g)
	}
	if ch := syncOK(t, e, policyLike(1, 3), false); ch != (Changes{Elems: 1, Del: 2}) {
		t.Errorf("a pod less: %+v, want its jump and its two chains deleted", ch)
	}
	changed := policyLike(1, 3)
	changed.Chains[1].Rules = Static([]Rule{accepting("anything")})
	if ch := syncOK(t, e, changed, false); ch != (Changes{Chains: 1}) {
		t.Errorf("a chain's rules changed: %+v, want that chain alone", ch)
	}
	changed.Sets[0].Elems = []nft.Elem{{Key: addr(98)}}
	if ch := syncOK(t, e, changed, false); ch != (Changes{Elems: 2}) {
		t.Errorf("a set's element replaced: %+v, want one deleted and one added", ch)
	}
	changed.Sets[1].Elems[0].Jump = "pod3"
	if ch := syncOK(t, e, changed, false); ch != (Changes{Elems: 2}) {
		t.Errorf("a map element's jump changed: %+v, want it deleted and added", ch)
	}
	noBad := policyLike()
	noBad.Sets = noBad.Sets[1:]
	if ch := syncOK(t, e, noBad, false); ch.Full || ch.Del != 5 {
		t.Errorf("every pod and the set gone: %+v, want 4 chains and 1 set deleted, and a map element", ch)
	}
}

// With Same, a chain whose source is unchanged since the last write is
// not rendered; reading the kernel's table compares it all the same.
func TestSyncSkipsChainsWhoseSourceIsUnchanged(t *testing.T) {
	k := &nlfake.Nftables{}
	e := engine(k)
	e.Same = func(a, b any) bool { return a == b }
	renders := 0
	table := func(src string) Table {
		return Table{Chains: []Chain{{Name: "forward", Hook: hook, Src: src, Rules: func() ([]Rule, error) {
			renders++
			return []Rule{accepting(src)}, nil
		}}}}
	}
	syncOK(t, e, table("a"), false) // and Drift renders once more
	renders = 0
	e.Sync(table("a"), false)
	if renders != 0 {
		t.Errorf("an unchanged source rendered %d times, want none", renders)
	}
	e.Sync(table("a"), true)
	if renders != 1 {
		t.Errorf("reading the kernel's table rendered %d times, want once", renders)
	}
	if ch, _ := e.Sync(table("b"), false); ch != (Changes{Chains: 1}) {
		t.Errorf("a changed source wrote %+v, want its chain", ch)
	}
}

// With SameSet, a set whose source is unchanged since the last write is
// not compared; reading the kernel's table compares it all the same.
func TestSyncSkipsSetsWhoseSourceIsUnchanged(t *testing.T) {
	k := &nlfake.Nftables{}
	e := engine(k)
	e.SameSet = func(a, b any) bool { return a == b }
	table := func(src string, elems ...byte) Table {
		t := Table{Sets: []Set{{Name: "pods", KeyType: nftables.TypeIPAddr, Src: src}}}
		for _, el := range elems {
			t.Sets[0].Elems = append(t.Sets[0].Elems, nft.Elem{Key: addr(el)})
		}
		return t
	}
	syncOK(t, e, table("a", 1), false)
	// The same source: not compared, so the elements given are not read.
	if ch, err := e.Sync(table("a", 1, 2), false); err != nil || !ch.Clean() {
		t.Errorf("an unchanged source wrote %+v (%v), want nothing", ch, err)
	}
	if ch := syncOK(t, e, table("b", 1, 2), false); ch != (Changes{Elems: 1}) {
		t.Errorf("a changed source wrote %+v, want its new element", ch)
	}
	var b nft.Batch
	b.DelElems(&nftables.Set{Table: &nftables.Table{Family: nftables.TableFamilyINet, Name: "t"}, Name: "pods"}, []nft.Elem{{Key: addr(2)}})
	if err := k.Apply(&b); err != nil {
		t.Fatal(err)
	}
	if ch := syncOK(t, e, table("b", 1, 2), true); ch != (Changes{Elems: 1}) {
		t.Errorf("reading the kernel's table, an element deleted behind the engine: %+v, want it added back", ch)
	}
}

// A change the kernel refuses (its table changed behind a Sync that
// trusts its last write) is followed, in the same Sync, by the whole table.
func TestSyncRewritesWhatTheKernelRefused(t *testing.T) {
	k := &nlfake.Nftables{}
	e := engine(k)
	syncOK(t, e, policyLike(1, 2), false)
	var b nft.Batch
	tb := &nftables.Table{Family: nftables.TableFamilyINet, Name: "t"}
	b.DelElems(&nftables.Set{Table: tb, Name: "pods", IsMap: true}, []nft.Elem{{Key: addr(2)}})
	if err := k.Apply(&b); err != nil {
		t.Fatal(err)
	}
	if ch := syncOK(t, e, policyLike(1), false); !ch.Full {
		t.Errorf("a change the kernel refused: %+v, want the table whole", ch)
	}
	// A base chain hooked otherwise, read back: written afresh.
	other := policyLike(1)
	in := *hook
	in.Hooknum = nftables.ChainHookInput
	other.Chains[0].Hook = &in
	if ch := syncOK(t, e, other, true); !ch.Full {
		t.Errorf("a base chain on another hook: %+v, want the table whole", ch)
	}
}

// refusing is a kernel that refuses every batch.
type refusing struct{ nlfake.Nftables }

func (*refusing) Apply(*nft.Batch) error { return errors.New("refused") }

// Nothing is half-applied: a rule that cannot render fails the Sync
// before anything is written, and a refused write is reported and
// followed by a read of the kernel's table.
func TestSyncErrors(t *testing.T) {
	k := &nlfake.Nftables{}
	e := engine(k)
	bad := policyLike(1)
	bad.Chains[1].Rules = func() ([]Rule, error) { return nil, errors.New("no such port") }
	if _, err := e.Sync(bad, false); err == nil || !strings.Contains(err.Error(), "chain pod1") {
		t.Errorf("Sync of a chain that cannot render: %v, want an error naming the chain", err)
	}
	if gen(t, k) != 0 {
		t.Error("a Sync that failed to render wrote")
	}
	r := engine(&refusing{})
	if _, err := r.Sync(policyLike(1), false); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Errorf("Sync into a kernel that refuses: %v", err)
	}
	if r.last != nil {
		t.Error("a refused write left a model of the table behind")
	}
	if ok, err := engine(k).Delete(); ok || err != nil {
		t.Errorf("Delete of no table: %v, %v", ok, err)
	}
}

// Drift names what differs in the sets, and a Sync that reads the
// kernel's table deletes what is no longer wanted.
func TestDriftOfSets(t *testing.T) {
	k := &nlfake.Nftables{}
	e := engine(k)
	syncOK(t, e, policyLike(1, 2), false)
	want := policyLike(1, 2)
	want.Sets[0].Elems = append(want.Sets[0].Elems, nft.Elem{Key: addr(97)})
	want.Sets[1].Elems[0].Jump = "pod2"
	want.Sets = append(want.Sets, Set{Name: "more", KeyType: nftables.TypeIPAddr})
	d, err := e.Drift(want)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"set bad: 1 elements", "set pods: 1 elements jump elsewhere", "set more"} {
		if !slices.Contains(d.Missing, w) && !slices.Contains(d.Wrong, w) {
			t.Errorf("drift %+v lacks %q", d, w)
		}
	}
	fewer := policyLike(1, 2)
	fewer.Sets[0].Elems = nil
	fewer.Sets[0].KeyType = nftables.TypeIP6Addr
	if d, _ := e.Drift(fewer); !slices.Contains(d.Wrong, "set bad: of another type") {
		t.Errorf("drift %+v lacks the set's type", d)
	}
	fewer = policyLike()
	fewer.Sets = fewer.Sets[1:]
	if d, _ := e.Drift(fewer); !slices.Contains(d.Extra, "set bad") {
		t.Errorf("drift %+v lacks the extra set", d)
	}
	if ch := syncOK(t, e, fewer, true); ch.Del != 5 {
		t.Errorf("Sync of the kernel's table wrote %+v, want the pods' 4 chains and the set deleted", ch)
	}
	if got := e.What(); got != "table inet t" {
		t.Errorf("What() = %q", got)
	}
}
