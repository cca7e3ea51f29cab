package vxlan

import (
	"errors"
	"fmt"

	"github.com/twill-net/twill/nl"
)

// kernelProtocol is RTPROT_KERNEL: the routes the kernel makes for an
// address (fe80::/64 on every device), which are never moved.
const kernelProtocol = 2

// MoveDevice replaces the VXLAN device from by a new one configured as to
// (another name: twill's twill.<VNI> for flanneld's flannel.<VNI>, or the
// other way round) and puts back on it at once what went through the old
// one: its addresses, its permanent neighbour entries, its forwarding
// entries, and its routes (but the kernel's own), in every table, given
// protocol when it is not 0. Two devices cannot carry one VNI and port, so
// the old one must go first; what goes with it comes back milliseconds
// later, rather than when the new owner first reconciles, and the pods
// behind it keep talking. It returns the new device.
func MoveDevice(k Kernel, from nl.Link, to nl.VXLAN, protocol int) (nl.Link, error) {
	addrs, err := k.Addrs(from.Index, nl.FamilyAll)
	if err != nil {
		return nl.Link{}, err
	}
	neighs, err := k.Neighs(from.Index, nl.FamilyAll)
	if err != nil {
		return nl.Link{}, err
	}
	fdb, err := k.FDB(from.Index)
	if err != nil {
		return nl.Link{}, err
	}
	routes, err := k.Routes(nl.FamilyAll, nl.RouteFilter{AllTables: true, LinkIndex: from.Index})
	if err != nil {
		return nl.Link{}, err
	}
	if err := k.LinkDel(from.Index); err != nil {
		return nl.Link{}, fmt.Errorf("replacing %s by %s: %w", from.Name, to.Name, err)
	}
	dev, err := k.VXLANAdd(to)
	if err != nil {
		return nl.Link{}, fmt.Errorf("replacing %s by %s: %w", from.Name, to.Name, err)
	}
	var errs []error
	for _, a := range addrs {
		if !a.Prefix.Addr().IsLinkLocalUnicast() {
			errs = append(errs, k.AddrAdd(dev.Index, a.Prefix))
		}
	}
	errs = append(errs, k.LinkSetUp(dev.Index))
	var nops []nl.NeighOp
	for _, n := range neighs {
		if n.Permanent {
			n.LinkIndex = dev.Index
			nops = append(nops, nl.NeighOp{Op: nl.OpReplace, Neigh: n})
		}
	}
	for _, n := range fdb {
		n.LinkIndex = dev.Index
		nops = append(nops, nl.NeighOp{Op: nl.OpReplace, Neigh: n, FDB: true})
	}
	errs = append(errs, k.NeighBatch(nops)...)
	var rops []nl.RouteOp
	for _, r := range routes {
		if r.Protocol == kernelProtocol {
			continue
		}
		r.LinkIndex = dev.Index
		if protocol != 0 {
			r.Protocol = protocol
		}
		rops = append(rops, nl.RouteOp{Op: nl.OpReplace, Route: r})
	}
	errs = append(errs, k.RouteBatch(rops)...)
	if err := errors.Join(errs...); err != nil {
		return dev, fmt.Errorf("replacing %s by %s: %w", from.Name, to.Name, err)
	}
	return dev, nil
}
