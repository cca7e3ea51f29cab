package hostport

import (
	"encoding/json"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/nftables"

	"github.com/twill-net/twill/nl/nft"
	"github.com/twill-net/twill/nl/nlfake"
)

func TestParse(t *testing.T) {
	got, err := Parse(json.RawMessage(`[{"hostPort":8080,"containerPort":80,"protocol":"TCP","hostIP":""},
		{"hostPort":53,"containerPort":5353,"protocol":"udp","hostIP":"192.168.50.1"},
		{"HostPort":9000,"ContainerPort":9000}]`))
	if err != nil {
		t.Fatal(err)
	}
	want := []Port{
		{HostPort: 8080, ContainerPort: 80, Proto: 6},
		{HostPort: 53, ContainerPort: 5353, Proto: 17, HostIP: netip.MustParseAddr("192.168.50.1")},
		{HostPort: 9000, ContainerPort: 9000, Proto: 6},
	}
	if !slices.Equal(got, want) {
		t.Errorf("Parse: %v, want %v", got, want)
	}
	for _, empty := range []string{``, `null`, `[]`} {
		if got, err := Parse(json.RawMessage(empty)); err != nil || len(got) != 0 {
			t.Errorf("Parse(%q): %v, %v; want nothing", empty, got, err)
		}
	}
}

