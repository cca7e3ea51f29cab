package allocations

import (
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/twill-net/twill/nl"
)

func TestReclaim(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	write := func(ip, id string, age time.Duration) {
		p := filepath.Join(dir, ip)
		if err := os.WriteFile(p, []byte(id+"\r\neth0"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, now.Add(-age), now.Add(-age)); err != nil {
			t.Fatal(err)
		}
	}
	write("10.244.1.2", "gone-old", time.Minute)  // pod gone long ago: reclaimed
	write("10.244.1.3", "alive", time.Minute)     // veth exists: kept
	write("10.244.1.4", "in-flight", time.Second) // an ADD between reserving and wiring: kept
	write("10.244.1.5", "gone-too", 2*time.Hour)  // reclaimed
	if err := os.WriteFile(filepath.Join(dir, "last_reserved_ip.0"), []byte("10.244.1.5"), 0o644); err != nil {
		t.Fatal(err)
	}
	links := map[string]bool{nl.PodLinkName("alive", "eth0"): true}
	gone, err := Reclaim(dir, Grace, now, func(name string) (bool, error) { return links[name], nil })
	if err != nil {
		t.Fatal(err)
	}
	var ips []string
	for _, r := range gone {
		ips = append(ips, r.IP.String())
	}
	slices.Sort(ips)
	if !slices.Equal(ips, []string{"10.244.1.2", "10.244.1.5"}) {
		t.Fatalf("reclaimed %v", ips)
	}
	left, _ := Records(dir)
	var kept []string
	for _, r := range left {
		kept = append(kept, r.ContainerID)
	}
	slices.Sort(kept)
	if !slices.Equal(kept, []string{"alive", "in-flight"}) {
		t.Fatalf("left %v", kept)
	}
	if _, err := os.Stat(filepath.Join(dir, "last_reserved_ip.0")); err != nil {
		t.Fatal("the store's own files must stay")
	}
}

// Read finds one address's allocation, and says when there is none.
func TestRead(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "10.244.1.7"), []byte("c1\r\neth0"), 0o644); err != nil {
		t.Fatal(err)
	}
	r, ok, err := Read(dir, netip.MustParseAddr("10.244.1.7"))
	if err != nil || !ok || r.ContainerID != "c1" || r.IfName != "eth0" || r.Path != filepath.Join(dir, "10.244.1.7") {
		t.Errorf("Read: %+v %v %v, want c1/eth0", r, ok, err)
	}
	if _, ok, err := Read(dir, netip.MustParseAddr("10.244.1.8")); ok || err != nil {
		t.Errorf("Read of a free address: ok %v, err %v; want neither", ok, err)
	}
}
