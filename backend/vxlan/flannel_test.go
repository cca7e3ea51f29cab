package vxlan

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/twill-net/twill/backend"
	"github.com/twill-net/twill/backend/backendtest"
	"github.com/twill-net/twill/nl"
	"github.com/twill-net/twill/nl/nlfake"
	"github.com/twill-net/twill/subnet"
)

// flannelNode is a fake kernel as flanneld leaves it when it stops: eth0,
// and flannel.1 (VNI 1, port 8472) with its VTEP address and a route to a
// peer through it.
func flannelNode(t *testing.T, name string, vni int) (*nlfake.Kernel, nl.Link, net.HardwareAddr) {
	t.Helper()
	k := &nlfake.Kernel{}
	eth := k.AddLink("eth0", 1500, true, netip.MustParsePrefix("192.168.1.1/24"))
	mac := net.HardwareAddr{0x6e, 0x11, 0x22, 0x33, 0x44, 0x55}
	fl, err := k.VXLANAdd(nl.VXLAN{Name: name, VNI: vni, Port: DefaultPort, SrcAddr: netip.MustParseAddr("192.168.1.1"),
		VtepDevIndex: eth.Index, MTU: 1450, HardwareAddr: mac})
	if err != nil {
		t.Fatal(err)
	}
	if err := k.LinkSetUp(fl.Index); err != nil {
		t.Fatal(err)
	}
	if err := k.RouteReplace(nl.Route{Dst: netip.MustParsePrefix("10.244.2.0/24"), Gw: netip.MustParseAddr("10.244.2.0"), LinkIndex: fl.Index, OnLink: true}); err != nil {
		t.Fatal(err)
	}
	peerMAC := []byte{0x6e, 0, 0, 0, 0, 2}
	if err := errors.Join(k.NeighBatch([]nl.NeighOp{
		{Op: nl.OpReplace, Neigh: nl.Neigh{LinkIndex: fl.Index, IP: netip.MustParseAddr("10.244.2.0"), HardwareAddr: peerMAC, Permanent: true}},
		{Op: nl.OpReplace, Neigh: nl.Neigh{LinkIndex: fl.Index, IP: netip.MustParseAddr("192.168.1.2"), HardwareAddr: peerMAC, Permanent: true}, FDB: true},
	})...); err != nil {
		t.Fatal(err)
	}
	return k, eth, mac
}

func startOn(t *testing.T, k *nlfake.Kernel, eth nl.Link, state string) (subnet.LeaseAttrs, *Network) {
	t.Helper()
	opts := backendtest.Options(t, `{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan"}}`, k, backend.ExternalInterface{Link: eth,
		Addr: netip.MustParseAddr("192.168.1.1"), PublicIP: netip.MustParseAddr("192.168.1.1")})
	opts.StateDir = state
	_, attrs, nw := backendtest.Attach(t, New, opts, "10.244.1.0/24")
	return attrs, nw.Network.(*Network)
}

func TestTakeOverFlannelsDevice(t *testing.T) {
	k, eth, mac := flannelNode(t, "flannel.1", 1)
	state := t.TempDir()
	attrs, nw := startOn(t, k, eth, state)
	if _, err := k.LinkByName("flannel.1"); err == nil {
		t.Error("flannel.1 is still there")
	}
	if _, v, _, err := k.VXLANByName("twill.1"); err != nil || net.HardwareAddr(v.HardwareAddr).String() != mac.String() || v.VNI != 1 || v.Port != DefaultPort {
		t.Errorf("twill.1: %+v (%v); want VNI 1, port 8472 and flannel's MAC %s", v, err, mac)
	}
	if !strings.Contains(string(attrs.BackendData), mac.String()) {
		t.Errorf("published %s, not flannel's VTEP MAC %s: the peers still on flannel would lose this node", attrs.BackendData, mac)
	}
	// flannel's route is on twill.1 at once, as twill's, before the
	// lease is taken and the first reconcile done: pods keep talking.
	if s := dump(t, k); len(s.routes) != 1 || !strings.Contains(s.routes[0], "10.244.2.0/24 via 10.244.2.0 dev twill.1 proto 167 onlink") ||
		len(s.neigh) != 1 || s.neigh[0] != "10.244.2.0 lladdr 6e:00:00:00:00:02" || len(s.fdb) != 1 || s.fdb[0] != "6e:00:00:00:00:02 dst 192.168.1.2" {
		t.Errorf("right after the takeover: routes %q, neighbours %q, fdb %q; want flannel's on twill.1", s.routes, s.neigh, s.fdb)
	}
	// The peer is twill's now.
	if err := nw.Reconcile(context.Background(), []subnet.Lease{lease("10.244.2.0/24", "192.168.1.2", "6e:00:00:00:00:02")}); err != nil {
		t.Fatal(err)
	}
	s := dump(t, k)
	if len(s.routes) != 1 || !strings.Contains(s.routes[0], "dev twill.1 proto 167") {
		t.Errorf("routes after the takeover: %q", s.routes)
	}
	// A restart keeps flannel's MAC: it is in the state directory now.
	if attrs2, _ := startOn(t, k, eth, state); string(attrs2.BackendData) != string(attrs.BackendData) {
		t.Errorf("after a restart the node publishes %s, before %s", attrs2.BackendData, attrs.BackendData)
	}
}

// TestFlannelDeviceOfAnotherVNIStays: a flannel.1 that does not carry VNI
// 1 is not in twill.1's way, nor flannel's VTEP for it: it stays.
func TestFlannelDeviceOfAnotherVNIStays(t *testing.T) {
	k, eth, _ := flannelNode(t, "flannel.1", 7)
	startOn(t, k, eth, t.TempDir())
	if _, err := k.LinkByName("flannel.1"); err != nil {
		t.Errorf("flannel.1 (VNI 7) was removed: %v", err)
	}
}

// A takeover that fails once flannel's device is gone (the kernel refused
// the new one) still left flannel's MAC in the state directory: the next
// start, which finds no flannel.1, publishes it, so the peers still on
// flannel keep sending to this node.
func TestTakeOverFailingAfterTheSwapKeepsFlannelsMAC(t *testing.T) {
	k, eth, mac := flannelNode(t, "flannel.1", 1)
	state := t.TempDir()
	refused := false
	k.Fail = func(what string) error {
		if what == "vxlan add" && !refused {
			refused = true
			return errors.New("the kernel refused (the test's)")
		}
		return nil
	}
	opts := backendtest.Options(t, `{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan"}}`, k, backend.ExternalInterface{Link: eth,
		Addr: netip.MustParseAddr("192.168.1.1"), PublicIP: netip.MustParseAddr("192.168.1.1")})
	opts.StateDir = state
	b, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Prepare(context.Background()); err == nil {
		t.Fatal("Prepare succeeded with the kernel refusing the new device")
	}
	if attrs, _ := startOn(t, k, eth, state); !strings.Contains(string(attrs.BackendData), mac.String()) {
		t.Errorf("after the failed takeover the node publishes %s, not flannel's MAC %s", attrs.BackendData, mac)
	}
}
