package network

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/twill-net/twill/testsupport/golden"
)

// TestRulesGolden pins the iptables rules twill renders, as iptables-save
// lines, for both families.
func TestRulesGolden(t *testing.T) {
	var b strings.Builder
	for _, np := range []NetworkPair{
		{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("10.244.3.0/24")},
		{netip.MustParsePrefix("fd00:10::/56"), netip.MustParsePrefix("fd00:10:0:3::/64")},
	} {
		fmt.Fprintf(&b, "# cluster %s, node %s, --ip-masq\n", np.Cluster, np.Local)
		for _, r := range DesiredRules(np.Cluster, np.Local, true) {
			fmt.Fprintf(&b, "-t %s -A %s %s\n", r.Table, r.Chain, strings.Join(r.Spec(), " "))
		}
	}
	for _, j := range Jumps {
		fmt.Fprintf(&b, "-t %s -I %s 1 -m comment --comment twill -j %s\n", j.Table, j.From, j.To)
	}
	golden.Check(t, "rules", []byte(b.String()))
}
