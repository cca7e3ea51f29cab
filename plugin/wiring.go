package plugin

import (
	"fmt"
	"net"
	"net/netip"
	"strings"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/twill-net/twill/nl"
)

// Gateways the pod routes through: link-local, answered by the host veth.
var (
	GatewayV4 = netip.MustParseAddr("169.254.1.1")
	GatewayV6 = netip.MustParseAddr("fe80::1")
)

// Wiring is everything one attachment puts in the kernel, derived from the
// attachment and its addresses alone: a veth pair; on the pod end each
// address as a /32 (/128), a default route via the link-local gateway and
// a permanent neighbour entry for it; on the host end proxy ARP, a /32
// route per address and, with the eni backend, the pod's policy rules.
// ADD applies it (add_linux.go), CHECK verifies it against the kernel
// (check_linux.go), and tests render it (Render).
type Wiring struct {
	HostVeth string // the host end, named from the attachment
	IfName   string // the pod end
	MTU      int
	IPs      []netip.Addr
	Rules    []nl.Rule // the pod's policy rules (eni backend)
}

// newWiring describes the attachment's wiring; em is the eni backend's
// settings, nil without it.
func newWiring(containerID, ifName string, mtu int, ips []netip.Addr, em *eniMode) Wiring {
	w := Wiring{HostVeth: HostVethName(containerID, ifName), IfName: ifName, MTU: mtu, IPs: ips}
	if em != nil {
		for _, ip := range ips {
			if ip.Is4() {
				w.Rules = append(w.Rules, em.podRules(ip)...)
			}
		}
	}
	return w
}

func gatewayFor(ip netip.Addr) netip.Addr {
	if ip.Is6() {
		return GatewayV6
	}
	return GatewayV4
}

func hostPrefix(a netip.Addr) netip.Prefix { return netip.PrefixFrom(a, a.BitLen()) }

func defaultRoute(a netip.Addr) netip.Prefix {
	if a.Is4() {
		return netip.PrefixFrom(netip.IPv4Unspecified(), 0)
	}
	return netip.PrefixFrom(netip.IPv6Unspecified(), 0)
}

// PodSide is the pod end's state.
type PodSide struct {
	Addrs  []nl.Addr
	Routes []nl.Route // in the order they must be added
	Neighs []nl.Neigh
}

// Pod is the pod end's state on its link podIndex, whose gateway is the
// host end with MAC hostMAC.
func (w Wiring) Pod(podIndex int, hostMAC []byte) PodSide {
	var s PodSide
	for _, ip := range w.IPs {
		gw := gatewayFor(ip)
		s.Addrs = append(s.Addrs, nl.Addr{Prefix: hostPrefix(ip), LinkIndex: podIndex})
		if gw.Is4() {
			// fe80::1 is on-link through the link-local prefix; 169.254.1.1
			// needs a route.
			s.Routes = append(s.Routes, nl.Route{Dst: hostPrefix(gw), LinkIndex: podIndex, Scope: nl.ScopeLink})
		}
		s.Routes = append(s.Routes, nl.Route{Dst: defaultRoute(ip), Gw: gw, LinkIndex: podIndex})
		s.Neighs = append(s.Neighs, nl.Neigh{LinkIndex: podIndex, IP: gw, HardwareAddr: hostMAC, Permanent: true})
	}
	return s
}

// HostSide is the host end's state.
type HostSide struct {
	Routes   []nl.Route
	Rules    []nl.Rule
	ProxyARP string // the sysctl set to 1
}

// Host is the host end's state on its link hostIndex.
func (w Wiring) Host(hostIndex int) HostSide {
	s := HostSide{Rules: w.Rules, ProxyARP: "net/ipv4/conf/" + w.HostVeth + "/proxy_arp"}
	for _, ip := range w.IPs {
		s.Routes = append(s.Routes, nl.Route{Dst: hostPrefix(ip), LinkIndex: hostIndex, Scope: nl.ScopeLink, Protocol: nl.PodRouteProtocol})
	}
	return s
}

// Result is the CNI result that reports the wiring.
func (w Wiring) Result(host, pod nl.Link, netns string) *current.Result {
	r := &current.Result{
		CNIVersion: current.ImplementedSpecVersion,
		Interfaces: []*current.Interface{
			{Name: w.HostVeth, Mac: net.HardwareAddr(host.HardwareAddr).String()},
			{Name: w.IfName, Mac: net.HardwareAddr(pod.HardwareAddr).String(), Sandbox: netns, Mtu: w.MTU},
		},
	}
	for _, ip := range w.IPs {
		gw, idx := gatewayFor(ip), 1
		r.IPs = append(r.IPs, &current.IPConfig{Address: ipNet(hostPrefix(ip)), Gateway: gw.AsSlice(), Interface: &idx})
		r.Routes = append(r.Routes, &types.Route{Dst: ipNet(defaultRoute(ip)), GW: gw.AsSlice()})
	}
	return r
}

func ipNet(p netip.Prefix) net.IPNet {
	return net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// The wiring's objects in the words of ip(8): CHECK names what is missing
// with them, and Render lists them.

func describeAddr(a nl.Addr, dev string) string {
	return fmt.Sprintf("address %s on %s", a.Prefix, dev)
}

func describeRoute(r nl.Route, dev string) string {
	dst := r.Dst.String()
	if r.Dst.Bits() == 0 {
		dst = "default"
	}
	s := "route " + dst
	if r.Gw.IsValid() {
		s += " via " + r.Gw.String()
	}
	s += " dev " + dev
	if r.Scope == nl.ScopeLink {
		s += " scope link"
	}
	if r.Protocol != 0 {
		s += fmt.Sprintf(" proto %d", r.Protocol)
	}
	return s
}

func describeNeigh(n nl.Neigh, dev string) string {
	return fmt.Sprintf("permanent neighbour %s lladdr %s on %s", n.IP, net.HardwareAddr(n.HardwareAddr), dev)
}

func describeRule(r nl.Rule) string { return fmt.Sprintf("rule %q", r.String()) }

// Render lists the wiring's objects, pod end then host end, one per line,
// with the link indexes and host MAC given.
func (w Wiring) Render(podIndex, hostIndex int, hostMAC []byte) string {
	var b strings.Builder
	fmt.Fprintf(&b, "veth %s (host) <-> %s (pod), mtu %d\n", w.HostVeth, w.IfName, w.MTU)
	p := w.Pod(podIndex, hostMAC)
	for _, a := range p.Addrs {
		fmt.Fprintln(&b, "pod:", describeAddr(a, w.IfName))
	}
	for _, r := range p.Routes {
		fmt.Fprintln(&b, "pod:", describeRoute(r, w.IfName))
	}
	for _, n := range p.Neighs {
		fmt.Fprintln(&b, "pod:", describeNeigh(n, w.IfName))
	}
	h := w.Host(hostIndex)
	fmt.Fprintf(&b, "host: sysctl %s = 1\n", h.ProxyARP)
	for _, r := range h.Routes {
		fmt.Fprintln(&b, "host:", describeRoute(r, w.HostVeth))
	}
	for _, r := range h.Rules {
		fmt.Fprintf(&b, "host: %s proto %d\n", describeRule(r), r.Protocol)
	}
	return b.String()
}
