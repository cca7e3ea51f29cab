package plugin

import (
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
)

// DEL finds the attachment's allocations by prevResult's addresses, and
// releases its own alone: an address another pod holds now (a repeated
// DEL, after the address was reused) stays that pod's.
func TestDelReleasesOnlyItsOwnAllocations(t *testing.T) {
	c := &NetConf{NetConf: types.NetConf{Name: "twillnet"}, DataDir: t.TempDir()}
	dir := filepath.Join(c.DataDir, c.Name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(ip, id string) {
		if err := os.WriteFile(filepath.Join(dir, ip), []byte(id+"\r\neth0"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("10.244.1.2", "a")
	write("fd00:1::2", "a")
	write("10.244.1.3", "b") // was a's once, now b's
	write("10.244.1.4", "c")
	held := func() []string {
		ents, _ := os.ReadDir(dir)
		var out []string
		for _, e := range ents {
			out = append(out, e.Name())
		}
		return out
	}
	for _, tc := range []struct {
		name   string
		prev   []string
		mine   []string
		others []string
	}{
		{"by prevResult's addresses", []string{"10.244.1.2", "fd00:1::2"}, []string{"10.244.1.2", "fd00:1::2"}, nil},
		{"prevResult names an address reused since", []string{"10.244.1.3", "10.244.1.2"}, []string{"10.244.1.2"}, []string{"10.244.1.3"}},
		{"prevResult's addresses all reused: the store is read", []string{"10.244.1.3"}, []string{"10.244.1.2", "fd00:1::2"}, []string{"10.244.1.3", "10.244.1.4"}},
		{"no prevResult: the store is read", nil, []string{"10.244.1.2", "fd00:1::2"}, []string{"10.244.1.3", "10.244.1.4"}},
	} {
		var prev []netip.Addr
		for _, s := range tc.prev {
			prev = append(prev, netip.MustParseAddr(s))
		}
		mine, others := podReservations(dir, "a", "eth0", prev)
		var gotMine, gotOthers []string
		for _, rv := range mine {
			gotMine = append(gotMine, rv.IP.String())
		}
		for ip := range others {
			gotOthers = append(gotOthers, ip.String())
		}
		slices.Sort(gotMine)
		slices.Sort(gotOthers)
		if !slices.Equal(gotMine, tc.mine) || !slices.Equal(gotOthers, tc.others) {
			t.Errorf("%s: mine %v, others %v; want %v and %v", tc.name, gotMine, gotOthers, tc.mine, tc.others)
		}
	}
	// A stale finding is checked again under the lock: b's file stays.
	mine, _ := podReservations(dir, "a", "eth0", nil)
	stale := append(mine, reservation{IP: netip.MustParseAddr("10.244.1.3"), Path: filepath.Join(dir, "10.244.1.3"), ContainerID: "a", IfName: "eth0"})
	if err := releaseFiles(c, "a", "eth0", stale); err != nil {
		t.Fatal(err)
	}
	if got, want := held(), []string{"10.244.1.3", "10.244.1.4", "lock"}; !slices.Equal(got, want) {
		t.Errorf("after a's DEL the store holds %v, want %v", got, want)
	}
}
