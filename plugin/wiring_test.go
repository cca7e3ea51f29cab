package plugin

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/twill-net/twill/nl"
	"github.com/twill-net/twill/testsupport/golden"
)

// TestWiringGolden renders what ADD puts in the kernel (and CHECK
// verifies) for a dual-stack pod, and for an eni pod with its rules.
func TestWiringGolden(t *testing.T) {
	mac := []byte{0xee, 0xee, 0xee, 0xee, 0xee, 0xee}
	var b strings.Builder
	dual := newWiring("c0ffee", "eth0", 1450, []netip.Addr{netip.MustParseAddr("10.244.7.2"), netip.MustParseAddr("fd00:10:244:7::2")}, nil)
	b.WriteString("# dual-stack, host-gw or vxlan\n" + dual.Render(2, 7, mac))
	em := &eniMode{Mode: eniModeSecondaryIP, Table: 100, ToPod: 512, FromPod: 1536}
	e := newWiring("beef", "eth0", 9001, []netip.Addr{netip.MustParseAddr("10.10.1.20")}, em)
	b.WriteString("\n# eni, secondary-ip mode\n" + e.Render(2, 8, mac))
	golden.Check(t, "wiring", []byte(b.String()))

	r := dual.Result(nlLink("twabc", 7, mac), nlLink("eth0", 2, []byte{2, 0, 0, 0, 0, 2}), "/var/run/netns/p")
	if len(r.IPs) != 2 || r.IPs[0].Address.String() != "10.244.7.2/32" || r.IPs[1].Gateway.String() != "fe80::1" || len(r.Routes) != 2 {
		t.Errorf("result %+v", r)
	}
	if r.Interfaces[1].Sandbox != "/var/run/netns/p" || r.Interfaces[1].Mtu != 1450 || r.Interfaces[0].Mac != "ee:ee:ee:ee:ee:ee" {
		t.Errorf("interfaces %+v %+v", r.Interfaces[0], r.Interfaces[1])
	}
}

func nlLink(name string, index int, mac []byte) nl.Link {
	return nl.Link{Name: name, Index: index, HardwareAddr: mac}
}
