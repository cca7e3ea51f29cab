package vxlan

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/twill-net/twill/backend"
	"github.com/twill-net/twill/nl"
	"github.com/twill-net/twill/subnet"
)

// The desired state: pure functions of the peers, tested without a kernel
// (golden_test.go renders it).

// Emitters receive the desired kernel objects.
type Emitters struct {
	Route func(nl.Route)
	Neigh func(nl.Neigh)
	FDB   func(nl.Neigh)
}

// Local is what a peer's objects depend on besides the peer.
type Local struct {
	Config Config
	Ext    backend.ExternalInterface
	// Dev is the VTEP device's link index.
	Dev int
	// IPv4 and IPv6 are the pod families the node has a subnet in; a
	// peer's subnet of another family is ignored.
	IPv4, IPv6 bool
	// UnderlayV6 is set when the overlay runs over IPv6: the FDB entries
	// point at peers' PublicIPv6 rather than their PublicIP.
	UnderlayV6 bool
}

func (l Local) underlayV4() bool { return !l.UnderlayV6 }

func (l Local) underlayFamily() string {
	if l.underlayV4() {
		return "IPv4"
	}
	return "IPv6"
}

// ParseData reads a peer's BackendData for the configured VNI.
func ParseData(vni int, raw []byte) (net.HardwareAddr, error) {
	mac, err := parseMAC(vni, raw)
	if err != nil {
		return nil, fmt.Errorf("BackendData %w", err)
	}
	return mac, nil
}

// parseMAC reads backend data ({"VNI":1,"VtepMAC":"…"}) for the
// configured VNI; its errors do not name the field.
func parseMAC(vni int, raw []byte) (net.HardwareAddr, error) {
	var data Data
	if err := json.Unmarshal(raw, &data); err != nil {
		return nil, fmt.Errorf("%s: %w", raw, err)
	}
	if data.VNI != vni {
		return nil, fmt.Errorf("VNI %d: this node uses VNI %d", data.VNI, vni)
	}
	mac, err := net.ParseMAC(data.VtepMAC)
	if err != nil || len(mac) != 6 {
		return nil, fmt.Errorf("VtepMAC %q: not a MAC address", data.VtepMAC)
	}
	return mac, nil
}

// PeerMAC is a peer's VTEP MAC, read with parse (parseMAC, perhaps
// cached): from BackendData when the lease has an IPv4 subnet, and from
// BackendV6Data when it has only an IPv6 one. One device carries both
// families, so a dual-stack peer that publishes BackendV6Data too must
// name the same MAC in it.
func PeerMAC(p subnet.Lease, parse func(raw []byte) (net.HardwareAddr, error)) (net.HardwareAddr, error) {
	if !p.Subnet.IsValid() {
		m, err := parse(p.Attrs.BackendV6Data)
		if err != nil {
			return nil, fmt.Errorf("BackendV6Data %w", err)
		}
		return m, nil
	}
	m, err := parse(p.Attrs.BackendData)
	if err != nil {
		return nil, fmt.Errorf("BackendData %w", err)
	}
	if !p.IPv6Subnet.IsValid() || isNull(p.Attrs.BackendV6Data) {
		return m, nil
	}
	m6, err := parse(p.Attrs.BackendV6Data)
	if err != nil {
		return nil, fmt.Errorf("BackendV6Data %w", err)
	}
	if !bytes.Equal(m, m6) {
		return nil, fmt.Errorf("BackendV6Data VtepMAC %s differs from BackendData's %s: twill carries both families on one VTEP", m6, m)
	}
	return m, nil
}

func isNull(raw []byte) bool {
	t := bytes.TrimSpace(raw)
	return len(t) == 0 || string(t) == "null"
}

// PeerObjects is what one peer calls for: a route per family, and for the
// families carried by the overlay a neighbour each and one FDB entry.
type PeerObjects struct {
	Route       nl.Route // IPv4; Dst invalid: none
	Neigh       nl.Neigh // IPv4, through the overlay; IP invalid: none
	V6          *Family  // nil: nothing in IPv6 (kept apart: most clusters have no IPv6, and a record is kept per peer)
	FDB         nl.Neigh // set when Overlay
	Overlay, OK bool
}

// Family is a peer's route, and neighbour when through the overlay, in
// one family.
type Family struct {
	Route nl.Route
	Neigh nl.Neigh
}

// v6 is the peer's IPv6 objects, zero when it has none.
func (o PeerObjects) v6() Family {
	if o.V6 == nil {
		return Family{}
	}
	return *o.V6
}

