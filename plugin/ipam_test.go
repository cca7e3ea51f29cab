package plugin

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/containernetworking/plugins/plugins/ipam/host-local/backend/disk"
)

// TestReserveNextOrder checks the order host-local hands addresses out
// in, which twill keeps so that its on-disk store stays host-local's:
// the first address after the one reserved last, skipping the subnet's
// first (the gateway) and, in IPv4, its broadcast address; wrapping at the
// end; nothing once every address is taken.
func TestReserveNextOrder(t *testing.T) {
	for _, tc := range []struct {
		subnet       string
		lastReserved string // written before the first reservation; "" for none
		want         []string
	}{
		{"10.244.7.0/29", "", []string{"10.244.7.2", "10.244.7.3", "10.244.7.4", "10.244.7.5", "10.244.7.6"}},
		{"10.244.7.0/29", "10.244.7.5", []string{"10.244.7.6", "10.244.7.2", "10.244.7.3", "10.244.7.4", "10.244.7.5"}},
		{"10.244.7.0/29", "10.244.7.6", []string{"10.244.7.2", "10.244.7.3", "10.244.7.4", "10.244.7.5", "10.244.7.6"}},
		{"10.244.7.0/29", "10.244.8.9", []string{"10.244.7.2", "10.244.7.3", "10.244.7.4", "10.244.7.5", "10.244.7.6"}}, // outside: start over
		{"10.244.7.0/30", "", []string{"10.244.7.2"}},
		{"10.244.7.1/30", "", []string{"10.244.7.2"}}, // host bits, as subnet.env writes the node's own
		{"fd00:244::/126", "", []string{"fd00:244::2", "fd00:244::3"}},
		{"fd00:244::/126", "fd00:244::2", []string{"fd00:244::3", "fd00:244::2"}},
	} {
		dir := t.TempDir()
		s, err := disk.New("net", dir)
		if err != nil {
			t.Fatal(err)
		}
		if tc.lastReserved != "" {
			if err := os.WriteFile(filepath.Join(dir, "net", "last_reserved_ip.0"), []byte(tc.lastReserved), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		subnet := netip.MustParsePrefix(tc.subnet)
		for i, want := range tc.want {
			got, err := reserveNext(s, "c", "eth"+string(rune('0'+i)), subnet, 0)
			if err != nil || got.String() != want {
				t.Fatalf("%s after %q: reservation %d = %v, %v; want %s", tc.subnet, tc.lastReserved, i, got, err, want)
			}
			if _, err := os.Stat(filepath.Join(dir, "net", want)); err != nil {
				t.Fatalf("%s: no allocation file for %s: %v", tc.subnet, want, err)
			}
		}
		if got, err := reserveNext(s, "c", "full", subnet, 0); !errors.Is(err, errNoAddress) {
			t.Fatalf("%s full: got %v, %v; want errNoAddress", tc.subnet, got, err)
		}
		s.Close()
	}
	if _, err := reserveNext(nil, "c", "eth0", netip.MustParsePrefix("10.0.0.0/31"), 0); err == nil {
		t.Fatal("a /31 has no address to hand out, want an error")
	}
}
