package nftables

import (
	"context"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/twill-net/twill/network"
	"github.com/twill-net/twill/nl"
	knft "github.com/twill-net/twill/nl/nft"
	"github.com/twill-net/twill/testsupport/netnstest"
)

// tableIn is a Table writing the dual-stack rules into namespace name.
func tableIn(t *testing.T, name string) *Table {
	t.Helper()
	f, err := os.Open("/var/run/netns/" + name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return &Table{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), IPMasq: true,
		Networks: []network.NetworkPair{
			{Cluster: netip.MustParsePrefix("10.244.0.0/16"), Local: netip.MustParsePrefix("10.244.3.0/24")},
			{Cluster: netip.MustParsePrefix("fd00:10::/56"), Local: netip.MustParsePrefix("fd00:10:0:3::/64")},
		},
		Kernel: knft.Conn{NetNS: int(f.Fd())}}
}

func nft(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := netnstest.Exec(name, "nft", args...)
	if err != nil {
		t.Fatalf("nft %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return out
}

// The table as nft prints it holds the same rules as the iptables mode, and
// a second Sync writes nothing (the kernel's table reads back equal).
func TestPrivilegedTableSync(t *testing.T) {
	name := netnstest.New(t, "nft")
	tb := tableIn(t, name)
	if err := tb.Sync(); err != nil {
		t.Fatal(err)
	}
	got := nft(t, name, "list", "table", "inet", "twill")
	for _, want := range []string{
		"type nat hook postrouting priority srcnat; policy accept;",
		"type filter hook forward priority filter; policy accept;",
		`ip saddr 10.244.0.0/16 ip daddr 10.244.0.0/16 return comment "twill: pod to pod (ipv4)"`,
		`ip saddr 10.244.0.0/16 ip daddr != 224.0.0.0/4 masquerade fully-random comment "twill: pod to outside (ipv4)"`,
		`ip saddr != 10.244.0.0/16 ip daddr 10.244.3.0/24 return`,
		`ip6 saddr fd00:10::/56 ip6 daddr != ff00::/8 masquerade fully-random`,
		`ip saddr 10.244.0.0/16 accept comment "twill: from pods (ipv4)"`,
		`ip6 daddr fd00:10::/56 accept comment "twill: to pods (ipv6)"`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("table lacks %q:\n%s", want, got)
		}
	}
	d, err := tb.Drift()
	if err != nil || !d.Clean() {
		t.Fatalf("drift right after Sync: %+v (%v)", d, err)
	}
	// A second Sync finds nothing to do: a rewrite would give every rule
	// a new handle.
	before := nft(t, name, "-a", "list", "table", "inet", "twill")
	if err := tb.Sync(); err != nil {
		t.Fatal(err)
	}
	if after := nft(t, name, "-a", "list", "table", "inet", "twill"); after != before {
		t.Errorf("a Sync of an unchanged table rewrote it:\nbefore\n%s\nafter\n%s", before, after)
	}
}

// Each way of breaking twill's table by hand is seen by Drift and repaired
// by the Keeper within 5 s, set off by the change itself (its poll is an
// hour away). Other tables, kube-proxy's iptables-nft chains among them,
// are left as they were.
func TestPrivilegedTableDriftRepaired(t *testing.T) {
	name := netnstest.New(t, "nftd")
	tb := tableIn(t, name)
	nft(t, name, "add table ip foreign; add chain ip foreign fchain { type filter hook forward priority 10; policy accept; }; add rule ip foreign fchain ip saddr 192.0.2.1 drop")
	nft(t, name, "add table ip kube-proxy; add chain ip kube-proxy services; add rule ip kube-proxy services ip daddr 10.96.0.1 return")
	if out, err := netnstest.Exec(name, "sh", "-c", "iptables -t nat -N KUBE-SERVICES && iptables -t nat -A KUBE-SERVICES -d 10.96.0.10/32 -j RETURN && iptables -t nat -A POSTROUTING -j KUBE-SERVICES"); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	others := func() string {
		out, err := netnstest.Exec(name, "sh", "-c", "nft list table ip foreign; nft list table ip kube-proxy; iptables-save -t nat | grep -v '^#'")
		if err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		return out
	}
	before := others()

	if err := tb.Sync(); err != nil {
		t.Fatal(err)
	}
	handle := func(chain, comment string) string {
		for _, l := range strings.Split(nft(t, name, "-a", "list", "chain", "inet", "twill", chain), "\n") {
			if i := strings.Index(l, "# handle "); i > 0 && strings.Contains(l, comment) {
				return strings.TrimSpace(l[i+len("# handle "):])
			}
		}
		t.Fatalf("no rule %q in chain %s", comment, chain)
		return ""
	}
	cases := []struct {
		name, drift string
		breakIt     func() string
	}{
		{"table flushed", "missing rule in postrouting: twill: pod to pod (ipv4)", func() string { return "flush table inet twill" }},
		{"table deleted", "missing table inet twill", func() string { return "delete table inet twill" }},
		{"chain deleted", "missing chain inet twill forward", func() string { return "delete chain inet twill forward" }},
		{"rule deleted", "missing rule in postrouting: twill: pod to outside (ipv4)", func() string {
			return "delete rule inet twill postrouting handle " + handle("postrouting", "pod to outside (ipv4)")
		}},
		{"rule altered", "wrong rule in forward", func() string {
			return `replace rule inet twill forward handle ` + handle("forward", "from pods (ipv4)") + ` ip saddr 10.244.0.0/24 accept comment "twill: from pods (ipv4)"`
		}},
		{"rule added", "extra rule in forward", func() string { return "add rule inet twill forward drop" }},
		{"chain policy changed", "wrong chain inet twill forward", func() string {
			return "add chain inet twill forward { type filter hook forward priority filter; policy drop; }"
		}},
	}
	// Drift names what changed, and Sync repairs it.
	for _, tc := range cases {
		t.Run("drift/"+tc.name, func(t *testing.T) {
			cmd := tc.breakIt()
			nft(t, name, cmd)
			d, err := tb.Drift()
			if err != nil {
				t.Fatal(err)
			}
			lines := "missing " + strings.Join(d.Missing, "|missing ") + "|wrong " + strings.Join(d.Wrong, "|wrong ") + "|extra " + strings.Join(d.Extra, "|extra ")
			if !strings.Contains(lines, tc.drift) {
				t.Errorf("after `nft %s`, drift %q lacks %q", cmd, lines, tc.drift)
			}
			if err := tb.Sync(); err != nil {
				t.Fatal(err)
			}
			if d, err := tb.Drift(); err != nil || !d.Clean() {
				t.Fatalf("after Sync: %+v (%v)", d, err)
			}
		})
	}

	// The Keeper repairs each within 5 s, set off by the change itself.
	target, err := ns.GetNS("/var/run/netns/" + name)
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close()
	k := &network.Keeper{Logger: tb.Logger, Rules: tb, Resync: time.Hour, WatchedResync: time.Hour,
		Watch: netnstest.WatchIn(target, nl.WatchNftables)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- k.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	for _, tc := range cases {
		t.Run("repair/"+tc.name, func(t *testing.T) {
			// The first Keeper sync may still be on its way.
			waitClean(t, tb, name, "before")
			nft(t, name, tc.breakIt())
			t.Logf("repaired in %v", waitClean(t, tb, name, tc.name))
		})
	}
	if after := others(); after != before {
		t.Errorf("tables twill does not own changed:\nbefore\n%s\nafter\n%s", before, after)
	}
}

// waitClean waits up to 5 s for twill's table to equal the desired one.
func waitClean(t *testing.T, tb *Table, name, what string) time.Duration {
	t.Helper()
	start := time.Now()
	for deadline := start.Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		d, err := tb.Drift()
		if err == nil && d.Clean() {
			return time.Since(start)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not repaired within 5 s: %+v (%v)\n%s", what, d, err, nft(t, name, "-a", "list", "ruleset"))
		}
	}
}
