package vxlan

import (
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/twill-net/twill/backend"
	"github.com/twill-net/twill/nl"
	"github.com/twill-net/twill/subnet"
)

func options(t *testing.T, backendJSON string) backend.Options {
	cfg, err := subnet.ParseConfig([]byte(`{"Network":"10.244.0.0/16","Backend":` + backendJSON + `}`))
	if err != nil {
		t.Fatal(err)
	}
	return backend.Options{
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Config: cfg,
		ExtIface: backend.ExternalInterface{Link: nl.Link{Index: 2, Name: "eth0", MTU: 1500}, Addr: netip.MustParseAddr("192.168.1.1"),
			PublicIP: netip.MustParseAddr("192.168.1.1"), OnLink: []netip.Prefix{netip.MustParsePrefix("192.168.1.0/24")}},
	}
}

func TestNewConfig(t *testing.T) {
	b, err := New(options(t, `{"Type":"vxlan"}`))
	if err != nil {
		t.Fatal(err)
	}
	dev := b.(*Backend).dev
	if dev.Name != "twill.1" || dev.VNI != 1 || dev.Port != 8472 || dev.MTU != 1450 || dev.Learning {
		t.Fatalf("defaults: %+v", dev)
	}
	for _, tt := range []struct{ in, want string }{
		{`{"Type":"vxlan","VNI":0}`, "Backend.VNI 0"},
		{`{"Type":"vxlan","VNI":16777216}`, "Backend.VNI 16777216"},
		{`{"Type":"vxlan","Port":70000}`, "Backend.Port 70000"},
		{`{"Type":"vxlan","MTU":1480}`, "Backend.MTU 1480: must be between 576 and 1450"},
		{`{"Type":"vxlan","Learning":true}`, `unknown key "Learning"`},
		{`{"Type":"vxlan","VNI":"one"}`, "Backend.VNI"},
	} {
		if _, err := New(options(t, tt.in)); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: error %v, want %q", tt.in, err, tt.want)
		}
	}
}

func lease(s, pub, mac string) subnet.Lease {
	data, _ := json.Marshal(Data{VNI: 1, VtepMAC: mac})
	return subnet.Lease{Subnet: netip.MustParsePrefix(s), Attrs: subnet.LeaseAttrs{PublicIP: netip.MustParseAddr(pub), BackendType: Type, BackendData: data}}
}

func TestDesiredState(t *testing.T) {
	o := options(t, `{"Type":"vxlan","DirectRouting":true}`)
	bad := lease("10.244.9.0/24", "10.0.0.9", "not-a-mac")
	var (
		routes     []nl.Route
		neigh, fdb []nl.Neigh
	)
	peers := []subnet.Lease{
		lease("10.244.2.0/24", "10.0.0.2", "0a:00:00:00:00:02"),    // routed: overlay
		lease("10.244.3.0/24", "192.168.1.3", "0a:00:00:00:00:03"), // same segment: direct
		bad,
		// Rogue public IPs never become an FDB entry, a neighbour or a route.
		lease("10.244.10.0/24", "127.0.0.1", "0a:00:00:00:00:0a"),
		lease("10.244.11.0/24", "224.0.0.1", "0a:00:00:00:00:0b"),
		lease("10.244.12.0/24", "255.255.255.255", "0a:00:00:00:00:0c"),
	}
	l := Local{Config: Config{VNI: 1, DirectRouting: true}, Ext: o.ExtIface, Dev: 7, IPv4: true}
	refused := DesiredState(l, peers, func(i int) (net.HardwareAddr, error) {
		return ParseData(1, peers[i].Attrs.BackendData)
	}, Emitters{
		Route: func(r nl.Route) { routes = append(routes, r) },
		Neigh: func(n nl.Neigh) { neigh = append(neigh, n) },
		FDB:   func(n nl.Neigh) { fdb = append(fdb, n) },
	})
	if len(routes) != 2 {
		t.Fatalf("routes %v", routes)
	}
	overlay, direct := routes[0], routes[1]
	if overlay.Gw.String() != "10.244.2.0" || overlay.LinkIndex != 7 || !overlay.OnLink {
		t.Errorf("overlay route %v: want via the peer's VTEP IP, onlink, on the VTEP", overlay)
	}
	if direct.Gw.String() != "192.168.1.3" || direct.LinkIndex != 2 {
		t.Errorf("direct route %v: want via the peer's public IP on eth0", direct)
	}
	if len(neigh) != 1 || neigh[0].IP.String() != "10.244.2.0" || net.HardwareAddr(neigh[0].HardwareAddr).String() != "0a:00:00:00:00:02" {
		t.Errorf("neighbours %v", neigh)
	}
	if len(fdb) != 1 || fdb[0].IP.String() != "10.0.0.2" {
		t.Errorf("fdb %v: want one entry to the routed peer's public IP (direct peers get none)", fdb)
	}
	if len(refused) != 4 || !strings.Contains(strings.Join(refused, "\n"), "not-a-mac") ||
		!strings.Contains(strings.Join(refused, "\n"), "224.0.0.1 is a multicast address") {
		t.Errorf("refused %v", refused)
	}
}

func TestParseData(t *testing.T) {
	for raw, want := range map[string]string{
		`{"VNI":2,"VtepMAC":"0a:00:00:00:00:01"}`: "VNI 2",
		`{"VNI":1,"VtepMAC":"zz"}`:                `VtepMAC "zz"`,
		`{"VNI":1,`:                               "BackendData",
	} {
		if _, err := ParseData(1, []byte(raw)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseData(%s) error %v, want %q", raw, err, want)
		}
	}
}