func TestParseNamesTheFieldAndTheValue(t *testing.T) {
	for in, want := range map[string]string{
		`{"hostPort":1}`: `runtimeConfig.portMappings "{\"hostPort\":1}": must be a list`,
		`[{"hostPort":0,"containerPort":80,"protocol":"tcp"}]`:                       `runtimeConfig.portMappings[0].hostPort 0: must be a port, 1 to 65535`,
		`[{"hostPort":80,"containerPort":80},{"hostPort":80,"containerPort":70000}]`: `runtimeConfig.portMappings[1].containerPort 70000: must be a port, 1 to 65535`,
		`[{"hostPort":80,"containerPort":80,"protocol":"icmp"}]`:                     `runtimeConfig.portMappings[0].protocol "icmp": must be tcp, udp or sctp`,
		`[{"hostPort":80,"containerPort":80,"hostIP":"node1"}]`:                      `runtimeConfig.portMappings[0].hostIP "node1": must be an IP address`,
		`[{"hostPort":"80","containerPort":80}]`:                                     `runtimeConfig.portMappings[0].hostPort "80": must be a whole number`,
		`[{"hostPort":80,"containerPort":80,"bind":"x"}]`:                            `unknown key "bind"`,
	} {
		_, err := Parse(json.RawMessage(in))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Parse(%s): %v, want %q", in, err, want)
		}
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(`[{"hostPort":8080,"containerPort":80,"protocol":"tcp","hostIP":"::1"}]`))
	f.Add([]byte(`[{"hostPort":-1}]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		ports, err := Parse(data)
		if err != nil {
			return
		}
		for _, p := range ports {
			if p.HostPort == 0 || p.ContainerPort == 0 || (p.Proto != 6 && p.Proto != 17 && p.Proto != 132) {
				t.Fatalf("Parse(%q) took %+v", data, p)
			}
			if rs := podRules("tw1", []netip.Addr{netip.MustParseAddr("10.244.1.2"), netip.MustParseAddr("fd00::2")}, []Port{p}); len(rs) == 0 {
				t.Fatalf("%+v serves neither family", p)
			}
		}
	})
}

var (
	podA  = []netip.Addr{netip.MustParseAddr("10.244.1.2"), netip.MustParseAddr("fd00:1::2")}
	podB  = []netip.Addr{netip.MustParseAddr("10.244.1.3")}
	web   = Port{HostPort: 8080, ContainerPort: 80, Proto: 6}
	dns4  = Port{HostPort: 53, ContainerPort: 53, Proto: 17, HostIP: netip.MustParseAddr("192.168.50.1")}
	only6 = Port{HostPort: 443, ContainerPort: 443, Proto: 6, HostIP: netip.MustParseAddr("fd00::1")}
)

// comments lists the comments of a chain's rules.
func comments(t *testing.T, k nft.Kernel, chain string) []string {
	t.Helper()
	rules, err := k.Rules(table, chain)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, r := range rules {
		out = append(out, comment(r))
	}
	return out
}

func mustAdd(t *testing.T, k nft.Kernel, owner string, ips []netip.Addr, ports ...Port) {
	t.Helper()
	if err := Add(k, owner, ips, ports); err != nil {
		t.Fatal(err)
	}
}

func TestAddWritesEachMappingForTheFamiliesItServes(t *testing.T) {
	k := &nlfake.Nftables{}
	mustAdd(t, k, "twA", podA, web, dns4, only6)
	want := []string{"twA :8080/tcp to 10.244.1.2:80", "twA 192.168.50.1:53/udp to 10.244.1.2:53", "twA :8080/tcp to [fd00:1::2]:80", "twA [fd00::1]:443/tcp to [fd00:1::2]:443"}
	if got := comments(t, k, hostportsChain); !slices.Equal(got, want) {
		t.Errorf("hostports: %q, want %q", got, want)
	}
	if got, want := comments(t, k, hairpinChain), []string{"twA 10.244.1.2", "twA fd00:1::2"}; !slices.Equal(got, want) {
		t.Errorf("hairpin: %q, want %q", got, want)
	}
	if err := Check(k, "twA", podA, []Port{web, dns4, only6}); err != nil {
		t.Errorf("Check after Add: %v", err)
	}
}

func TestPodsKeepTheirOwnRules(t *testing.T) {
	k := &nlfake.Nftables{}
	mustAdd(t, k, "twA", podA, web)
	mustAdd(t, k, "twB", podB, dns4)
	if _, err := Remove(k, "twA"); err != nil {
		t.Fatal(err)
	}
	mustAdd(t, k, "twA", podA, dns4)
	for _, c := range []string{"prerouting", "output", "postrouting"} {
		if got := comments(t, k, c); len(got) != len(slices.Compact(slices.Clone(got))) || len(got) == 0 {
			t.Errorf("chain %s: %q, want each base rule once", c, got)
		}
	}
	if got, want := comments(t, k, hostportsChain), []string{"twB 192.168.50.1:53/udp to 10.244.1.3:53", "twA 192.168.50.1:53/udp to 10.244.1.2:53"}; !slices.Equal(got, want) {
		t.Errorf("hostports: %q, want %q", got, want)
	}
	if had, err := Remove(k, "twA"); err != nil || !had {
		t.Fatalf("Remove twA: %v, %v", had, err)
	}
	if had, err := Remove(k, "twA"); err != nil || had {
		t.Fatalf("Remove twA again: %v, %v; want nothing to remove", had, err)
	}
	if got, want := comments(t, k, hostportsChain), []string{"twB 192.168.50.1:53/udp to 10.244.1.3:53"}; !slices.Equal(got, want) {
		t.Errorf("hostports after twA's DEL: %q, want %q", got, want)
	}
	if err := Check(k, "twB", podB, []Port{dns4}); err != nil {
		t.Errorf("twB after twA's DEL: %v", err)
	}
}

func TestNoMappingForThePodChangesNothing(t *testing.T) {
	k := &nlfake.Nftables{}
	mustAdd(t, k, "twB", podB, only6) // an IPv6 host address, an IPv4-only pod
	mustAdd(t, k, "twB", podB)
	if tables, _ := k.Tables(); len(tables) != 0 {
		t.Errorf("tables %v, want none", tables)
	}
	if had, err := Remove(k, "twB"); err != nil || had {
		t.Errorf("Remove with no table: %v, %v", had, err)
	}
}

func TestPruneAndOwners(t *testing.T) {
	k := &nlfake.Nftables{}
	mustAdd(t, k, "twA", podA, web)
	mustAdd(t, k, "twB", podB, web)
	mustAdd(t, k, "twC", podB, dns4)
	if got, err := Owners(k); err != nil || !slices.Equal(got, []string{"twA", "twB", "twC"}) {
		t.Fatalf("Owners: %v, %v", got, err)
	}
	gone, err := Prune(k, func(o string) bool { return o != "twB" })
	if err != nil || !slices.Equal(gone, []string{"twA", "twC"}) {
		t.Fatalf("Prune: %v, %v", gone, err)
	}
	if got, err := Owners(k); err != nil || !slices.Equal(got, []string{"twB"}) {
		t.Errorf("Owners after Prune: %v, %v", got, err)
	}
}

func TestCheckNamesWhatIsMissing(t *testing.T) {
	k := &nlfake.Nftables{}
	mustAdd(t, k, "twA", podA, web)
	rules, _ := k.Rules(table, hostportsChain)
	var b nft.Batch
	b.DelRule(&nftables.Rule{Table: table, Chain: hostport, Handle: rules[1].Handle}) // the IPv6 one
	if err := k.Apply(&b); err != nil {
		t.Fatal(err)
	}
	err := Check(k, "twA", podA, []Port{web})
	if err == nil || !strings.Contains(err.Error(), "host port :8080/tcp to [fd00:1::2]:80 missing") {
		t.Errorf("Check: %v, want the mapping named", err)
	}
	if err := Check(k, "twA", podA, []Port{{HostPort: 8080, ContainerPort: 81, Proto: 6}}); err == nil {
		t.Error("Check of another container port passed")
	}
}

// A base chain changed by hand is written whole again by the next ADD.
func TestAddRepairsTheBaseChains(t *testing.T) {
	k := &nlfake.Nftables{}
	mustAdd(t, k, "twA", podA, web)
	rules, _ := k.Rules(table, "prerouting")
	var b nft.Batch
	b.DelRule(&nftables.Rule{Table: table, Chain: pre, Handle: rules[0].Handle})
	b.AddRule(rule(pre, "an operator's", family(podB[0])...))
	if err := k.Apply(&b); err != nil {
		t.Fatal(err)
	}
	mustAdd(t, k, "twB", podB, dns4)
	if got := comments(t, k, "prerouting"); !slices.Equal(got, []string{"to a local address"}) {
		t.Errorf("prerouting: %q, want twill's rule alone", got)
	}
	if got := comments(t, k, hostportsChain); len(got) != 3 {
		t.Errorf("hostports: %q, want both pods' rules", got)
	}
}

// racing is a kernel in which another writer deletes the first rule a
// transaction deletes just before the transaction commits, once.
type racing struct {
	*nlfake.Nftables
	raced bool
}

func (r *racing) Apply(b *nft.Batch) error {
	if !r.raced {
		for _, op := range b.Ops {
			if op.Kind == nft.DelRule {
				r.raced = true
				var other nft.Batch
				other.DelRule(op.Rule)
				if err := r.Nftables.Apply(&other); err != nil {
					return err
				}
				break
			}
		}
	}
	return r.Nftables.Apply(b)
}

// A DEL racing another DEL or GC of the same pod still removes every rule
// and reports no error.
func TestRemoveRacingAnotherWriter(t *testing.T) {
	k := &racing{Nftables: &nlfake.Nftables{}}
	mustAdd(t, k, "twA", podA, web, dns4)
	mustAdd(t, k, "twB", podB, web)
	if had, err := Remove(k, "twA"); err != nil || !had {
		t.Fatalf("Remove racing another writer: %v, %v", had, err)
	}
	if !k.raced {
		t.Fatal("the race did not happen")
	}
	if got, _ := Owners(k); !slices.Equal(got, []string{"twB"}) {
		t.Errorf("owners after Remove: %v, want twB's alone", got)
	}
}

// 0.0.0.0 is every IPv4 address of the node: the IPv4 address alone is
// mapped, with no destination address to match.
func TestUnspecifiedHostIPServesItsFamily(t *testing.T) {
	ports, err := Parse(json.RawMessage(`[{"hostPort":8080,"containerPort":80,"hostIP":"0.0.0.0"}]`))
	if err != nil {
		t.Fatal(err)
	}
	rs := podRules("twA", podA, ports)
	if len(rs) != 2 || comment(rs[0]) != "twA 0.0.0.0:8080/tcp to 10.244.1.2:80" {
		t.Fatalf("rules %d, first %q: want one DNAT rule for the IPv4 address and its hairpin", len(rs), comment(rs[0]))
	}
	if want := dnatExprs(podA[0], Port{HostPort: 8080, ContainerPort: 80, Proto: 6}); len(rs[0].Exprs) != len(want) {
		t.Errorf("0.0.0.0's rule has %d expressions, the rule for every address %d: it matches a destination address", len(rs[0].Exprs), len(want))
	}
}
