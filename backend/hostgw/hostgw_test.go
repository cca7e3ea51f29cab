package hostgw

import (
	"net/netip"
	"reflect"
	"testing"

	"github.com/twill-net/twill/backend"
	"github.com/twill-net/twill/nl"
	"github.com/twill-net/twill/subnet"
)

func peer(subnetS, ip string) subnet.Lease {
	return subnet.Lease{Subnet: netip.MustParsePrefix(subnetS), Attrs: subnet.LeaseAttrs{PublicIP: netip.MustParseAddr(ip), BackendType: Type}}
}

func TestDesiredRoutes(t *testing.T) {
	ext := backend.ExternalInterface{Link: nl.Link{Index: 7, Name: "eth0"}, OnLink: []netip.Prefix{netip.MustParsePrefix("192.168.7.0/24")}}
	var routes []nl.Route
	unreachable := DesiredRoutes(ext, []subnet.Lease{
		peer("10.244.2.0/24", "192.168.7.2"),
		peer("10.244.3.0/24", "172.16.0.3"),
	}, func(r nl.Route) { routes = append(routes, r) })
	want := []nl.Route{{Dst: netip.MustParsePrefix("10.244.2.0/24"), Gw: netip.MustParseAddr("192.168.7.2"), LinkIndex: 7}}
	if !reflect.DeepEqual(routes, want) {
		t.Errorf("routes %v, want %v", routes, want)
	}
	if !reflect.DeepEqual(unreachable, []string{"10.244.3.0/24 via 172.16.0.3"}) {
		t.Errorf("unreachable %v", unreachable)
	}
}
