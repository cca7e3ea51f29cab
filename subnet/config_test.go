package subnet

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
)

func TestParseConfigDefaults(t *testing.T) {
	tests := []struct {
		name           string
		in             string
		len            int
		min, max       string
		backend        string
		count          uint64
		ipv6, ipv6only bool
	}{
		{name: "flannel default", in: `{"Network":"10.244.0.0/16"}`, len: 24, min: "10.244.1.0", max: "10.244.255.0", backend: "vxlan", count: 255},
		{name: "lowercase keys", in: `{"network":"10.244.0.0/16","subnetlen":26,"backend":{"type":"host-gw"}}`, len: 26, min: "10.244.0.64", max: "10.244.255.192", backend: "host-gw", count: 1023},
		{name: "slash 22 still /24", in: `{"Network":"10.0.0.0/22"}`, len: 24, min: "10.0.1.0", max: "10.0.3.0", backend: "vxlan", count: 3},
		{name: "slash 23 halves", in: `{"Network":"10.0.0.0/23"}`, len: 24, min: "10.0.1.0", max: "10.0.1.0", backend: "vxlan", count: 1},
		{name: "slash 24 halves", in: `{"Network":"10.0.0.0/24"}`, len: 25, min: "10.0.0.128", max: "10.0.0.128", backend: "vxlan", count: 1},
		{name: "explicit range", in: `{"Network":"10.0.0.0/8","SubnetMin":"10.5.0.0","SubnetMax":"10.5.9.0","Backend":{"Type":"host-gw"}}`, len: 24, min: "10.5.0.0", max: "10.5.9.0", backend: "host-gw", count: 10},
		{name: "dual stack", in: `{"Network":"10.244.0.0/16","EnableIPv6":true,"IPv6Network":"fd00:10::/56"}`, len: 24, min: "10.244.1.0", max: "10.244.255.0", backend: "vxlan", count: 255, ipv6: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := ParseConfig([]byte(tt.in))
			if err != nil {
				t.Fatal(err)
			}
			if c.SubnetLen != tt.len || c.SubnetMin.String() != tt.min || c.SubnetMax.String() != tt.max {
				t.Errorf("got len %d min %s max %s; want %d %s %s", c.SubnetLen, c.SubnetMin, c.SubnetMax, tt.len, tt.min, tt.max)
			}
			if c.BackendType != tt.backend {
				t.Errorf("backend %q, want %q", c.BackendType, tt.backend)
			}
			if got := c.SubnetCount(); got != tt.count {
				t.Errorf("SubnetCount %d, want %d", got, tt.count)
			}
			if tt.ipv6 && (c.IPv6SubnetLen != 64 || c.IPv6SubnetMin != netip.MustParseAddr("fd00:10:0:1::")) {
				t.Errorf("ipv6 len %d min %s", c.IPv6SubnetLen, c.IPv6SubnetMin)
			}
		})
	}
}

