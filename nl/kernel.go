package nl

import (
	"context"
	"net/netip"
)

// The contract of the kernel seam: what twill's sync engines and backends
// read and change, in narrow views. *Handle (the real kernel, through
// netlink) has them all; nlfake.Kernel models them as state, so the
// engines and the backends built on them, a third party's included, are
// unit-tested without root. A view's methods answer as the kernel does:
// the errors wrap the kernel's errno (unix.EEXIST, ESRCH, ENOENT, ENODEV)
// and ErrLinkNotFound, which callers test with errors.Is.

// RouteTable is what a route sync reads and changes: the routes of one
// family (RouteFilter narrows by table, protocol and link), changed in
// batches that answer one error (or nil) per operation, in order.
type RouteTable interface {
	Routes(family Family, f RouteFilter) ([]Route, error)
	RouteBatch(ops []RouteOp) []error
}

// RouteWatcher follows route events. WatchRoutes calls subscribed once the
// subscription stands (events after that are not missed) and fn for each
// event, until ctx ends or the subscription fails.
type RouteWatcher interface {
	WatchRoutes(ctx context.Context, subscribed func(), fn func(RouteEvent)) error
}

// NeighWatcher follows neighbour and FDB events, as RouteWatcher does routes.
type NeighWatcher interface {
	WatchNeighs(ctx context.Context, subscribed func(), fn func(NeighEvent)) error
}

// NeighTable is what a neighbour or FDB sync reads and changes.
type NeighTable interface {
	Neighs(link int, family Family) ([]Neigh, error)
	FDB(link int) ([]Neigh, error)
	NeighBatch(ops []NeighOp) []error
}

// RuleTable is what a policy-rule sync reads and changes.
type RuleTable interface {
	Rules(family Family) ([]Rule, error)
	RuleAdd(r Rule) error
	RuleDel(r Rule) error
}

// LinkWatcher follows link events, as RouteWatcher does routes.
type LinkWatcher interface {
	WatchLinks(ctx context.Context, subscribed func(), fn func(LinkEvent)) error
}

// Kernel is the union of the views above with the links, addresses,
// offloads and event subscriptions a backend sets up: what twilld hands a
// backend (backend.Options.Netlink). It is the whole contract: a backend
// finds nothing more by asserting a type on it. Handle is the kernel's;
// nlfake.Kernel models the same state without root.
type Kernel interface {
	RouteTable
	NeighTable
	RuleTable
	RouteWatcher
	NeighWatcher
	LinkWatcher
	RouteDel(r Route) error
	Links() ([]Link, error)
	LinkByName(name string) (Link, error)
	LinkByIndex(index int) (Link, error)
	LinkSetUp(index int) error
	LinkSetMTU(index, mtu int) error
	LinkDel(index int) error
	VXLANByName(name string) (Link, VXLAN, bool, error)
	VXLANAdd(v VXLAN) (Link, error)
	WireGuardAdd(name string, mtu int) (Link, error)
	Addrs(link int, family Family) ([]Addr, error)
	AddrAdd(link int, p netip.Prefix) error
	AddrDel(link int, p netip.Prefix) error
	// TXChecksum and SetTXChecksum read and set a device's TX checksum
	// offload (ethtool's tx-checksumming), by name.
	TXChecksum(name string) (bool, error)
	SetTXChecksum(name string, on bool) error
}
