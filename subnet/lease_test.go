package subnet

import (
	"encoding/json"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

func TestLeaseAttrsFlannelLayout(t *testing.T) {
	a := LeaseAttrs{
		PublicIP:    netip.MustParseAddr("192.168.0.7"),
		BackendType: "vxlan",
		BackendData: json.RawMessage(`{"VNI":1,"VtepMAC":"aa:bb:cc:dd:ee:ff"}`),
	}
	b, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	const want = `{"PublicIP":"192.168.0.7","PublicIPv6":null,"BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"aa:bb:cc:dd:ee:ff"},"BackendV6Data":null}`
	if string(b) != want {
		t.Fatalf("got  %s\nwant %s", b, want)
	}
	var back LeaseAttrs
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if !back.Equal(a) {
		t.Fatalf("round trip changed attrs: %+v", back)
	}
}

func TestParseLeaseAttrsRejects(t *testing.T) {
	tests := []struct{ name, in, want string }{
		{"not json", `{"PublicIP":`, "decoding"},
		{"bad ip", `{"PublicIP":"10.0.0.300","BackendType":"host-gw"}`, `PublicIP "10.0.0.300"`},
		{"v6 as v4", `{"PublicIP":"fd00::1","BackendType":"host-gw"}`, `PublicIP "fd00::1"`},
		{"bad v6", `{"PublicIP":"10.0.0.1","PublicIPv6":"1.2.3.4","BackendType":"host-gw"}`, `PublicIPv6 "1.2.3.4"`},
		{"no address", `{"BackendType":"host-gw"}`, "public address"},
		{"no type", `{"PublicIP":"10.0.0.1"}`, "BackendType"},
		{"data not object", `{"PublicIP":"10.0.0.1","BackendType":"vxlan","BackendData":[1]}`, "BackendData [1]"},
		{"node agent not a name", `{"PublicIP":"10.0.0.1","BackendType":"vxlan","NodeAgent":"twill\u001b[2J"}`, `NodeAgent "twill\x1b[2J"`},
		{"node agent not a string", `{"PublicIP":"10.0.0.1","BackendType":"vxlan","NodeAgent":7}`, "NodeAgent"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseLeaseAttrs([]byte(tt.in))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want it to mention %q", err, tt.want)
			}
		})
	}
}

// TestNodeAgentRoundTrip: twilld's marker survives a write and a read,
// and a lease without it (flanneld's) reads as an empty one.
func TestNodeAgentRoundTrip(t *testing.T) {
	a := LeaseAttrs{PublicIP: netip.MustParseAddr("10.0.0.1"), BackendType: "host-gw", NodeAgent: NodeAgentTwill}
	b, err := json.Marshal(a)
	if err != nil || !strings.Contains(string(b), `"NodeAgent":"twill"`) {
		t.Fatalf("marshalled %s (%v)", b, err)
	}
	back, err := ParseLeaseAttrs(b)
	if err != nil || back.NodeAgent != NodeAgentTwill || !back.Equal(a) {
		t.Fatalf("read back %+v (%v)", back, err)
	}
	flannel, err := ParseLeaseAttrs([]byte(`{"PublicIP":"10.0.0.1","PublicIPv6":null,"BackendType":"host-gw","BackendData":null,"BackendV6Data":null}`))
	if err != nil || flannel.NodeAgent != "" || flannel.Equal(a) {
		t.Fatalf("flannel's lease read as %+v (%v), want no NodeAgent, and unequal to twill's", flannel, err)
	}
}

func TestSubnetKey(t *testing.T) {
	v4, v6 := netip.MustParsePrefix("10.244.3.0/24"), netip.MustParsePrefix("fd00:1:2:3::/64")
	for _, tc := range []struct {
		v4, v6 netip.Prefix
		key    string
	}{{v4, netip.Prefix{}, "10.244.3.0-24"}, {v4, v6, "10.244.3.0-24&fd00:1:2:3::-64"}, {netip.Prefix{}, v6, "fd00:1:2:3::-64"}} {
		if got := SubnetKey(tc.v4, tc.v6); got != tc.key {
			t.Errorf("SubnetKey = %q, want %q", got, tc.key)
		}
		g4, g6, err := ParseSubnetKey(tc.key)
		if err != nil || g4 != tc.v4 || g6 != tc.v6 {
			t.Errorf("ParseSubnetKey(%q) = %s %s %v", tc.key, g4, g6, err)
		}
	}
	for _, bad := range []string{"", "10.0.0.0", "10.0.0.1-24", "10.0.0.0-24&10.1.0.0-24", "x-24", "10.0.0.0-33"} {
		if _, _, err := ParseSubnetKey(bad); err == nil {
			t.Errorf("ParseSubnetKey(%q) accepted", bad)
		}
	}
}

