package nl

import (
	"net/netip"
	"slices"
)

// AddrTable is what SyncAddrs reads and changes.
type AddrTable interface {
	Addrs(link int, family Family) ([]Addr, error)
	AddrAdd(link int, p netip.Prefix) error
	AddrDel(link int, p netip.Prefix) error
}

// SyncAddrs makes the addresses of one of twill's own devices exactly
// want: it adds the missing ones and removes the others, but the IPv6
// link-local address the kernel gives every device. A device keeps its
// addresses across twilld's restarts, so one left from an earlier lease
// (the node's podCIDR changed) would otherwise stay, and the kernel could
// pick it as the source of the node's own packets, to which no peer routes
// any more.
func SyncAddrs(k AddrTable, link int, want []netip.Prefix) error {
	have, err := k.Addrs(link, FamilyAll)
	if err != nil {
		return err
	}
	for _, a := range want {
		if !slices.ContainsFunc(have, func(h Addr) bool { return h.Prefix == a }) {
			if err := k.AddrAdd(link, a); err != nil {
				return err
			}
		}
	}
	for _, h := range have {
		if !slices.Contains(want, h.Prefix) && !h.Prefix.Addr().IsLinkLocalUnicast() {
			if err := k.AddrDel(link, h.Prefix); err != nil {
				return err
			}
		}
	}
	return nil
}