func TestParseConfigRejects(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want []string // every fragment must be in the error
	}{
		{"not json", `{"Network":`, []string{"net-conf.json", "decoding"}},
		{"unknown key", `{"Network":"10.0.0.0/16","Netwrok":"x"}`, []string{"Netwrok", "unknown key"}},
		{"missing network", `{}`, []string{"Network", "required"}},
		{"bad cidr", `{"Network":"10.0.0.0/33"}`, []string{"Network", "10.0.0.0/33"}},
		{"host bits", `{"Network":"10.0.0.1/16"}`, []string{"Network", "10.0.0.1/16", "10.0.0.0/16"}},
		{"v6 as network", `{"Network":"fd00::/48"}`, []string{"Network", "fd00::/48", "IPv4"}},
		{"subnetlen too long", `{"Network":"10.0.0.0/16","SubnetLen":31}`, []string{"SubnetLen", "31", "between 17 and 30"}},
		{"subnetlen too short", `{"Network":"10.0.0.0/16","SubnetLen":16}`, []string{"SubnetLen", "16"}},
		{"min outside", `{"Network":"10.0.0.0/16","SubnetMin":"10.1.0.0"}`, []string{"SubnetMin", "10.1.0.0", "outside"}},
		{"min unaligned", `{"Network":"10.0.0.0/16","SubnetMin":"10.0.1.7"}`, []string{"SubnetMin", "10.0.1.7", "aligned"}},
		{"max below min", `{"Network":"10.0.0.0/16","SubnetMin":"10.0.9.0","SubnetMax":"10.0.2.0"}`, []string{"SubnetMax", "10.0.2.0", "below"}},
		{"max not ip", `{"Network":"10.0.0.0/16","SubnetMax":"ten"}`, []string{"SubnetMax", "ten"}},
		{"backend not object", `{"Network":"10.0.0.0/16","Backend":"vxlan"}`, []string{"Backend", "object"}},
		{"backend type number", `{"Network":"10.0.0.0/16","Backend":{"Type":7}}`, []string{"Backend.Type", "7"}},
		{"both families off", `{"Network":"10.0.0.0/16","EnableIPv4":false}`, []string{"EnableIPv4"}},
		{"v6 missing network", `{"Network":"10.0.0.0/16","EnableIPv6":true}`, []string{"IPv6Network", "required"}},
		{"trailing data", `{"Network":"10.0.0.0/16"} {}`, []string{"trailing"}},
		{"EnableNFTables not a bool", `{"Network":"10.0.0.0/16","EnableNFTables":"yes"}`, []string{`EnableNFTables "yes"`, "true or false"}},
		// Type errors name the field and the value given.
		{"subnetlen string", `{"Network":"10.0.0.0/16","SubnetLen":"abc"}`, []string{`SubnetLen "abc"`, "number"}},
		{"subnetlen float", `{"Network":"10.0.0.0/16","SubnetLen":24.5}`, []string{`SubnetLen "24.5"`, "whole number"}},
		{"network number", `{"Network":10}`, []string{`Network "10"`, "string"}},
		{"enableipv6 string", `{"Network":"10.0.0.0/16","EnableIPv6":"yes"}`, []string{`EnableIPv6 "yes"`, "true or false"}},
		{"lower-case key type error", `{"network":"10.0.0.0/16","subnetlen":[1]}`, []string{`SubnetLen "[1]"`, "number"}},
		{"not an object", `[1,2]`, []string{"net-conf.json", "[1,2]", "JSON object"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseConfig([]byte(tt.in))
			if err == nil {
				t.Fatal("accepted")
			}
			if !errors.Is(err, ErrInvalidConfig) {
				t.Errorf("error %v does not wrap ErrInvalidConfig", err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

func TestConfigContains(t *testing.T) {
	c, err := ParseConfig([]byte(`{"Network":"10.244.0.0/16"}`))
	if err != nil {
		t.Fatal(err)
	}
	for s, want := range map[string]bool{
		"10.244.3.0/24": true, "10.245.3.0/24": false, "10.244.3.0/25": false, "10.244.0.0/16": false,
	} {
		if got := c.Contains(netip.MustParsePrefix(s)); got != want {
			t.Errorf("Contains(%s) = %v, want %v", s, got, want)
		}
	}
}

func FuzzParseConfig(f *testing.F) {
	for _, s := range []string{
		`{"Network":"10.244.0.0/16","Backend":{"Type":"host-gw"}}`,
		`{"network":"10.0.0.0/8","subnetlen":20,"subnetmin":"10.1.0.0","subnetmax":"10.2.0.0"}`,
		`{"Network":"10.0.0.0/16","EnableIPv6":true,"IPv6Network":"fd00::/48","IPv6SubnetLen":64}`,
		`{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"fd00::/120"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseConfig(data)
		if err != nil {
			return
		}
		// Whatever is accepted must be self-consistent.
		if c.EnableIPv4 {
			if !c.Network.Contains(c.SubnetMin) || !c.Network.Contains(c.SubnetMax) || c.SubnetMax.Less(c.SubnetMin) {
				t.Fatalf("accepted inconsistent range %s..%s in %s", c.SubnetMin, c.SubnetMax, c.Network)
			}
			if c.SubnetLen <= c.Network.Bits() || c.SubnetLen > 30 {
				t.Fatalf("accepted SubnetLen %d for %s", c.SubnetLen, c.Network)
			}
			if c.SubnetCount() == 0 {
				t.Fatal("accepted an empty range")
			}
		}
		if c.BackendType == "" {
			t.Fatal("empty backend type")
		}
	})
}

// flannel's EnableNFTables is accepted and kept, absent stays unset.
func TestConfigEnableNFTables(t *testing.T) {
	for in, want := range map[string]string{
		`{"Network":"10.0.0.0/16"}`:                        "unset",
		`{"Network":"10.0.0.0/16","EnableNFTables":true}`:  "true",
		`{"Network":"10.0.0.0/16","enablenftables":false}`: "false",
	} {
		c, err := ParseConfig([]byte(in))
		if err != nil {
			t.Fatalf("%s: %v", in, err)
		}
		got := "unset"
		if c.EnableNFTables != nil {
			got = fmt.Sprint(*c.EnableNFTables)
		}
		if got != want {
			t.Errorf("%s: EnableNFTables %s, want %s", in, got, want)
		}
	}
}

// A node's backend data goes in the lease fields of the families the
// cluster has, and only those.
func TestForFamilies(t *testing.T) {
	d := json.RawMessage(`{"VNI":1}`)
	for _, c := range []struct {
		v4, v6         bool
		wantV4, wantV6 bool
	}{{true, false, true, false}, {false, true, false, true}, {true, true, true, true}} {
		v4, v6 := (&Config{EnableIPv4: c.v4, EnableIPv6: c.v6}).ForFamilies(d)
		if (v4 != nil) != c.wantV4 || (v6 != nil) != c.wantV6 {
			t.Errorf("EnableIPv4 %v EnableIPv6 %v: BackendData %s, BackendV6Data %s", c.v4, c.v6, v4, v6)
		}
	}
}
