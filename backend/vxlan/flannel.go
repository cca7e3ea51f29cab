package vxlan

import (
	"errors"
	"fmt"
	"net"
	"strconv"

	"github.com/twill-net/twill/nl"
)

// FlannelDeviceName is the VTEP device flanneld makes for a VNI. flanneld
// leaves it in place when it stops, holding the VNI and UDP port twill's
// own device needs, with the VTEP MAC flannel published in the node's
// lease.
func FlannelDeviceName(vni int) string { return "flannel." + strconv.Itoa(vni) }

// takeOverFlannel replaces flannel's VTEP device on a node switched from
// flannel, and returns the MAC to keep (nil when there is no such device):
// flannel's, so that the peers still on flannel, which handle each lease
// change once, keep sending to this node while its lease changes hands.
// twill's device is made in its place with what went through flannel's
// (MoveDevice): flanneld's routes, neighbour and forwarding entries, as
// twill's (protocol 167), which its first reconcile then makes its own. The
// node's pods are cut off for the milliseconds of the swap only, not until
// the lease is taken and the first reconcile done.
func (b *Backend) takeOverFlannel() (net.HardwareAddr, error) {
	name := FlannelDeviceName(b.cfg.VNI)
	link, have, isVXLAN, err := b.k.VXLANByName(name)
	switch {
	case errors.Is(err, nl.ErrLinkNotFound):
		return nil, nil
	case err != nil:
		return nil, err
	case !isVXLAN || have.VNI != b.cfg.VNI:
		return nil, nil // not flannel's VTEP for this VNI: leave it alone
	}
	mac := net.HardwareAddr(append([]byte(nil), have.HardwareAddr...))
	if len(mac) != 6 {
		return nil, fmt.Errorf("taking over flannel's %s: its MAC %q is not an Ethernet address", name, mac)
	}
	// The MAC first: a twilld that fails past the swap finds no flannel.1
	// at its next start, and must publish flannel's MAC all the same.
	b.storeMAC(mac)
	want := b.dev
	want.HardwareAddr = mac
	dev, err := MoveDevice(b.k, link, want, nl.RouteProtocol)
	switch {
	case err != nil && dev.Index == 0:
		return nil, fmt.Errorf("taking over flannel's %s: %w", name, err)
	case err != nil:
		// The device is there; the first reconcile programs what did not
		// move.
		b.log.Warn("took over flannel's VTEP device, but not all that went through it moved", "device", name, "err", err)
	default:
		b.log.Info("took over flannel's VTEP device: its VNI, port and VTEP MAC are now "+DeviceName(b.cfg.VNI)+"'s, with the routes through it",
			"device", name, "vni", have.VNI, "mac", mac.String())
	}
	return mac, nil
}
