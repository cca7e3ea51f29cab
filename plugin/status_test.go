package plugin

import (
	"net/netip"
	"testing"
)

func TestRangeSize(t *testing.T) {
	for _, tc := range []struct {
		first, last string
		want        int
	}{
		{"10.0.0.2", "10.0.0.254", 253},
		{"10.0.0.2", "10.0.0.2", 1},
		{"10.0.0.3", "10.0.0.2", 0},
		{"10.0.0.2", "10.0.255.254", 65533},
		{"10.0.0.2", "10.255.255.254", 1<<24 - 3},
		{"10.0.0.2", "11.255.255.254", maxRangeSize},
		{"fd00::2", "fd00::ffff:ffff", maxRangeSize},
		{"fd00::2", "fd00::1:0:0", maxRangeSize},
		{"fd00::2", "fd00::ff", 254},
		{"10.0.0.2", "fd00::ff", 0},
	} {
		if got := rangeSize(netip.MustParseAddr(tc.first), netip.MustParseAddr(tc.last)); got != tc.want {
			t.Errorf("rangeSize(%s, %s) = %d, want %d", tc.first, tc.last, got, tc.want)
		}
	}
}
