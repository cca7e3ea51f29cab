package hostgw

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/twill-net/twill/backend"
	"github.com/twill-net/twill/nl"
	"github.com/twill-net/twill/subnet"
	"github.com/twill-net/twill/testsupport/golden"
)

// TestDesiredRoutesGolden pins the routes host-gw renders, dual-stack
// peers included.
func TestDesiredRoutesGolden(t *testing.T) {
	ext := backend.ExternalInterface{Link: nl.Link{Index: 2, Name: "eth0"},
		OnLink: []netip.Prefix{netip.MustParsePrefix("192.168.7.0/24"), netip.MustParsePrefix("fd99::/64")}}
	dual := peer("10.244.4.0/24", "192.168.7.4")
	dual.IPv6Subnet = netip.MustParsePrefix("fd00:10:0:4::/64")
	dual.Attrs.PublicIPv6 = netip.MustParseAddr("fd99::4")
	var b strings.Builder
	unreachable := DesiredRoutes(ext, []subnet.Lease{
		peer("10.244.2.0/24", "192.168.7.2"), peer("10.244.3.0/24", "172.16.0.3"), dual,
	}, func(r nl.Route) { fmt.Fprintf(&b, "route %s\n", r) })
	for _, u := range unreachable {
		fmt.Fprintf(&b, "unreachable %s\n", u)
	}
	golden.Check(t, "routes", []byte(b.String()))
}