func TestCheckPeer(t *testing.T) {
	cfg, err := ParseConfig([]byte(`{"Network":"10.244.0.0/16"}`))
	if err != nil {
		t.Fatal(err)
	}
	local := Lease{Subnet: netip.MustParsePrefix("10.244.1.0/24")}
	ip := netip.MustParseAddr("192.168.1.2")
	tests := []struct {
		name   string
		subnet string
		pub    netip.Addr
		want   string
	}{
		{"ok", "10.244.2.0/24", ip, ""},
		{"outside network", "10.99.2.0/24", ip, "not a /24 inside Network 10.244.0.0/16"},
		{"wrong length", "10.244.2.0/25", ip, "not a /24"},
		{"overlaps local", "10.244.1.0/24", ip, "overlaps the local subnet"},
		{"no public ip", "10.244.2.0/24", netip.Addr{}, "no PublicIP"},
		{"loopback", "10.244.2.0/24", netip.MustParseAddr("127.0.0.1"), "PublicIP 127.0.0.1 is a loopback address"},
		{"multicast", "10.244.2.0/24", netip.MustParseAddr("224.0.0.1"), "PublicIP 224.0.0.1 is a multicast address"},
		{"broadcast", "10.244.2.0/24", netip.MustParseAddr("255.255.255.255"), "PublicIP 255.255.255.255 is the broadcast address"},
		{"link-local", "10.244.2.0/24", netip.MustParseAddr("169.254.7.7"), "PublicIP 169.254.7.7 is a link-local address"},
		{"unspecified", "10.244.2.0/24", netip.MustParseAddr("0.0.0.0"), "PublicIP 0.0.0.0 is unspecified"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := CheckPeer(cfg, local, Lease{Subnet: netip.MustParsePrefix(tt.subnet), Attrs: LeaseAttrs{PublicIP: tt.pub}})
			if tt.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want %q", err, tt.want)
			}
		})
	}
}

func TestCheckProgrammable(t *testing.T) {
	cfg, err := ParseConfig([]byte(`{"Network":"10.244.0.0/16","Backend":{"Type":"host-gw"}}`))
	if err != nil {
		t.Fatal(err)
	}
	local := Lease{Subnet: netip.MustParsePrefix("10.244.1.0/24")}
	peer := func(sub, typ string) Lease {
		return Lease{Subnet: netip.MustParsePrefix(sub), Attrs: LeaseAttrs{PublicIP: netip.MustParseAddr("192.168.1.2"), BackendType: typ}}
	}
	for _, tt := range []struct {
		peer Lease
		want string
	}{
		{peer("10.244.2.0/24", "host-gw"), ""},
		{peer("10.244.2.0/24", "vxlan"), `backend type "vxlan", but this cluster runs "host-gw"`},
		{peer("10.99.2.0/24", "host-gw"), "not a /24 inside Network"},
	} {
		err := CheckProgrammable(cfg, local, tt.peer)
		if (tt.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tt.want)) {
			t.Errorf("%s (%s): %v, want %q", tt.peer, tt.peer.Attrs.BackendType, err, tt.want)
		}
	}
}

func TestCheckPeerPublicIPRanges(t *testing.T) {
	cfg, err := ParseConfig([]byte(`{"Network":"10.244.0.0/16","PublicIPRanges":["192.168.0.0/16","fd00:99::/64"]}`))
	if err != nil {
		t.Fatal(err)
	}
	peer := func(v4, v6 string) Lease {
		l := Lease{Subnet: netip.MustParsePrefix("10.244.2.0/24"), Attrs: LeaseAttrs{PublicIP: netip.MustParseAddr(v4)}}
		if v6 != "" {
			l.Attrs.PublicIPv6 = netip.MustParseAddr(v6)
		}
		return l
	}
	for _, tt := range []struct {
		name string
		l    Lease
		want string
	}{
		{"inside", peer("192.168.3.4", "fd00:99::4"), ""},
		{"v4 outside", peer("10.1.2.3", ""), "PublicIP 10.1.2.3 is outside PublicIPRanges [192.168.0.0/16]"},
		{"v6 outside", peer("192.168.3.4", "fd00:1::4"), "PublicIPv6 fd00:1::4 is outside PublicIPRanges [fd00:99::/64]"},
		{"v6 loopback", peer("192.168.3.4", "::1"), "PublicIPv6 ::1 is a loopback address"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := CheckPeer(cfg, Lease{}, tt.l)
			if (tt.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tt.want)) {
				t.Fatalf("error %v, want %q", err, tt.want)
			}
		})
	}
	if _, err := ParseConfig([]byte(`{"Network":"10.244.0.0/16","PublicIPRanges":["192.168.0.1/16"]}`)); err == nil ||
		!strings.Contains(err.Error(), `PublicIPRanges "192.168.0.1/16"`) {
		t.Fatalf("a range with host bits: %v", err)
	}
}

