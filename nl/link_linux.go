package nl

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

func fromNetlinkLink(l netlink.Link) Link {
	a := l.Attrs()
	return Link{
		Index:        a.Index,
		Name:         a.Name,
		MTU:          a.MTU,
		Up:           a.Flags&net.FlagUp != 0,
		HardwareAddr: append([]byte(nil), a.HardwareAddr...),
		Type:         l.Type(),
		Alias:        a.Alias,
		PeerIndex:    a.ParentIndex,
		MasterIndex:  a.MasterIndex,
	}
}

// LinkByName returns the link called name.
func (h *Handle) LinkByName(name string) (Link, error) {
	l, err := h.h.LinkByName(name)
	return foundLink(l, err, name, 0)
}

// foundLink converts the link a lookup by name (or, name empty, by index)
// found; an error names what was looked up, and netlink's not-found
// becomes ErrLinkNotFound.
func foundLink(l netlink.Link, err error, name string, index int) (Link, error) {
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			err = ErrLinkNotFound
		}
		if name == "" {
			return Link{}, fmt.Errorf("finding link #%d: %w", index, err)
		}
		return Link{}, fmt.Errorf("finding link %q: %w", name, err)
	}
	return fromNetlinkLink(l), nil
}

// LinkExists reports whether a link called name exists.
func (h *Handle) LinkExists(name string) (bool, error) {
	_, err := h.LinkByName(name)
	if errors.Is(err, ErrLinkNotFound) {
		return false, nil
	}
	return err == nil, err
}

// LinkByIndex returns the link with the given index.
func (h *Handle) LinkByIndex(index int) (Link, error) {
	l, err := h.h.LinkByIndex(index)
	return foundLink(l, err, "", index)
}

// Links lists every link in the namespace.
func (h *Handle) Links() ([]Link, error) {
	ls, err := retryDump(h.h.LinkList)
	if err != nil {
		return nil, fmt.Errorf("listing links: %w", err)
	}
	out := make([]Link, 0, len(ls))
	for _, l := range ls {
		out = append(out, fromNetlinkLink(l))
	}
	return out, nil
}

// Addrs lists the addresses of a link (all links when linkIndex is 0).
func (h *Handle) Addrs(linkIndex int, family Family) ([]Addr, error) {
	var link netlink.Link
	if linkIndex != 0 {
		l, err := h.h.LinkByIndex(linkIndex)
		if err != nil {
			return nil, fmt.Errorf("listing addresses of link #%d: %w", linkIndex, err)
		}
		link = l
	}
	as, err := retryDump(func() ([]netlink.Addr, error) { return h.h.AddrList(link, int(family)) })
	if err != nil {
		return nil, fmt.Errorf("listing addresses: %w", err)
	}
	out := make([]Addr, 0, len(as))
	for _, a := range as {
		out = append(out, Addr{Prefix: prefixFromIPNet(a.IPNet), LinkIndex: a.LinkIndex})
	}
	return out, nil
}

// watch runs one netlink subscription until ctx is done, handing each update
// to fn; it returns an error when the subscription breaks.
func watch[U any](ctx context.Context, what string, subscribed func(),
	subscribe func(ch chan U, done chan struct{}, errCb func(error)) error, fn func(U)) error {
	ch := make(chan U, 256)
	done := make(chan struct{})
	defer close(done)
	subErr := make(chan error, 1)
	errCb := func(err error) {
		select {
		case subErr <- err:
		default:
		}
	}
	if err := subscribe(ch, done, errCb); err != nil {
		return fmt.Errorf("subscribing to %s updates: %w", what, err)
	}
	if subscribed != nil {
		subscribed()
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-subErr:
			return fmt.Errorf("receiving %s updates: %w", what, err)
		case u, ok := <-ch:
			if !ok {
				return fmt.Errorf("receiving %s updates: subscription closed", what)
			}
			fn(u)
		}
	}
}

// LinkDel deletes the link with the given index; a missing link is fine.
func (h *Handle) LinkDel(index int) error {
	l, err := h.h.LinkByIndex(index)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil
		}
		return fmt.Errorf("deleting link #%d: %w", index, err)
	}
	return unlessAlready(h.h.LinkDel(l), unix.ENODEV, "deleting link %s", l.Attrs().Name)
}

