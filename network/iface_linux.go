package network

import (
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strings"

	"github.com/twill-net/twill/backend"
	"github.com/twill-net/twill/nl"
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
	// IPv4 and IPv6 are the pods' families. The interface need not have
	// an address of each: what it must have is the backend's to say
	// (host-gw routes each family via the peer's address of that family;
	// vxlan carries both over either).
	IPv4, IPv6 bool
}

// IfaceKernel is what choosing the external interface reads of the kernel
// (*nl.Handle; nlfake.Kernel models it).
type IfaceKernel interface {
	Links() ([]nl.Link, error)
	LinkByName(name string) (nl.Link, error)
	LinkByIndex(index int) (nl.Link, error)
	Addrs(link int, family nl.Family) ([]nl.Addr, error)
	Routes(family nl.Family, f nl.RouteFilter) ([]nl.Route, error)
	RouteGet(dst netip.Addr) (nl.Route, error)
}

var _ IfaceKernel = (*nl.Handle)(nil)

// ChooseExternal picks the external interface: the first of Ifaces, then of
// IfaceRegex, then the route to CanReach, then the default route's link.
func ChooseExternal(h IfaceKernel, o IfaceOptions) (backend.ExternalInterface, error) {
	c, err := readCandidates(h, o)
	if err != nil {
		return backend.ExternalInterface{}, err
	}
	var (
		link nl.Link
		ok   bool
		how  string
	)
	switch {
	case len(o.Ifaces) > 0:
		link, ok, how = c.byName(o.Ifaces)
	case len(o.IfaceRegex) > 0:
		link, ok, how, err = c.byRegex(o.IfaceRegex)
	case o.CanReach.IsValid():
		link, ok, how, err = byRoute(h, o.CanReach)
	default:
		link, ok, how, err = byDefaultRoute(h, o.IPv4)
	}
	if err != nil {
		return backend.ExternalInterface{}, err
	}
	if !ok {
		hint := "pass --iface"
		if len(o.Ifaces) > 0 || len(o.IfaceRegex) > 0 {
			hint = "no such interface, or it has no usable address"
			if names := c.usableNames(); len(names) > 0 {
				hint += "; interfaces that have one: " + strings.Join(names, ", ")
			}
		}
		return backend.ExternalInterface{}, fmt.Errorf("choosing the external interface by %s: no interface matches (%s)", how, hint)
	}
	return describe(link, c.addrs[link.Index], o)
}

// candidates are the machine's links with their addresses. Only links
// with an address of a family in use can carry the underlay, so links
// without one never match.
type candidates struct {
	links []nl.Link
	addrs map[int][]netip.Prefix
	o     IfaceOptions
}

func readCandidates(h IfaceKernel, o IfaceOptions) (*candidates, error) {
	links, err := h.Links()
	if err != nil {
		return nil, err
	}
	addrs, err := h.Addrs(0, nl.FamilyAll)
	if err != nil {
		return nil, err
	}
	c := &candidates{links: links, addrs: map[int][]netip.Prefix{}, o: o}
	for _, a := range addrs {
		c.addrs[a.LinkIndex] = append(c.addrs[a.LinkIndex], a.Prefix)
	}
	return c, nil
}

func (c *candidates) usable(l nl.Link) bool {
	return slices.ContainsFunc(c.addrs[l.Index], func(p netip.Prefix) bool {
		a := p.Addr()
		return a.IsGlobalUnicast() || a.IsPrivate()
	})
}

func (c *candidates) usableNames() []string {
	var names []string
	for _, l := range c.links {
		if c.usable(l) {
			names = append(names, l.Name)
		}
	}
	return names
}

func (c *candidates) find(match func(l nl.Link, addrs []netip.Prefix) bool) (nl.Link, bool) {
	for _, l := range c.links {
		if c.usable(l) && match(l, c.addrs[l.Index]) {
			return l, true
		}
	}
	return nl.Link{}, false
}

// byName is --iface: names or addresses, tried in order.
func (c *candidates) byName(ifaces []string) (nl.Link, bool, string) {
	for _, want := range ifaces {
		ip, ipErr := netip.ParseAddr(want)
		if l, ok := c.find(func(l nl.Link, as []netip.Prefix) bool {
			return l.Name == want || (ipErr == nil && slices.ContainsFunc(as, func(p netip.Prefix) bool { return p.Addr() == ip }))
		}); ok {
			return l, true, ""
		}
	}
	return nl.Link{}, false, fmt.Sprintf("--iface %v", ifaces)
}

// byRegex is --iface-regex: expressions matched against names and
// addresses, tried in order.
func (c *candidates) byRegex(exprs []string) (nl.Link, bool, string, error) {
	for _, expr := range exprs {
		re, err := regexp.Compile(expr)
		if err != nil {
			return nl.Link{}, false, "", fmt.Errorf("--iface-regex %q: %w", expr, err)
		}
		if l, ok := c.find(func(l nl.Link, as []netip.Prefix) bool {
			return re.MatchString(l.Name) || slices.ContainsFunc(as, func(p netip.Prefix) bool { return re.MatchString(p.Addr().String()) })
		}); ok {
			return l, true, "", nil
		}
	}
	return nl.Link{}, false, fmt.Sprintf("--iface-regex %v", exprs), nil
}

// byRoute is --iface-can-reach: the link the kernel would use.
func byRoute(h IfaceKernel, dst netip.Addr) (nl.Link, bool, string, error) {
	r, err := h.RouteGet(dst)
	if err != nil {
		return nl.Link{}, false, "", fmt.Errorf("--iface-can-reach %s: %w", dst, err)
	}
	l, err := h.LinkByIndex(r.LinkIndex)
	return l, err == nil, "--iface-can-reach " + dst.String(), nil
}

// byDefaultRoute is the default route's link: the IPv4 one first when
// the pods use IPv4, then the other family's (an IPv6-only cluster's
// vxlan overlay may run over an IPv4 underlay, and the other way round).
func byDefaultRoute(h IfaceKernel, ipv4 bool) (nl.Link, bool, string, error) {
	how := "the default route"
	order := []nl.Family{nl.FamilyV4, nl.FamilyV6}
	if !ipv4 {
		order = []nl.Family{nl.FamilyV6, nl.FamilyV4}
	}
	for _, family := range order {
		routes, err := h.Routes(family, nl.RouteFilter{})
		if err != nil {
			return nl.Link{}, false, how, err
		}
		for _, r := range routes {
			if r.Dst.Bits() == 0 && r.LinkIndex != 0 {
				l, err := h.LinkByIndex(r.LinkIndex)
				return l, err == nil, how, nil
			}
		}
	}
	return nl.Link{}, false, how, nil
}

// Refresh reads the external interface again, by name: after it went down
// and up, or was deleted and re-created (a VLAN or bond rebuilt, a network
// service restarted), its index, addresses and on-link prefixes may have
// changed. o is what ChooseExternal was given.
func Refresh(h IfaceKernel, name string, o IfaceOptions) (backend.ExternalInterface, error) {
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
	if link.MTU == 0 {
		return ext, errors.New("external interface " + link.Name + " reports MTU 0")
	}
	return ext, nil
}
