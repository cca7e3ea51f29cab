package vxlan

import (
	"encoding/json"
	"fmt"
	"net"
	"slices"

	"github.com/twill-net/twill/backend"
	"github.com/twill-net/twill/backend/nl"
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

// ParseData reads a peer's BackendData for the configured VNI.
func ParseData(vni int, raw []byte) (net.HardwareAddr, error) {
	var data Data
	if err := json.Unmarshal(raw, &data); err != nil {
		return nil, fmt.Errorf("BackendData %s: %w", raw, err)
	}
	if data.VNI != vni {
		return nil, fmt.Errorf("BackendData VNI %d: this node uses VNI %d", data.VNI, vni)
	}
	mac, err := net.ParseMAC(data.VtepMAC)
	if err != nil || len(mac) != 6 {
		return nil, fmt.Errorf("BackendData VtepMAC %q: not a MAC address", data.VtepMAC)
	}
	return mac, nil
}

// PeerObjects is what one peer calls for: a route, and for overlay peers a
// neighbour and an FDB entry.
type PeerObjects struct {
	Route       nl.Route
	Neigh, FDB  nl.Neigh
	Overlay, OK bool
}

// ObjectsFor computes one peer's objects on the VTEP with index dev; mac
// and macErr are the peer's parsed BackendData (ignored for direct peers).
func ObjectsFor(cfg Config, ext backend.ExternalInterface, dev int, p subnet.Lease, mac net.HardwareAddr, macErr error) (PeerObjects, error) {
	if !p.Subnet.IsValid() {
		return PeerObjects{}, nil
	}
	// The daemon refuses such leases already; a backend never programs an
	// FDB entry or a route towards an address that is no node's.
	if err := subnet.CheckPublicIP(p.Attrs.PublicIP); err != nil {
		return PeerObjects{}, fmt.Errorf("PublicIP %w", err)
	}
	if isDirect(cfg, ext, p) {
		return PeerObjects{Route: nl.Route{Dst: p.Subnet, Gw: p.Attrs.PublicIP, LinkIndex: ext.Link.Index}, OK: true}, nil
	}
	if macErr != nil {
		return PeerObjects{}, macErr
	}
	vtep := p.Subnet.Addr()
	return PeerObjects{
		Route:   nl.Route{Dst: p.Subnet, Gw: vtep, LinkIndex: dev, OnLink: true},
		Neigh:   nl.Neigh{LinkIndex: dev, IP: vtep, HardwareAddr: mac, Permanent: true},
		FDB:     nl.Neigh{LinkIndex: dev, IP: p.Attrs.PublicIP, HardwareAddr: mac, Permanent: true},
		Overlay: true, OK: true,
	}, nil
}

func isDirect(cfg Config, ext backend.ExternalInterface, p subnet.Lease) bool {
	return cfg.DirectRouting && ext.Reachable(p.Attrs.PublicIP)
}

// DesiredState is the pure part of Reconcile: it emits what peers call for
// on the VTEP with index dev, and returns the peers it had to refuse.
// mac gives peer i's VTEP MAC from its BackendData (see ParseData).
func DesiredState(cfg Config, ext backend.ExternalInterface, dev int, peers []subnet.Lease,
	mac func(i int) (net.HardwareAddr, error), out Emitters) (refused []string) {
	for i, p := range peers {
		var (
			hw  net.HardwareAddr
			err error
		)
		if !isDirect(cfg, ext, p) {
			hw, err = mac(i)
		}
		o, err := ObjectsFor(cfg, ext, dev, p, hw, err)
		if err != nil {
			refused = append(refused, p.String()+": "+err.Error())
			continue
		}
		if !o.OK {
			continue
		}
		if o.Overlay && out.Neigh != nil {
			out.Neigh(o.Neigh)
		}
		if o.Overlay && out.FDB != nil {
			out.FDB(o.FDB)
		}
		if out.Route != nil {
			out.Route(o.Route)
		}
	}
	slices.Sort(refused)
	return refused
}