func FuzzParseLeaseAttrs(f *testing.F) {
	f.Add([]byte(`{"PublicIP":"192.168.0.7","BackendType":"vxlan","BackendData":{"VNI":1}}`))
	f.Add([]byte(`{"PublicIP":"10.0.0.1","PublicIPv6":"fd00::1","BackendType":"host-gw","BackendData":null}`))
	f.Add([]byte(`{"PublicIP":"10.0.0.1","BackendType":"host-gw","BackendData":null,"NodeAgent":"twill"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		a, err := ParseLeaseAttrs(data)
		if err != nil {
			return
		}
		b, err := json.Marshal(a)
		if err != nil {
			t.Fatalf("accepted attrs do not marshal: %v", err)
		}
		back, err := ParseLeaseAttrs(b)
		if err != nil {
			t.Fatalf("re-parse of %s: %v", b, err)
		}
		if !back.Equal(a) {
			t.Fatalf("round trip changed %+v into %+v", a, back)
		}
	})
}

func FuzzParseSubnetKey(f *testing.F) {
	f.Add("10.244.3.0-24")
	f.Add("10.244.3.0-24&fd00::-64")
	f.Fuzz(func(t *testing.T, key string) {
		v4, v6, err := ParseSubnetKey(key)
		if err != nil {
			return
		}
		back, _, err := ParseSubnetKey(SubnetKey(v4, v6))
		if err != nil || back != v4 {
			t.Fatalf("round trip of %q: %s %v", key, back, err)
		}
	})
}

// Peers refuses a lease claiming the local node's public IP, and of two
// claiming one address keeps the one that sorts first, naming the holder.
func TestPeersOneLeasePerAddress(t *testing.T) {
	cfg, err := ParseConfig([]byte(`{"Network":"10.244.0.0/16","Backend":{"Type":"host-gw"}}`))
	if err != nil {
		t.Fatal(err)
	}
	l := func(s, ip string) Lease {
		return Lease{Subnet: netip.MustParsePrefix(s), Attrs: LeaseAttrs{PublicIP: netip.MustParseAddr(ip), BackendType: "host-gw"}}
	}
	local := l("10.244.1.0/24", "10.0.0.1")
	snap := Snapshot{Leases: []Lease{local, l("10.244.3.0/24", "10.0.0.2"), l("10.244.2.0/24", "10.0.0.2"), l("10.244.4.0/24", "10.0.0.1"), l("10.244.5.0/24", "10.0.0.5")}}
	peers, refused := Peers(cfg, local, snap, nil)
	var got []string
	for _, p := range peers {
		got = append(got, p.String())
	}
	if !slices.Equal(got, []string{"10.244.2.0/24", "10.244.5.0/24"}) {
		t.Errorf("peers %v, want 10.244.2.0/24 (the first of the two on 10.0.0.2) and 10.244.5.0/24", got)
	}
	if why := refused["10.244.3.0/24"]; !strings.Contains(why, "public IP 10.0.0.2 is held by 10.244.2.0/24") {
		t.Errorf("10.244.3.0/24 refused for %q", why)
	}
	if why := refused["10.244.4.0/24"]; !strings.Contains(why, "public IP 10.0.0.1 is held by this node") {
		t.Errorf("10.244.4.0/24 refused for %q", why)
	}
}

// Of two leases claiming one public IP, the older record keeps it however
// their subnets sort: a lease written later, with a lower subnet, to copy
// a node's address takes nothing from it. A lease of unknown age comes
// after every known one.
func TestPeersOlderClaimantKeepsTheAddress(t *testing.T) {
	cfg, err := ParseConfig([]byte(`{"Network":"10.244.0.0/16","Backend":{"Type":"host-gw"}}`))
	if err != nil {
		t.Fatal(err)
	}
	l := func(s, ip string, since int64) Lease {
		return Lease{Subnet: netip.MustParsePrefix(s), Attrs: LeaseAttrs{PublicIP: netip.MustParseAddr(ip), BackendType: "host-gw"}, Since: since}
	}
	local := l("10.244.9.0/24", "10.0.0.9", 1)
	victim := l("10.244.5.0/24", "10.0.0.5", 40)
	for _, copier := range []Lease{l("10.244.0.0/24", "10.0.0.5", 41), l("10.244.1.0/24", "10.0.0.5", 0)} {
		for _, order := range [][]Lease{{local, victim, copier}, {copier, victim, local}} {
			peers, refused := Peers(cfg, local, Snapshot{Leases: order}, nil)
			if len(peers) != 1 || peers[0].Subnet != victim.Subnet {
				t.Fatalf("copier %s (since %d), listed %v: peers %v, want the victim %s alone", copier, copier.Since, order, peers, victim)
			}
			if why := refused[copier.String()]; !strings.Contains(why, "public IP 10.0.0.5 is held by 10.244.5.0/24") {
				t.Errorf("the copier %s refused for %q", copier, why)
			}
		}
	}
	if ClaimOrder(Lease{Since: 3}, Lease{Since: 2}) <= 0 || ClaimOrder(Lease{Since: 0}, Lease{Since: 9}) <= 0 || ClaimOrder(victim, victim) != 0 {
		t.Error("ClaimOrder: want the lower Since first, an unknown one last, a lease equal to itself")
	}
}
