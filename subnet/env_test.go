package subnet

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestEnvRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "run", "subnet.env")
	want := Env{
		Network: netip.MustParsePrefix("10.244.0.0/16"), Subnet: netip.MustParsePrefix("10.244.7.0/24"),
		MTU: 1450, IPMasq: true, Backend: "host-gw", Netfilter: "nftables", Extra: map[string]string{"ENI_TABLE": "100"},
	}
	if err := WriteEnv(path, want); err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(path)
	for _, line := range []string{"TWILL_NETWORK=10.244.0.0/16", "TWILL_SUBNET=10.244.7.0/24", "TWILL_MTU=1450", "TWILL_IPMASQ=true", "TWILL_BACKEND=host-gw", "TWILL_NETFILTER=nftables", "TWILL_ENI_TABLE=100"} {
		if !strings.Contains(string(raw), line+"\n") {
			t.Errorf("subnet.env lacks %q:\n%s", line, raw)
		}
	}
	got, err := ReadEnv(path)
	if err != nil {
		t.Fatal(err)
	}
	if got.Network != want.Network || got.Subnet != want.Subnet || got.MTU != want.MTU || !got.IPMasq || got.Backend != want.Backend || got.Extra["ENI_TABLE"] != "100" {
		t.Fatalf("read back %+v", got)
	}
	// No temporary file is left next to it.
	ents, _ := os.ReadDir(filepath.Dir(path))
	if len(ents) != 1 {
		t.Fatalf("directory holds %d entries, want only subnet.env", len(ents))
	}
}

func TestReadEnvMissing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "subnet.env")
	_, err := ReadEnv(path)
	if !errors.Is(err, ErrNoEnv) || !strings.Contains(err.Error(), path) {
		t.Fatalf("error %v: want ErrNoEnv naming %s", err, path)
	}
}

func TestParseEnvRejects(t *testing.T) {
	base := "TWILL_NETWORK=10.244.0.0/16\nTWILL_SUBNET=10.244.7.0/24\nTWILL_MTU=1450\nTWILL_IPMASQ=false\nTWILL_BACKEND=vxlan\n"
	tests := []struct{ name, in, want string }{
		{"bad mtu", strings.Replace(base, "1450", "nine", 1), `TWILL_MTU "nine"`},
		{"tiny mtu", strings.Replace(base, "1450", "20", 1), `TWILL_MTU "20"`},
		{"bad subnet", strings.Replace(base, "10.244.7.0/24", "10.244.7.0", 1), `TWILL_SUBNET "10.244.7.0"`},
		{"subnet outside", strings.Replace(base, "10.244.7.0/24", "10.9.7.0/24", 1), "outside TWILL_NETWORK"},
		{"bad bool", strings.Replace(base, "false", "maybe", 1), `TWILL_IPMASQ "maybe"`},
		{"foreign key", base + "PATH=/bin\n", `key "PATH"`},
		{"bad netfilter", base + "TWILL_NETFILTER=ebtables\n", `TWILL_NETFILTER "ebtables": must be iptables or nftables`},
		{"no equals", base + "TWILL_X\n", "want KEY=VALUE"},
		{"repeated", base + "TWILL_MTU=1400\n", "repeated"},
		{"missing mtu", strings.Replace(base, "TWILL_MTU=1450\n", "", 1), "TWILL_MTU is not set"},
		{"empty", "", "neither"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseEnv([]byte(tt.in))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want %q", err, tt.want)
			}
		})
	}
}

func FuzzParseEnv(f *testing.F) {
	f.Add([]byte("TWILL_NETWORK=10.244.0.0/16\nTWILL_SUBNET=10.244.7.0/24\nTWILL_MTU=1450\nTWILL_IPMASQ=false\nTWILL_BACKEND=vxlan\n"))
	f.Add([]byte("# c\nTWILL_IPV6_NETWORK=fd00::/48\nTWILL_IPV6_SUBNET=fd00:0:0:1::/64\nTWILL_MTU=1430\nTWILL_IPMASQ=true\nTWILL_BACKEND=host-gw\nTWILL_X=y\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		e, err := ParseEnv(data)
		if err != nil {
			return
		}
		back, err := ParseEnv(e.Marshal())
		if err != nil {
			t.Fatalf("re-parse of %q: %v", e.Marshal(), err)
		}
		if back.Subnet != e.Subnet || back.MTU != e.MTU || back.Backend != e.Backend || len(back.Extra) != len(e.Extra) {
			t.Fatalf("round trip changed %+v into %+v", e, back)
		}
	})
}