// VethAdd creates a veth pair whose host end is called name (in the handle's
// namespace) and whose other end, peerName, is created directly inside the
// namespace at peerNSPath, so it never appears in the host namespace. The
// host end gets alias (which GC uses to find twill's links).
func (h *Handle) VethAdd(name, peerName, peerNSPath string, mtu int, alias string) (Link, error) {
	peerNS, err := netns.GetFromPath(peerNSPath)
	if err != nil {
		return Link{}, fmt.Errorf("opening netns %q: %w", peerNSPath, err)
	}
	defer peerNS.Close()
	la := netlink.NewLinkAttrs()
	la.Name, la.MTU = name, mtu
	veth := &netlink.Veth{LinkAttrs: la, PeerName: peerName, PeerNamespace: netlink.NsFd(int(peerNS))}
	if err := h.h.LinkAdd(veth); err != nil {
		return Link{}, fmt.Errorf("creating veth %s (peer %s in %s): %w", name, peerName, peerNSPath, err)
	}
	l, err := h.h.LinkByName(name)
	if err != nil {
		return Link{}, fmt.Errorf("finding new veth %s: %w", name, err)
	}
	// The kernel ignores an alias given at creation, so it is a second
	// request; callers must cope with a link that never got it.
	if alias != "" {
		if err := h.h.LinkSetAlias(l, alias); err != nil {
			return Link{}, fmt.Errorf("setting alias of %s: %w", name, err)
		}
	}
	return h.LinkByName(name)
}

// LinkSetUp brings a link up.
func (h *Handle) LinkSetUp(index int) error {
	l, err := h.h.LinkByIndex(index)
	if err != nil {
		return fmt.Errorf("finding link #%d: %w", index, err)
	}
	if err := h.h.LinkSetUp(l); err != nil {
		return fmt.Errorf("setting %s up: %w", l.Attrs().Name, err)
	}
	return nil
}

// AddrAdd assigns an address (with its prefix length) to a link.
func (h *Handle) AddrAdd(index int, p netip.Prefix) error {
	l, err := h.h.LinkByIndex(index)
	if err != nil {
		return fmt.Errorf("finding link #%d: %w", index, err)
	}
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}}
	if p.Addr().Is6() {
		addr.Flags = unix.IFA_F_NODAD
	}
	if err := h.h.AddrAdd(l, addr); err != nil {
		return fmt.Errorf("adding address %s to %s: %w", p, l.Attrs().Name, err)
	}
	return nil
}

// VXLANAdd creates a VXLAN device (learning off unless v.Learning).
func (h *Handle) VXLANAdd(v VXLAN) (Link, error) {
	la := netlink.NewLinkAttrs()
	la.Name, la.MTU = v.Name, v.MTU
	if len(v.HardwareAddr) > 0 {
		la.HardwareAddr = v.HardwareAddr
	}
	dev := &netlink.Vxlan{LinkAttrs: la, VxlanId: v.VNI, VtepDevIndex: v.VtepDevIndex, Port: v.Port, Learning: v.Learning}
	if v.SrcAddr.IsValid() {
		dev.SrcAddr = v.SrcAddr.AsSlice()
	}
	if err := h.h.LinkAdd(dev); err != nil {
		return Link{}, fmt.Errorf("creating vxlan device %s (VNI %d, port %d): %w", v.Name, v.VNI, v.Port, err)
	}
	return h.LinkByName(v.Name)
}

// WireGuardAdd creates a kernel WireGuard device. A kernel without the
// wireguard module answers with an error wrapping ErrNotSupported.
func (h *Handle) WireGuardAdd(name string, mtu int) (Link, error) {
	la := netlink.NewLinkAttrs()
	la.Name, la.MTU = name, mtu
	if err := h.h.LinkAdd(&netlink.Wireguard{LinkAttrs: la}); err != nil {
		if errors.Is(err, unix.EOPNOTSUPP) {
			err = fmt.Errorf("%w: %w", ErrNotSupported, err)
		}
		return Link{}, fmt.Errorf("creating wireguard device %s: %w", name, err)
	}
	return h.LinkByName(name)
}

