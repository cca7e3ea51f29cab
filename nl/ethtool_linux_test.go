package nl

import (
	"strings"
	"testing"

	"github.com/twill-net/twill/testsupport/netnstest"
)

// TestTXChecksum turns a vxlan device's transmit checksum offload off and
// on again in another namespace, as ethtool -k there shows it. The device
// exists only in that namespace: a request sent to the caller's would fail.
func TestTXChecksum(t *testing.T) {
	netnstest.RequireRoot(t)
	ns := netnstest.New(t, "ethtool")
	dev := "vx" + netnstest.RunID()
	netnstest.IP(t, ns, "link", "add", dev, "type", "vxlan", "id", "42", "dstport", "4789", "local", "127.0.0.1")
	h, err := Open(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	ethtool := func() string {
		out, err := netnstest.Exec(ns, "ethtool", "-k", dev)
		if err != nil {
			t.Fatalf("ethtool -k %s: %v: %s", dev, err, out)
		}
		for _, l := range strings.Split(out, "\n") {
			if f, ok := strings.CutPrefix(strings.TrimSpace(l), FeatureTXChecksum+": "); ok {
				return f
			}
		}
		t.Fatalf("ethtool -k %s has no %s:\n%s", dev, FeatureTXChecksum, out)
		return ""
	}
	for _, on := range []bool{false, true} {
		if err := h.SetTXChecksum(dev, on); err != nil {
			t.Fatal(err)
		}
		want := map[bool]string{true: "on", false: "off"}[on]
		if got := ethtool(); !strings.HasPrefix(got, want) {
			t.Fatalf("after SetTXChecksum(%v), ethtool -k says %s %s", on, FeatureTXChecksum, got)
		}
		if got, err := h.TXChecksum(dev); err != nil || got != on {
			t.Fatalf("TXChecksum: %v, %v; want %v", got, err, on)
		}
	}
	if _, err := h.TXChecksum("nosuch0"); err == nil || !strings.Contains(err.Error(), "nosuch0") {
		t.Fatalf("TXChecksum of a missing device: %v", err)
	}
}
