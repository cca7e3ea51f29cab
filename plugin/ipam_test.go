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
			got, err := reserveNext(s, "c", "eth"+string(rune('0'+i)), subnet, 0, nil)
			if err != nil || got.String() != want {
				t.Fatalf("%s after %q: reservation %d = %v, %v; want %s", tc.subnet, tc.lastReserved, i, got, err, want)
			}
			if _, err := os.Stat(filepath.Join(dir, "net", want)); err != nil {
				t.Fatalf("%s: no allocation file for %s: %v", tc.subnet, want, err)
			}
		}
		if got, err := reserveNext(s, "c", "full", subnet, 0, nil); !errors.Is(err, errNoAddress) {
			t.Fatalf("%s full: got %v, %v; want errNoAddress", tc.subnet, got, err)
		}
		s.Close()
	}
	if _, err := reserveNext(nil, "c", "eth0", netip.MustParsePrefix("10.0.0.0/31"), 0, nil); err == nil {
		t.Fatal("a /31 has no address to hand out, want an error")
	}
}

// TestAllocateSkipsAddressesOfOtherStores: on a node being switched from
// flannel, flannel's host-local store (network cbr0) holds its running
// pods' addresses. Twill's plugin, whatever its own network's name, hands
// none of them out, in either family, and records nothing in cbr0's store.
func TestAllocateSkipsAddressesOfOtherStores(t *testing.T) {
	dataDir := t.TempDir()
	flannel := filepath.Join(dataDir, "cbr0")
	if err := os.MkdirAll(flannel, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"10.244.7.2", "10.244.7.3", "fd00:7::2", "last_reserved_ip.0", "lock", "10.9.9.9"} {
		if err := os.WriteFile(filepath.Join(flannel, f), []byte("flannel-pod\r\neth0"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	c := &NetConf{DataDir: dataDir}
	c.Name = "twill"
	noLink := func(string) (bool, error) { return false, nil }
	v4, v6 := netip.MustParsePrefix("10.244.7.0/24"), netip.MustParsePrefix("fd00:7::/64")
	got, err := allocate(c, "twill-pod", "eth0", noLink, v4, v6)
	if err != nil {
		t.Fatal(err)
	}
	if want := []netip.Addr{netip.MustParseAddr("10.244.7.4"), netip.MustParseAddr("fd00:7::3")}; len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("allocated %v beside flannel's store, want %v (the first addresses flannel's pods do not hold)", got, want)
	}
	ents, _ := os.ReadDir(flannel)
	if len(ents) != 6 {
		t.Errorf("flannel's store changed: %d entries, want 6", len(ents))
	}
}

// TestReleaseElsewhere: a pod flannel wired that leaves through twill's
// plugin, named otherwise than flannel's network, frees its address in
// flannel's store, and only its own.
func TestReleaseElsewhere(t *testing.T) {
	dataDir := t.TempDir()
	for _, d := range []string{"cbr0", "twill"} {
		if err := os.MkdirAll(filepath.Join(dataDir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for f, holder := range map[string]string{"cbr0/10.244.7.2": "flannel-pod\r\neth0", "cbr0/10.244.7.3": "other-pod\r\neth0", "twill/10.244.7.4": "flannel-pod\r\neth1"} {
		if err := os.WriteFile(filepath.Join(dataDir, f), []byte(holder), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	c := &NetConf{DataDir: dataDir}
	c.Name = "twill"
	if err := releaseElsewhere(c, "flannel-pod", "eth0"); err != nil {
		t.Fatal(err)
	}
	for f, want := range map[string]bool{"cbr0/10.244.7.2": false, "cbr0/10.244.7.3": true, "twill/10.244.7.4": true} {
		if _, err := os.Stat(filepath.Join(dataDir, f)); (err == nil) != want {
			t.Errorf("%s present %v after the release, want %v", f, err == nil, want)
		}
	}
}
