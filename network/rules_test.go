package network

import (
	"net/netip"
	"strings"
	"testing"
)

func TestDesiredRules(t *testing.T) {
	cluster, local := netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("10.244.3.0/24")
	render := func(rs []Rule) string {
		var b strings.Builder
		for _, r := range rs {
			b.WriteString(r.Table + " " + r.Chain + " " + strings.Join(r.Spec(), " ") + "\n")
		}
		return b.String()
	}
	got := render(DesiredRules(cluster, local, true))
	for _, want := range []string{
		"nat TWILL-POSTRTG -s 10.244.0.0/16 -d 10.244.0.0/16 ",
		"nat TWILL-POSTRTG -s 10.244.0.0/16 ! -d 224.0.0.0/4 ",
		"-j MASQUERADE --random-fully",
		"nat TWILL-POSTRTG ! -s 10.244.0.0/16 -d 10.244.3.0/24 ",
		"filter TWILL-FWD -s 10.244.0.0/16 ",
		"filter TWILL-FWD -d 10.244.0.0/16 ",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("rules lack %q:\n%s", want, got)
		}
	}
	if noMasq := render(DesiredRules(cluster, local, false)); strings.Contains(noMasq, "nat") {
		t.Errorf("--ip-masq off still produces NAT rules:\n%s", noMasq)
	}
	v6 := render(MasqRules(netip.MustParsePrefix("fd00:10::/56"), netip.MustParsePrefix("fd00:10:0:3::/64")))
	if !strings.Contains(v6, "ff00::/8") {
		t.Errorf("IPv6 rules do not exempt IPv6 multicast:\n%s", v6)
	}
}
