package hostport

import (
	"os"
	"slices"
	"testing"

	"github.com/twill-net/twill/nl/nft"
	"github.com/twill-net/twill/testsupport/netnstest"
)

// The kernel takes the table as written, reads back what Check compares,
// and keeps one pod's rules when another's go.
func TestPrivilegedKernelTakesTheTable(t *testing.T) {
	netnstest.RequireRoot(t)
	f, err := os.Open("/var/run/netns/" + netnstest.New(t, "hport"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	k := nft.Conn{NetNS: int(f.Fd())}
	mustAdd(t, k, "twA", podA, web, dns4, only6)
	mustAdd(t, k, "twB", podB, web)
	mustAdd(t, k, "twC", podB, dns4) // the base chains are in place: not written again
	if err := Check(k, "twA", podA, []Port{web, dns4, only6}); err != nil {
		t.Errorf("Check of what the kernel holds: %v", err)
	}
	if ok, err := baseInPlace(k); !ok || err != nil {
		t.Errorf("the base chains as the kernel reads them back differ from what Add writes (%v): each ADD would write them again", err)
	}
	for _, c := range []string{"prerouting", "output", "postrouting"} {
		if got := comments(t, k, c); len(got) != len(slices.Compact(slices.Clone(got))) {
			t.Errorf("chain %s: %q, want each base rule once", c, got)
		}
	}
	if had, err := Remove(k, "twA"); err != nil || !had {
		t.Fatalf("Remove twA: %v, %v", had, err)
	}
	if got, err := Owners(k); err != nil || !slices.Equal(got, []string{"twB", "twC"}) {
		t.Errorf("Owners after twA's DEL: %v, %v", got, err)
	}
	if err := Check(k, "twB", podB, []Port{web}); err != nil {
		t.Errorf("twB after twA's DEL: %v", err)
	}
}