// direct reports, per family, whether DirectRouting sends the peer's pods'
// traffic straight to its public address of that family (on-link).
func (l Local) direct(p subnet.Lease) (v4, v6 bool) {
	if !l.Config.DirectRouting {
		return false, false
	}
	on := func(ip netip.Addr) bool { return subnet.CheckPublicIP(ip) == nil && l.Ext.Reachable(ip) }
	return on(p.Attrs.PublicIP), on(p.Attrs.PublicIPv6)
}

// families reports which of the peer's subnets this node programs.
func (l Local) families(p subnet.Lease) (v4, v6 bool) {
	return l.IPv4 && p.Subnet.IsValid(), l.IPv6 && p.IPv6Subnet.IsValid()
}

// overlay reports whether any of the peer's families goes through the
// VTEP, so that its VTEP MAC matters.
func (l Local) overlay(p subnet.Lease) bool {
	v4, v6 := l.families(p)
	d4, d6 := l.direct(p)
	return (v4 && !d4) || (v6 && !d6)
}

// ObjectsFor computes one peer's objects; mac and macErr are its parsed
// VTEP MAC (PeerMAC; ignored unless the overlay carries a family).
func ObjectsFor(l Local, p subnet.Lease, mac net.HardwareAddr, macErr error) (PeerObjects, error) {
	v4, v6 := l.families(p)
	if !v4 && !v6 {
		return PeerObjects{}, nil
	}
	d4, d6 := l.direct(p)
	var o PeerObjects
	if (v4 && !d4) || (v6 && !d6) {
		// The daemon refuses such leases already; a backend never programs
		// an FDB entry or a route towards an address that is no node's.
		field, under := "PublicIP", p.Attrs.PublicIP
		if !l.underlayV4() {
			field, under = "PublicIPv6", p.Attrs.PublicIPv6
		}
		if err := subnet.CheckPublicIP(under); err != nil {
			return PeerObjects{}, fmt.Errorf("%s %w (the overlay runs over %s)", field, err, l.underlayFamily())
		}
		if macErr != nil {
			return PeerObjects{}, macErr
		}
		o.FDB = nl.Neigh{LinkIndex: l.Dev, IP: under, HardwareAddr: mac, Permanent: true}
		o.Overlay = true
	}
	if v4 {
		o.Route, o.Neigh = l.family(p.Subnet, p.Attrs.PublicIP, d4, mac)
	}
	if v6 {
		var f Family
		f.Route, f.Neigh = l.family(p.IPv6Subnet, p.Attrs.PublicIPv6, d6, mac)
		o.V6 = &f
	}
	o.OK = true
	return o, nil
}

// family is the route (and for the overlay the neighbour) to a peer's
// subnet of one family: via its public address of that family when direct,
// else via its VTEP IP, the subnet's network address, on the VTEP.
func (l Local) family(sub netip.Prefix, pub netip.Addr, direct bool, mac net.HardwareAddr) (nl.Route, nl.Neigh) {
	if direct {
		return nl.Route{Dst: sub, Gw: pub, LinkIndex: l.Ext.Link.Index}, nl.Neigh{}
	}
	vtep := sub.Addr()
	return nl.Route{Dst: sub, Gw: vtep, LinkIndex: l.Dev, OnLink: true}, nl.Neigh{LinkIndex: l.Dev, IP: vtep, HardwareAddr: mac, Permanent: true}
}

// emit hands o's objects to out: neighbours and FDB entry before routes.
func (o PeerObjects) emit(out Emitters) {
	if !o.OK {
		return
	}
	v6 := o.v6()
	for _, n := range [2]nl.Neigh{o.Neigh, v6.Neigh} {
		if n.IP.IsValid() && out.Neigh != nil {
			out.Neigh(n)
		}
	}
	if o.Overlay && out.FDB != nil {
		out.FDB(o.FDB)
	}
	for _, r := range [2]nl.Route{o.Route, v6.Route} {
		if r.Dst.IsValid() && out.Route != nil {
			out.Route(r)
		}
	}
}

// DesiredState is the pure part of Reconcile: it emits what peers call for
// and returns the peers it had to refuse. mac gives peer i's VTEP MAC (see
// PeerMAC).
func DesiredState(l Local, peers []subnet.Lease, mac func(i int) (net.HardwareAddr, error), out Emitters) (refused []string) {
	for i, p := range peers {
		var (
			hw  net.HardwareAddr
			err error
		)
		if l.overlay(p) {
			hw, err = mac(i)
		}
		o, err := ObjectsFor(l, p, hw, err)
		if err != nil {
			refused = append(refused, p.String()+": "+err.Error())
			continue
		}
		o.emit(out)
	}
	slices.Sort(refused)
	return refused
}

// primary is the subnet a lease is known by: its IPv4 one, or its IPv6 one
// in an IPv6-only cluster.
func primary(p subnet.Lease) netip.Prefix {
	if p.Subnet.IsValid() {
		return p.Subnet
	}
	return p.IPv6Subnet
}
