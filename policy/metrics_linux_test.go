package policy

import (
	"context"
	"io"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/twill-net/twill/nl/nlfake"
)

// The packets the kernel counted against a pod's default deny are the
// denied packets of the policies that select it, and an allow rule's are
// its policy's; the table is the one an Enforcer wrote.
func TestCollectorCountsWhatTheTableCounted(t *testing.T) {
	k := &nlfake.Nftables{}
	tb := &Table{Kernel: k}
	src := &fakeSource{s: snapshot(testPolicy("y", "deny", nil, nil), testPolicy("y", "from-x", nil, func(sp *networkingv1NetworkPolicySpec) {
		sp.Ingress = fromNamespaces("x")
	})), synced: make(chan struct{})}
	close(src.synced)
	e := &Enforcer{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Source: src, Kernel: tb, Node: "n1"}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx, []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")}) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	for deadline := time.Now().Add(10 * time.Second); !slices.Equal(e.Selected("y/a").Ingress, []string{"y/deny", "y/from-x"}); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("y/a not selected by y/deny and y/from-x within 10 s: %+v", e.Selected("y/a"))
		}
	}
	if got := e.PodByIP(netip.MustParseAddr("10.244.1.3")); got != "y/a" {
		t.Errorf("PodByIP(10.244.1.3) = %q, want y/a", got)
	}
	if rs := e.Ruleset(); !slices.ContainsFunc(rs.Chains, func(c Chain) bool { return c.Name == ChainName("in", "y/a") }) {
		t.Errorf("the ruleset as last written lacks y/a's chain: %v", chainNames(rs))
	}
	k.Count(denyComment("in", "y/a"), 7)
	k.Count("allow y/from-x", 3)
	c := &Collector{Counters: tb.Counters, Enforcer: e}
	want := `
# HELP twill_netpol_packets_total Packets allowed by a NetworkPolicy's rules, and denied to or from the pods it selects.
# TYPE twill_netpol_packets_total counter
twill_netpol_packets_total{policy="y/deny",verdict="denied"} 7
twill_netpol_packets_total{policy="y/from-x",verdict="allowed"} 3
twill_netpol_packets_total{policy="y/from-x",verdict="denied"} 7
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), "twill_netpol_packets_total"); err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount(c, "twill_netpol_unknown_dropped_packets_total"); n != 1 {
		t.Errorf("twill_netpol_unknown_dropped_packets_total: %d series, want 1", n)
	}
}
