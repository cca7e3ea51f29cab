package network

import (
	"context"
	"io"
	"log/slog"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/twill-net/twill/nl"
	"github.com/twill-net/twill/testsupport/netnstest"
)

// openNS opens the test's namespace name, closed when the test ends.
func openNS(t *testing.T, name string) ns.NetNS {
	t.Helper()
	target, err := ns.GetNS("/var/run/netns/" + name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { target.Close() })
	return target
}

func iptablesSave(t *testing.T, name string) string { return save(t, name, "iptables-save") }

func save(t *testing.T, name, tool string) string {
	out, err := exec.Command("ip", "netns", "exec", name, tool).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v: %s", tool, err, out)
	}
	return string(out)
}

func TestPrivilegedChainsRepairAndCleanup(t *testing.T) {
	name := netnstest.New(t, "ipt")
	target := openNS(t, name)
	c := &Chains{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), IPMasq: true,
		Networks: []NetworkPair{
			{Cluster: netip.MustParsePrefix("10.244.0.0/16"), Local: netip.MustParsePrefix("10.244.3.0/24")},
			{Cluster: netip.MustParsePrefix("fd00:10::/56"), Local: netip.MustParsePrefix("fd00:10:0:3::/64")},
		}}
	// go-iptables runs the iptables binary; inside ns.Do the child inherits
	// the target namespace, so the test never touches the caller's rules.
	inNS := func(f func() error) {
		t.Helper()
		if err := target.Do(func(ns.NetNS) error { return f() }); err != nil {
			t.Fatal(err)
		}
	}
	inNS(c.Sync)
	first := iptablesSave(t, name)
	for _, want := range []string{"-A POSTROUTING -m comment --comment twill -j TWILL-POSTRTG", "-A FORWARD -m comment --comment twill -j TWILL-FWD", "MASQUERADE --random-fully", "-A TWILL-FWD -s 10.244.0.0/16"} {
		if !strings.Contains(first, want) {
			t.Fatalf("after Sync, rules lack %q:\n%s", want, first)
		}
	}
	// Someone deletes a rule and the jump; the next Sync restores both.
	if out, err := exec.Command("ip", "netns", "exec", name, "sh", "-c", "iptables -t filter -D TWILL-FWD 1 && iptables -t nat -D POSTROUTING 1").CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	inNS(c.Sync)
	if again := iptablesSave(t, name); countRules(again) != countRules(first) {
		t.Fatalf("Sync did not repair the rules:\nbefore\n%s\nafter\n%s", first, again)
	}
	v6 := save(t, name, "ip6tables-save")
	for _, want := range []string{"-A TWILL-POSTRTG -s fd00:10::/56 ! -d ff00::/8", "MASQUERADE --random-fully", "-A TWILL-FWD -d fd00:10::/56"} {
		if !strings.Contains(v6, want) {
			t.Fatalf("after Sync, IPv6 rules lack %q:\n%s", want, v6)
		}
	}
	inNS(CleanupChains)
	if left := iptablesSave(t, name) + save(t, name, "ip6tables-save"); strings.Contains(left, "TWILL") {
		t.Fatalf("rules left after cleanup:\n%s", left)
	}
}

func countRules(save string) int { return strings.Count(save, "\n-A ") }

func TestPrivilegedChooseExternal(t *testing.T) {
	name := netnstest.New(t, "ifc")
	netnstest.IP(t, name, "link", "add", "ext0", "type", "veth", "peer", "name", "ext0p")
	netnstest.IP(t, name, "link", "add", "data1", "type", "veth", "peer", "name", "data1p")
	for _, l := range []string{"ext0", "ext0p", "data1", "data1p"} {
		netnstest.IP(t, name, "link", "set", l, "up")
	}
	netnstest.IP(t, name, "addr", "add", "192.168.5.2/24", "dev", "ext0")
	netnstest.IP(t, name, "addr", "add", "10.7.0.2/16", "dev", "data1")
	netnstest.IP(t, name, "route", "add", "default", "via", "192.168.5.1")
	h, err := nl.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	tests := []struct {
		name     string
		o        IfaceOptions
		want     string
		wantPub  string
		wantFail string
	}{
		{"default route", IfaceOptions{}, "ext0", "192.168.5.2", ""},
		{"by name", IfaceOptions{Ifaces: []string{"nope", "data1"}}, "data1", "10.7.0.2", ""},
		{"by address", IfaceOptions{Ifaces: []string{"10.7.0.2"}}, "data1", "10.7.0.2", ""},
		{"by regex", IfaceOptions{IfaceRegex: []string{"^data"}}, "data1", "10.7.0.2", ""},
		{"can reach", IfaceOptions{CanReach: netip.MustParseAddr("10.7.9.9")}, "data1", "10.7.0.2", ""},
		{"public ip override", IfaceOptions{PublicIP: netip.MustParseAddr("203.0.113.9")}, "ext0", "203.0.113.9", ""},
		{"no match", IfaceOptions{Ifaces: []string{"wlan9"}}, "", "", "--iface [wlan9]: no interface matches"},
		{"bad regex", IfaceOptions{IfaceRegex: []string{"("}}, "", "", `--iface-regex "("`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.o.IPv4 = true
			ext, err := ChooseExternal(h, tt.o)
			if tt.wantFail != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantFail) {
					t.Fatalf("error %v, want %q", err, tt.wantFail)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if ext.Link.Name != tt.want || ext.PublicIP.String() != tt.wantPub {
				t.Fatalf("chose %s publishing %s, want %s publishing %s", ext.Link.Name, ext.PublicIP, tt.want, tt.wantPub)
			}
		})
	}
}

