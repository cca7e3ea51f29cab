package vxlan

import (
	"bytes"
	"errors"
	"net/netip"

	"github.com/twill-net/twill/backend"
	"github.com/twill-net/twill/nl"
)

// Kernel is what the vxlan backend reads and changes: its VTEP device, and
// the routes, neighbours and FDB entries through it. *nl.Handle has it all;
// nl/nlfake models it.
type Kernel interface {
	backend.RouteTable
	backend.NeighTable
	backend.RouteWatcher
	backend.NeighWatcher
	nl.LinkWatcher
	TXChecksum(name string) (bool, error)
	SetTXChecksum(name string, on bool) error
	VXLANByName(name string) (nl.Link, nl.VXLAN, bool, error)
	VXLANAdd(v nl.VXLAN) (nl.Link, error)
	LinkDel(index int) error
	LinkSetUp(index int) error
	Addrs(link int, family nl.Family) ([]nl.Addr, error)
	AddrAdd(link int, p netip.Prefix) error
	AddrDel(link int, p netip.Prefix) error
}

var _ Kernel = (*nl.Handle)(nil)

// ensureDevice makes the VTEP device match want (re-creating it when its
// identity is wrong), up, with addrs assigned. It reports the link and
// whether it was (re)created.
func ensureDevice(k Kernel, want nl.VXLAN, addrs []netip.Prefix) (nl.Link, bool, error) {
	link, have, isVXLAN, err := k.VXLANByName(want.Name)
	created := false
	switch {
	case errors.Is(err, nl.ErrLinkNotFound):
		if link, err = k.VXLANAdd(want); err != nil {
			return nl.Link{}, false, err
		}
		created = true
	case err != nil:
		return nl.Link{}, false, err
	case !isVXLAN || !deviceMatches(have, want):
		if err := k.LinkDel(link.Index); err != nil {
			return nl.Link{}, false, err
		}
		if link, err = k.VXLANAdd(want); err != nil {
			return nl.Link{}, false, err
		}
		created = true
	}
	if !link.Up {
		if err := k.LinkSetUp(link.Index); err != nil {
			return nl.Link{}, false, err
		}
	}
	if len(addrs) > 0 {
		if err := nl.SyncAddrs(k, link.Index, addrs); err != nil {
			return nl.Link{}, false, err
		}
	}
	return link, created, nil
}

// deviceMatches reports whether an existing VTEP is the one twill wants.
func deviceMatches(have, want nl.VXLAN) bool {
	return have.VNI == want.VNI && have.Port == want.Port && !have.Learning && have.VtepDevIndex == want.VtepDevIndex &&
		have.SrcAddr == want.SrcAddr && have.MTU == want.MTU && bytes.Equal(have.HardwareAddr, want.HardwareAddr)
}
