package vxlan

import (
	"fmt"
	"net"
	"strings"
	"testing"

	"github.com/twill-net/twill/nl"
	"github.com/twill-net/twill/subnet"
	"github.com/twill-net/twill/testsupport/golden"
)

// TestDesiredStateGolden pins the kernel objects vxlan renders for a small
// peer set, one per line, as an operator would list them.
func TestDesiredStateGolden(t *testing.T) {
	o := options(t, `{"Type":"vxlan","DirectRouting":true}`)
	peers := []subnet.Lease{
		lease("10.244.2.0/24", "10.0.0.2", "0a:00:00:00:00:02"),
		lease("10.244.3.0/24", "10.0.0.3", "0a:00:00:00:00:03"),
		lease("10.244.4.0/24", "192.168.1.4", "0a:00:00:00:00:04"), // same segment: direct
		lease("10.244.5.0/24", "10.0.0.5", "bad"),
	}
	var b strings.Builder
	l := Local{Config: Config{VNI: 1, DirectRouting: true}, Ext: o.ExtIface, Dev: 7, IPv4: true}
	refused := DesiredState(l, peers, func(i int) (net.HardwareAddr, error) {
		return ParseData(1, peers[i].Attrs.BackendData)
	}, Emitters{
		Route: func(r nl.Route) { fmt.Fprintf(&b, "route %s\n", r) },
		Neigh: func(n nl.Neigh) {
			fmt.Fprintf(&b, "neigh %s lladdr %s dev#%d permanent\n", n.IP, net.HardwareAddr(n.HardwareAddr), n.LinkIndex)
		},
		FDB: func(n nl.Neigh) {
			fmt.Fprintf(&b, "fdb %s dst %s dev#%d self permanent\n", net.HardwareAddr(n.HardwareAddr), n.IP, n.LinkIndex)
		},
	})
	for _, r := range refused {
		fmt.Fprintf(&b, "refused %s\n", r)
	}
	golden.Check(t, "desired", []byte(b.String()))
}
