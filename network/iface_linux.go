package network

import (
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strings"

	"github.com/twill-net/twill/backend"
	"github.com/twill-net/twill/backend/nl"
)

// IfaceOptions are the --iface* and --public-ip* flags.
type IfaceOptions struct {
	// Ifaces are interface names or addresses, tried in order.
	Ifaces []string
	// IfaceRegex are regular expressions matched against names and
	// addresses, tried in order after Ifaces.
	IfaceRegex []string
	// CanReach picks the interface the kernel would use to reach it.
	CanReach   netip.Addr
	PublicIP   netip.Addr
	PublicIPv6 netip.Addr
	IPv4, IPv6 bool
}

// ChooseExternal picks the external interface: the first of Ifaces, then of
// IfaceRegex, then the route to CanReach, then the default route's link.
func ChooseExternal(h *nl.Handle, o IfaceOptions) (backend.ExternalInterface, error) {
	links, err := h.Links()
	if err != nil {
		return backend.ExternalInterface{}, err
	}
	addrs, err := h.Addrs(0, nl.FamilyAll)
	if err != nil {
		return backend.ExternalInterface{}, err
	}
	byIndex := map[int][]netip.Prefix{}
	for _, a := range addrs {
		byIndex[a.LinkIndex] = append(byIndex[a.LinkIndex], a.Prefix)
	}
	// Only links with an address of a family in use can carry the
	// underlay, so links without one never match.
	usable := func(as []netip.Prefix) bool {
		return slices.ContainsFunc(as, func(p netip.Prefix) bool {
			a := p.Addr()
			return (a.IsGlobalUnicast() || a.IsPrivate()) && ((a.Is4() && o.IPv4) || (a.Is6() && o.IPv6))
		})
	}
	find := func(match func(l nl.Link, addrs []netip.Prefix) bool) (nl.Link, bool) {
		for _, l := range links {
			if usable(byIndex[l.Index]) && match(l, byIndex[l.Index]) {
				return l, true
			}
		}
		return nl.Link{}, false
	}
	var (
		link nl.Link
		ok   bool
		how  string
	)
	switch {
	case len(o.Ifaces) > 0:
		for _, want := range o.Ifaces {
			ip, ipErr := netip.ParseAddr(want)
			link, ok = find(func(l nl.Link, as []netip.Prefix) bool {
				return l.Name == want || (ipErr == nil && slices.ContainsFunc(as, func(p netip.Prefix) bool { return p.Addr() == ip }))
			})
			if ok {
				break
			}
		}
		how = fmt.Sprintf("--iface %v", o.Ifaces)
	case len(o.IfaceRegex) > 0:
		for _, expr := range o.IfaceRegex {
			re, err := regexp.Compile(expr)
			if err != nil {
				return backend.ExternalInterface{}, fmt.Errorf("--iface-regex %q: %w", expr, err)
			}
			link, ok = find(func(l nl.Link, as []netip.Prefix) bool {
				return re.MatchString(l.Name) || slices.ContainsFunc(as, func(p netip.Prefix) bool { return re.MatchString(p.Addr().String()) })
			})
			if ok {
				break
			}
		}
		how = fmt.Sprintf("--iface-regex %v", o.IfaceRegex)
	case o.CanReach.IsValid():
		r, err := h.RouteGet(o.CanReach)
		if err != nil {
			return backend.ExternalInterface{}, fmt.Errorf("--iface-can-reach %s: %w", o.CanReach, err)
		}
		link, err = h.LinkByIndex(r.LinkIndex)
		ok, how = err == nil, "--iface-can-reach "+o.CanReach.String()
	default:
		how = "the default route"
		routes, err := h.Routes(nl.FamilyV4, nl.RouteFilter{})
		if err != nil {
			return backend.ExternalInterface{}, err
		}
		if !o.IPv4 {
			if routes, err = h.Routes(nl.FamilyV6, nl.RouteFilter{}); err != nil {
				return backend.ExternalInterface{}, err
			}
		}
		for _, r := range routes {
			if r.Dst.Bits() == 0 && r.LinkIndex != 0 {
				link, err = h.LinkByIndex(r.LinkIndex)
				ok = err == nil
				break
			}
		}
	}
	if !ok {
		hint := "pass --iface"
		if len(o.Ifaces) > 0 || len(o.IfaceRegex) > 0 {
			hint = "no such interface, or it has no usable " + families(o) + " address"
			var names []string
			for _, l := range links {
				if usable(byIndex[l.Index]) {
					names = append(names, l.Name)
				}
			}
			if len(names) > 0 {
				hint += "; interfaces that have one: " + strings.Join(names, ", ")
			}
		}
		return backend.ExternalInterface{}, fmt.Errorf("choosing the external interface by %s: no interface matches (%s)", how, hint)
	}
	return describe(link, byIndex[link.Index], o)
}

// Refresh reads the external interface again, by name: after it went down
// and up, or was deleted and re-created (a VLAN or bond rebuilt, a network
// service restarted), its index, addresses and on-link prefixes may have
// changed. o is what ChooseExternal was given.
func Refresh(h *nl.Handle, name string, o IfaceOptions) (backend.ExternalInterface, error) {
	link, err := h.LinkByName(name)
	if err != nil {
		return backend.ExternalInterface{}, fmt.Errorf("external interface: %w", err)
	}
	addrs, err := h.Addrs(link.Index, nl.FamilyAll)
	if err != nil {
		return backend.ExternalInterface{}, err
	}
	prefixes := make([]netip.Prefix, 0, len(addrs))
	for _, a := range addrs {
		prefixes = append(prefixes, a.Prefix)
	}
	return describe(link, prefixes, o)
}

// families names the address families in use, for messages.
func families(o IfaceOptions) string {
	switch {
	case o.IPv4 && o.IPv6:
		return "IPv4 or IPv6"
	case o.IPv6:
		return "IPv6"
	}
	return "IPv4"
}

func describe(link nl.Link, addrs []netip.Prefix, o IfaceOptions) (backend.ExternalInterface, error) {
	ext := backend.ExternalInterface{Link: link}
	for _, p := range addrs {
		a := p.Addr()
		if !a.IsGlobalUnicast() && !a.IsPrivate() {
			continue
		}
		ext.OnLink = append(ext.OnLink, p.Masked())
		if a.Is4() && !ext.Addr.IsValid() {
			ext.Addr = a
		}
		if a.Is6() && !a.IsLinkLocalUnicast() && !ext.AddrV6.IsValid() {
			ext.AddrV6 = a
		}
	}
	ext.PublicIP, ext.PublicIPv6 = ext.Addr, ext.AddrV6
	if o.PublicIP.IsValid() {
		ext.PublicIP = o.PublicIP
	}
	if o.PublicIPv6.IsValid() {
		ext.PublicIPv6 = o.PublicIPv6
	}
	if o.IPv4 && !ext.PublicIP.IsValid() {
		return ext, fmt.Errorf("external interface %s has no IPv4 address", link.Name)
	}
	if o.IPv6 && !ext.PublicIPv6.IsValid() {
		return ext, fmt.Errorf("external interface %s has no IPv6 address", link.Name)
	}
	if link.MTU == 0 {
		return ext, errors.New("external interface " + link.Name + " reports MTU 0")
	}
	return ext, nil
}
