package vxlan

import (
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/twill-net/twill/subnet"
)

func TestScreenMACs(t *testing.T) {
	own, _ := net.ParseMAC("0a:00:00:00:00:05")
	local := subnet.Lease{Subnet: netip.MustParsePrefix("10.244.5.0/24")}
	mac := func(p subnet.Lease) (net.HardwareAddr, error) { return ParseData(1, p.Attrs.BackendData) }
	never := func(subnet.Lease) bool { return false }

	aged := func(l subnet.Lease, since int64) subnet.Lease { l.Since = since; return l }
	t.Run("of peers sharing a MAC the oldest keeps it, whatever their subnets", func(t *testing.T) {
		peers := []subnet.Lease{
			aged(lease("10.244.2.0/24", "10.0.0.2", "0a:00:00:00:00:aa"), 9),
			aged(lease("10.244.3.0/24", "10.0.0.3", "0a:00:00:00:00:aa"), 4),
			aged(lease("10.244.6.0/24", "10.0.0.6", "0a:00:00:00:00:aa"), 7),
			lease("10.244.4.0/24", "10.0.0.4", "0a:00:00:00:00:04"),
		}
		kept, sc := screenMACs(local, own, peers, never, mac, nil)
		if len(kept) != 2 || kept[0].Subnet.String() != "10.244.3.0/24" || kept[1].Subnet.String() != "10.244.4.0/24" {
			t.Fatalf("kept %v", kept)
		}
		if len(sc.refused) != 2 || !strings.HasPrefix(sc.refused[0], "10.244.2.0/24: VTEP MAC 0a:00:00:00:00:aa is 10.244.3.0/24's too") ||
			!strings.HasPrefix(sc.refused[1], "10.244.6.0/24: ") || sc.takeNew != "" {
			t.Fatalf("screen %+v", sc)
		}
	})
	t.Run("a younger peer copying this node's MAC is refused, its subnet lower; this node keeps it", func(t *testing.T) {
		local := aged(local, 5)
		peers := []subnet.Lease{aged(lease("10.244.1.0/24", "10.0.0.1", own.String()), 6), aged(lease("10.244.9.0/24", "10.0.0.9", own.String()), 8)}
		kept, sc := screenMACs(local, own, peers, never, mac, nil)
		if len(kept) != 0 || sc.takeNew != "" || len(sc.refused) != 2 || !strings.Contains(sc.refused[0], "is this node's too") {
			t.Fatalf("kept %v screen %+v", kept, sc)
		}
	})
	t.Run("an older peer with this node's MAC keeps it, its subnet higher; this node takes another", func(t *testing.T) {
		local := aged(local, 5)
		peers := []subnet.Lease{aged(lease("10.244.9.0/24", "10.0.0.9", own.String()), 3), aged(lease("10.244.1.0/24", "10.0.0.1", own.String()), 4)}
		kept, sc := screenMACs(local, own, peers, never, mac, nil)
		if len(kept) != 1 || kept[0].Subnet.String() != "10.244.9.0/24" || sc.takeNew != "10.244.9.0/24" || len(sc.refused) != 1 {
			t.Fatalf("kept %v screen %+v", kept, sc)
		}
	})
	t.Run("without ages, the lower subnet is the older", func(t *testing.T) {
		kept, sc := screenMACs(local, own, []subnet.Lease{lease("10.244.9.0/24", "10.0.0.9", own.String())}, never, mac, nil)
		if len(kept) != 0 || sc.takeNew != "" || !strings.Contains(sc.refused[0], "is this node's too") {
			t.Fatalf("kept %v screen %+v", kept, sc)
		}
		kept, sc = screenMACs(local, own, []subnet.Lease{lease("10.244.1.0/24", "10.0.0.1", own.String())}, never, mac, nil)
		if len(kept) != 1 || sc.takeNew != "10.244.1.0/24" || len(sc.refused) != 0 {
			t.Fatalf("kept %v screen %+v", kept, sc)
		}
	})
	t.Run("direct peers have no VTEP", func(t *testing.T) {
		peers := []subnet.Lease{lease("10.244.1.0/24", "10.0.0.1", own.String()), lease("10.244.2.0/24", "10.0.0.2", own.String())}
		kept, sc := screenMACs(local, own, peers, func(subnet.Lease) bool { return true }, mac, nil)
		if len(kept) != 2 || sc.takeNew != "" || len(sc.refused) != 0 {
			t.Fatalf("kept %v screen %+v", kept, sc)
		}
	})
}

// TestStoredMACIdentity: a stored MAC is used on the machine that chose it,
// and not on another one (a copied state directory).
func TestStoredMACIdentity(t *testing.T) {
	dir := t.TempDir()
	o := options(t, `{"Type":"vxlan"}`)
	o.StateDir = dir
	o.ExtIface.Link.HardwareAddr = net.HardwareAddr{0x52, 0x54, 0, 0, 0, 1}
	b, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	first, _ := b.(*Backend).vtepMAC()
	chosen := randomMAC(func(net.HardwareAddr) bool { return false })
	b.(*Backend).storeMAC(chosen) // as after a collision
	if again, _ := b.(*Backend).vtepMAC(); again.String() != chosen.String() {
		t.Fatalf("the stored MAC %s was not kept on its own machine: %s", chosen, again)
	}
	// The same state directory on another machine (another interface
	// MAC, another public IP).
	o2 := o
	o2.ExtIface.Link.HardwareAddr = net.HardwareAddr{0x52, 0x54, 0, 0, 0, 2}
	o2.ExtIface.PublicIP = netip.MustParseAddr("192.168.1.2")
	b2, _ := New(o2)
	other, _ := b2.(*Backend).vtepMAC()
	if other.String() == chosen.String() || other.String() == first.String() {
		t.Fatalf("a copied state directory's MAC %s was trusted (first %s)", other, first)
	}
	// The old format (a bare MAC) is trusted only where it is derived.
	if err := os.WriteFile(filepath.Join(dir, "vxlan-1.mac"), []byte(first.String()+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if m, _ := b.(*Backend).vtepMAC(); m.String() != first.String() {
		t.Fatalf("old-format file on its own machine: %s, want %s", m, first)
	}
	if err := os.WriteFile(filepath.Join(dir, "vxlan-1.mac"), []byte(first.String()+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if m, _ := b2.(*Backend).vtepMAC(); m.String() == first.String() {
		t.Fatal("old-format file from another machine was trusted")
	}
}