// With iptables-nft, a rule deleted behind twill's back is restored at once
// (the nftables change announces it), not at the next poll: the poll here
// is an hour away.
func TestPrivilegedChainsRepairOnChange(t *testing.T) {
	if !UsesNFTables(false) {
		t.Fatal("this machine's iptables is not iptables-nft; the change watch needs it")
	}
	name := netnstest.New(t, "iptw")
	target := openNS(t, name)
	// The keeper's log goes to the test's output: a failed resync says why.
	c := &Chains{Logger: slog.New(slog.NewTextHandler(t.Output(), nil)), IPMasq: true,
		Networks: []NetworkPair{{Cluster: netip.MustParsePrefix("10.244.0.0/16"), Local: netip.MustParsePrefix("10.244.3.0/24")}}}
	k := &Keeper{Logger: c.Logger, Rules: c, Resync: time.Hour, WatchedResync: time.Hour,
		// The socket is opened inside the test's namespace; Run's own
		// goroutine (locked in it by ns.Do) runs the iptables execs.
		Watch: netnstest.WatchIn(target, nl.WatchNftables),
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- target.Do(func(ns.NetNS) error { return k.Run(ctx) }) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	const fwd = "-A TWILL-FWD -s 10.244.0.0/16"
	waitSave := func(what string, ok func(string) bool) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			s := iptablesSave(t, name)
			if ok(s) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s within 20 s (the poll is an hour away):\n%s", what, s)
			}
		}
	}
	waitSave("the rules were not written once the watch began", func(s string) bool { return strings.Contains(s, fwd) })
	if out, err := exec.Command("ip", "netns", "exec", name, "iptables", "-t", "filter", "-F", "TWILL-FWD").CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	waitSave("the flushed chain was not restored", func(s string) bool { return strings.Contains(s, fwd) })
}

// restoreCounter counts a family's iptables-restore runs.
type restoreCounter struct {
	IPTables
	restores int
}

func (r *restoreCounter) Restore(input string) error {
	r.restores++
	return r.IPTables.Restore(input)
}

// A family's chains are written by one iptables-restore, both tables at
// once; a sync that finds them as it wrote them writes nothing, and a
// chain changed behind twill's back is written again.
func TestPrivilegedChainsOneRestore(t *testing.T) {
	name := netnstest.New(t, "ipr")
	target := openNS(t, name)
	counters := map[bool]*restoreCounter{}
	c := &Chains{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), IPMasq: true,
		Networks: []NetworkPair{
			{Cluster: netip.MustParsePrefix("10.244.0.0/16"), Local: netip.MustParsePrefix("10.244.3.0/24")},
			{Cluster: netip.MustParsePrefix("fd00:10::/56"), Local: netip.MustParsePrefix("fd00:10:0:3::/64")},
		},
		Open: func(v6 bool) (IPTables, error) {
			ipt, err := OpenIPTables(v6)
			counters[v6] = &restoreCounter{IPTables: ipt}
			return counters[v6], err
		}}
	sync := func() {
		t.Helper()
		if err := target.Do(func(ns.NetNS) error { return c.Sync() }); err != nil {
			t.Fatal(err)
		}
	}
	sync()
	if counters[false].restores != 1 || counters[true].restores != 1 {
		t.Fatalf("first sync: %d and %d iptables-restore runs (IPv4, IPv6), want 1 each", counters[false].restores, counters[true].restores)
	}
	first := iptablesSave(t, name)
	if !strings.Contains(first, `-A TWILL-POSTRTG -s 10.244.0.0/16 ! -d 224.0.0.0/4 -m comment --comment "twill: pod to outside" -j MASQUERADE --random-fully`) ||
		!strings.Contains(first, "-A FORWARD -m comment --comment twill -j TWILL-FWD") {
		t.Fatalf("after the first sync:\n%s", first)
	}
	sync()
	if counters[false].restores != 1 || counters[true].restores != 1 {
		t.Fatalf("a second sync with nothing changed ran iptables-restore: %d and %d runs in all", counters[false].restores, counters[true].restores)
	}
	if out, err := exec.Command("ip", "netns", "exec", name, "iptables", "-t", "nat", "-D", "TWILL-POSTRTG", "1").CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	sync()
	if again := iptablesSave(t, name); countRules(again) != countRules(first) {
		t.Fatalf("the deleted rule is not back:\nbefore\n%s\nafter\n%s", first, again)
	}
	if counters[false].restores != 2 || counters[true].restores != 1 {
		t.Fatalf("repairing IPv4's nat chain: %d and %d iptables-restore runs in all, want 2 and 1", counters[false].restores, counters[true].restores)
	}
}
