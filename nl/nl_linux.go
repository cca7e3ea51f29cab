package nl

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// dumpAttempts bounds the retries of a dump the kernel reported as
// interrupted (the table changed while it was being read).
const dumpAttempts = 8

// Handle is a netlink socket bound to one network namespace. It speaks
// rtnetlink only (links, addresses, routes, neighbours, rules): one socket
// rather than the three (rtnetlink, xfrm, netfilter) netlink opens by
// default, each of which costs a pair of setns calls in another namespace.
type Handle struct {
	h     *netlink.Handle
	ns    netns.NsHandle // -1 when bound to the caller's namespace
	batch batcher
}

// Open returns a Handle for the named network namespace (as listed by
// `ip netns`), or for the namespace of the calling process when name is "".
func Open(name string) (*Handle, error) {
	if name == "" {
		h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
		if err != nil {
			return nil, fmt.Errorf("opening netlink handle: %w", err)
		}
		return &Handle{h: h, ns: -1, batch: batcher{fd: -1}}, nil
	}
	ns, err := netns.GetFromName(name)
	if err != nil {
		return nil, fmt.Errorf("opening netns %q: %w", name, err)
	}
	return openAt(ns, name)
}

// OpenPath returns a Handle for the namespace mounted at path
// (for example /proc/1234/ns/net or /var/run/netns/x).
func OpenPath(path string) (*Handle, error) {
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return nil, fmt.Errorf("opening netns %q: %w", path, err)
	}
	return openAt(ns, path)
}

func openAt(ns netns.NsHandle, name string) (*Handle, error) {
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		ns.Close()
		return nil, fmt.Errorf("opening netlink handle in %q: %w", name, err)
	}
	return &Handle{h: h, ns: ns, batch: batcher{fd: -1}}, nil
}

// Close releases the handle's sockets.
func (h *Handle) Close() {
	h.batch.mu.Lock()
	h.batch.closeLocked()
	h.batch.mu.Unlock()
	h.h.Close()
	if h.ns >= 0 {
		h.ns.Close()
	}
}

// retryDump runs a dump again while the kernel reports it as interrupted.
func retryDump[T any](dump func() (T, error)) (T, error) {
	var (
		v   T
		err error
	)
	for range dumpAttempts {
		v, err = dump()
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			return v, err
		}
	}
	return v, fmt.Errorf("dump still interrupted after %d attempts: %w", dumpAttempts, err)
}

// Routes lists the routes of one table, optionally narrowed by protocol and
// link. Only unicast routes are returned.
func (h *Handle) Routes(family Family, f RouteFilter) ([]Route, error) {
	return retryDump(func() ([]Route, error) {
		var out []Route
		err := h.dump(unix.RTM_GETROUTE, routeDumpRequest(family), func(p []byte) {
			if r, ok := parseRoute(p, family, f); ok {
				out = appendGrown(out, r)
			}
		})
		return out, err
	})
}

func fromNetlinkRoute(r netlink.Route) Route {
	out := Route{
		LinkIndex: r.LinkIndex,
		Table:     r.Table,
		Protocol:  int(r.Protocol),
		OnLink:    r.Flags&unix.RTNH_F_ONLINK != 0,
		Scope:     Scope(r.Scope),
		Priority:  r.Priority,
	}
	if r.Type == unix.RTN_BLACKHOLE {
		out.Type, out.LinkIndex = RouteBlackhole, 0 // an IPv6 blackhole is reported on lo
	}
	if r.Dst != nil {
		out.Dst = prefixFromIPNet(r.Dst)
	}
	if gw, ok := netip.AddrFromSlice(r.Gw); ok {
		out.Gw = gw.Unmap()
	}
	if src, ok := netip.AddrFromSlice(r.Src); ok {
		out.Src = src.Unmap()
	}
	return out
}

func prefixFromIPNet(n *net.IPNet) netip.Prefix {
	a, _ := netip.AddrFromSlice(n.IP)
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(a.Unmap(), ones)
}

func toNetlinkRoute(r Route) *netlink.Route {
	nr := &netlink.Route{
		Dst:       &net.IPNet{IP: r.Dst.Addr().AsSlice(), Mask: net.CIDRMask(r.Dst.Bits(), r.Dst.Addr().BitLen())},
		LinkIndex: r.LinkIndex,
		Table:     r.Table,
		Protocol:  netlink.RouteProtocol(r.Protocol),
		Scope:     netlink.Scope(r.Scope),
		Type:      int(r.rtnType()),
		Priority:  r.Priority,
	}
	if r.Gw.IsValid() {
		nr.Gw = r.Gw.AsSlice()
	}
	if r.Src.IsValid() {
		nr.Src = r.Src.AsSlice()
	}
	if r.OnLink {
		nr.Flags |= unix.RTNH_F_ONLINK
	}
	return nr
}

// RouteAdd adds r; it fails with an error satisfying errors.Is(err,
// unix.EEXIST) when a route with the same key exists.
func (h *Handle) RouteAdd(r Route) error {
	if err := h.h.RouteAdd(toNetlinkRoute(r)); err != nil {
		return fmt.Errorf("adding route %s: %w", r, err)
	}
	return nil
}

// RouteReplace adds r or replaces the route with the same key.
func (h *Handle) RouteReplace(r Route) error {
	if err := h.h.RouteReplace(toNetlinkRoute(r)); err != nil {
		return fmt.Errorf("replacing route %s: %w", r, err)
	}
	return nil
}

// RouteDel deletes r. A route that is already gone is not an error.
func (h *Handle) RouteDel(r Route) error {
	return unlessAlready(h.h.RouteDel(toNetlinkRoute(r)), unix.ESRCH, "deleting route %s", r)
}

// unlessAlready is nil when err is nil or is errno, the kernel's answer
// when what was asked is so already (an object gone, or present); else err,
// wrapped in what was being done (format and args).
func unlessAlready(err error, errno unix.Errno, format string, args ...any) error {
	if err == nil || errors.Is(err, errno) {
		return nil
	}
	return fmt.Errorf(format+": %w", append(args, err)...)
}

// RouteGet asks the kernel which route it would use to reach dst.
func (h *Handle) RouteGet(dst netip.Addr) (Route, error) {
	rs, err := h.h.RouteGet(dst.AsSlice())
	if err != nil {
		return Route{}, fmt.Errorf("looking up route to %s: %w", dst, err)
	}
	if len(rs) == 0 {
		return Route{}, fmt.Errorf("looking up route to %s: no route", dst)
	}
	r := fromNetlinkRoute(rs[0])
	r.Dst = netip.PrefixFrom(dst, dst.BitLen())
	return r, nil
}