// LinkSetMTU sets a link's MTU.
func (h *Handle) LinkSetMTU(index, mtu int) error {
	l, err := h.h.LinkByIndex(index)
	if err != nil {
		return fmt.Errorf("finding link #%d: %w", index, err)
	}
	if err := h.h.LinkSetMTU(l, mtu); err != nil {
		return fmt.Errorf("setting %s's MTU to %d: %w", l.Attrs().Name, mtu, err)
	}
	return nil
}

// VXLANByName reads a VXLAN device's configuration; a link of that name
// that is not VXLAN is reported with ok false.
func (h *Handle) VXLANByName(name string) (Link, VXLAN, bool, error) {
	l, err := h.h.LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return Link{}, VXLAN{}, false, fmt.Errorf("finding link %q: %w", name, ErrLinkNotFound)
		}
		return Link{}, VXLAN{}, false, fmt.Errorf("finding link %q: %w", name, err)
	}
	v, ok := l.(*netlink.Vxlan)
	if !ok {
		return fromNetlinkLink(l), VXLAN{}, false, nil
	}
	src, _ := netip.AddrFromSlice(v.SrcAddr)
	return fromNetlinkLink(l), VXLAN{Name: v.Name, VNI: v.VxlanId, Port: v.Port, Learning: v.Learning, SrcAddr: src.Unmap(),
		VtepDevIndex: v.VtepDevIndex, MTU: v.MTU, HardwareAddr: append([]byte(nil), v.HardwareAddr...)}, true, nil
}

// subscribeNS is the namespace the handle's subscriptions listen in: nil
// for the caller's own.
func (h *Handle) subscribeNS() *netns.NsHandle {
	if h.ns < 0 {
		return nil
	}
	ns := h.ns
	return &ns
}

// WatchLinks calls subscribed once subscribed, then fn for every link
// change in the handle's namespace, until ctx is done. Neither may block.
func (h *Handle) WatchLinks(ctx context.Context, subscribed func(), fn func(LinkEvent)) error {
	return watch(ctx, "link", subscribed, func(ch chan netlink.LinkUpdate, done chan struct{}, errCb func(error)) error {
		return netlink.LinkSubscribeWithOptions(ch, done, netlink.LinkSubscribeOptions{Namespace: h.subscribeNS(),
			ErrorCallback: errCb, ReceiveBufferSize: watchReceiveBuffer, ReceiveBufferForceSize: true})
	}, func(u netlink.LinkUpdate) {
		fn(LinkEvent{Deleted: u.Header.Type == unix.RTM_DELLINK, Link: fromNetlinkLink(u.Link)})
	})
}

// WatchAddrs calls subscribed once subscribed, then fn for every address
// change in the handle's namespace, until ctx is done. Neither may block.
func (h *Handle) WatchAddrs(ctx context.Context, subscribed func(), fn func(AddrEvent)) error {
	return watch(ctx, "address", subscribed, func(ch chan netlink.AddrUpdate, done chan struct{}, errCb func(error)) error {
		return netlink.AddrSubscribeWithOptions(ch, done, netlink.AddrSubscribeOptions{Namespace: h.subscribeNS(),
			ErrorCallback: errCb, ReceiveBufferSize: watchReceiveBuffer, ReceiveBufferForceSize: true})
	}, func(u netlink.AddrUpdate) {
		fn(AddrEvent{Deleted: !u.NewAddr, LinkIndex: u.LinkIndex, Prefix: prefixFromIPNet(&u.LinkAddress)})
	})
}

// AddrDel removes an address from a link; a missing one is fine.
func (h *Handle) AddrDel(index int, p netip.Prefix) error {
	l, err := h.h.LinkByIndex(index)
	if err != nil {
		return fmt.Errorf("finding link #%d: %w", index, err)
	}
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}}
	return unlessAlready(h.h.AddrDel(l, addr), unix.EADDRNOTAVAIL, "removing address %s from %s", p, l.Attrs().Name)
}
