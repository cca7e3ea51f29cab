package vxlan

import (
	"net"
	"net/netip"

	"github.com/twill-net/twill/nl"
	"github.com/twill-net/twill/subnet"
)

// parsed is a peer's BackendData, parsed, with the reconcile that last
// used it.
type parsed struct {
	mac net.HardwareAddr
	err error
	gen uint64
}

// macOf parses raw BackendData once per distinct value.
func (n *Network) macOf(raw []byte) (net.HardwareAddr, error) {
	e, ok := n.parsed[string(raw)]
	if !ok {
		e.mac, e.err = parseMAC(n.b.cfg.VNI, raw)
	}
	e.gen = n.gen
	n.parsed[string(raw)] = e
	return e.mac, e.err
}

// peerRec is what Reconcile last computed for one peer.
type peerRec struct {
	raw     string // BackendData as published
	pub     netip.Addr
	v6      *recV6 // nil when the lease has nothing of IPv6
	objects PeerObjects
	err     error
	name    string
	gen     uint64
}

// recV6 is what a peer's record holds of its IPv6 side, kept apart: most
// clusters have none, and there is a record per peer.
type recV6 struct {
	raw string // BackendV6Data as published
	pub netip.Addr
	sub netip.Prefix
}

// same reports whether p is what rec was computed from.
func (rec *peerRec) same(p subnet.Lease) bool {
	a := &p.Attrs
	if rec.pub != a.PublicIP || rec.raw != string(a.BackendData) {
		return false
	}
	if rec.v6 == nil {
		return !a.PublicIPv6.IsValid() && !p.IPv6Subnet.IsValid() && len(a.BackendV6Data) == 0
	}
	return rec.v6.pub == a.PublicIPv6 && rec.v6.sub == p.IPv6Subnet && rec.v6.raw == string(a.BackendV6Data)
}

// view is what peers' objects depend on, on the device with index dev.
func (n *Network) view(dev int) Local {
	return Local{Config: n.b.cfg, Ext: n.b.opts.ExtIface, Dev: dev, IPv4: n.local.Subnet.IsValid(), IPv6: n.local.IPv6Subnet.IsValid(),
		UnderlayV6: n.b.dev.SrcAddr.Is6()}
}

// peerMAC is a peer's VTEP MAC, its data parsed once per distinct value.
func (n *Network) peerMAC(p subnet.Lease) (net.HardwareAddr, error) { return PeerMAC(p, n.macOf) }

// compute is a peer's desired objects as l sees them.
func (n *Network) compute(l Local, p subnet.Lease) *peerRec {
	var (
		mac    net.HardwareAddr
		macErr error
	)
	if l.overlay(p) {
		mac, macErr = n.peerMAC(p)
	}
	o, err := ObjectsFor(l, p, mac, macErr)
	a := &p.Attrs
	rec := &peerRec{raw: string(a.BackendData), pub: a.PublicIP, objects: o, err: err, name: p.String(), gen: n.gen}
	if a.PublicIPv6.IsValid() || p.IPv6Subnet.IsValid() || len(a.BackendV6Data) > 0 {
		rec.v6 = &recV6{raw: string(a.BackendV6Data), pub: a.PublicIPv6, sub: p.IPv6Subnet}
	}
	return rec
}

// programs reports whether this node programs anything for p: it has a
// subnet in a family the node has.
func (n *Network) programs(p subnet.Lease) bool {
	return (n.local.Subnet.IsValid() && p.Subnet.IsValid()) || (n.local.IPv6Subnet.IsValid() && p.IPv6Subnet.IsValid())
}

// recKey names a peer's record: its IPv4 subnet, or its IPv6 one in an
// IPv6-only cluster.
func recKey(p subnet.Lease) nl.Key { return (nl.Route{Dst: primary(p)}).Key() }

// countMAC adds sign to the count of peers programmed with rec's VTEP MAC.
func (n *Network) countMAC(rec *peerRec, sign int) {
	if !rec.objects.Overlay {
		return
	}
	m := [6]byte(rec.objects.FDB.HardwareAddr)
	if n.macs[m] += sign; n.macs[m] <= 0 {
		delete(n.macs, m)
	}
}
