package vxlan

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"slices"

	"github.com/twill-net/twill/backend"
	"github.com/twill-net/twill/backend/kernelsync"
	"github.com/twill-net/twill/nl"
	"github.com/twill-net/twill/subnet"
)

var _ backend.DriftReporter = (*Network)(nil)

// Drift compares the device, neighbours, FDB entries and routes with what
// peers call for, changing nothing.
func (n *Network) Drift(_ context.Context, peers []subnet.Lease) (backend.Drift, error) {
	h := n.b.k
	link, have, ok, err := h.VXLANByName(n.b.dev.Name)
	if errors.Is(err, nl.ErrLinkNotFound) {
		return backend.Drift{Missing: []string{"device " + n.b.dev.Name}}, nil
	}
	if err != nil {
		return backend.Drift{}, err
	}
	var d backend.Drift
	l := n.view(link.Index)
	mac := func(p subnet.Lease) (net.HardwareAddr, error) {
		return PeerMAC(p, func(raw []byte) (net.HardwareAddr, error) { return parseMAC(l.Config.VNI, raw) })
	}
	peers, sc := screenMACs(n.local, have.HardwareAddr, slices.Clone(peers), func(p subnet.Lease) bool { return !l.overlay(p) }, mac, nil)
	d.Refused = append(d.Refused, sc.refused...)
	if !ok || have.VNI != n.b.dev.VNI || have.Port != n.b.dev.Port || have.Learning || have.MTU != n.b.dev.MTU {
		d.Wrong = append(d.Wrong, fmt.Sprintf("device %s (want VNI %d, port %d, MTU %d, learning off)", n.b.dev.Name, n.b.dev.VNI, n.b.dev.Port, n.b.dev.MTU))
	}
	if on, err := h.TXChecksum(n.b.dev.Name); err == nil && on != n.b.txChecksum {
		d.Wrong = append(d.Wrong, fmt.Sprintf("device %s %s %v (want %v: %s)", n.b.dev.Name, nl.FeatureTXChecksum, on, n.b.txChecksum, n.b.txChecksumWhy))
	}
	var (
		routes     []nl.Route
		neigh, fdb = map[string]nl.Neigh{}, map[string]nl.Neigh{}
	)
	refused := DesiredState(l, peers, func(i int) (net.HardwareAddr, error) { return mac(peers[i]) }, Emitters{
		Route: func(r nl.Route) { routes = append(routes, r) },
		Neigh: func(e nl.Neigh) { neigh[e.IP.String()] = e },
		FDB:   func(e nl.Neigh) { fdb[net.HardwareAddr(e.HardwareAddr).String()] = e },
	})
	d.Refused = append(d.Refused, refused...)
	rd, err := kernelsync.RouteDrift(h, 0, routes)
	if err != nil {
		return backend.Drift{}, err
	}
	d.Missing, d.Extra, d.Wrong = append(d.Missing, rd.Missing...), append(d.Extra, rd.Extra...), append(d.Wrong, rd.Wrong...)
	d.Objects = rd.Objects + len(neigh) + len(fdb)
	kernelNeigh, err := h.Neighs(link.Index, nl.FamilyAll)
	if err != nil {
		return backend.Drift{}, err
	}
	kernelFDB, err := h.FDB(link.Index)
	if err != nil {
		return backend.Drift{}, err
	}
	compare := func(kind string, want map[string]nl.Neigh, have []nl.Neigh, key func(nl.Neigh) string) {
		seen := map[string]bool{}
		for _, k := range have {
			if !k.Permanent {
				continue
			}
			w, ok := want[key(k)]
			desc := fmt.Sprintf("%s %s %s", kind, k.IP, net.HardwareAddr(k.HardwareAddr))
			switch {
			case !ok:
				d.Extra = append(d.Extra, desc)
			case w.IP != k.IP || !bytes.Equal(w.HardwareAddr, k.HardwareAddr):
				d.Wrong = append(d.Wrong, desc)
			default:
				seen[key(k)] = true
			}
		}
		for k, w := range want {
			if !seen[k] {
				d.Missing = append(d.Missing, fmt.Sprintf("%s %s %s", kind, w.IP, net.HardwareAddr(w.HardwareAddr)))
			}
		}
	}
	compare("neighbour", neigh, kernelNeigh, func(e nl.Neigh) string { return e.IP.String() })
	compare("fdb", fdb, kernelFDB, func(e nl.Neigh) string { return net.HardwareAddr(e.HardwareAddr).String() })
	slices.Sort(d.Missing)
	slices.Sort(d.Extra)
	slices.Sort(d.Wrong)
	return d, nil
}
