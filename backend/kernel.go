package backend

import (
	"context"
	"net/netip"

	"github.com/twill-net/twill/backend/nl"
)

// The narrow views of the kernel the sync engines need. *nl.Handle has
// them all; internal/kernelfake models them as maps, so the engines and the
// backends built on them are tested without root.

// RouteTable is what a RouteSync reads and changes.
type RouteTable interface {
	Routes(family nl.Family, f nl.RouteFilter) ([]nl.Route, error)
	RouteBatch(ops []nl.RouteOp) []error
}

// RouteWatcher follows route events (RouteSync.Watch).
type RouteWatcher interface {
	WatchRoutes(ctx context.Context, subscribed func(), fn func(nl.RouteEvent)) error
}

// NeighWatcher follows neighbour and FDB events (NeighSync.Watch).
type NeighWatcher interface {
	WatchNeighs(ctx context.Context, subscribed func(), fn func(nl.NeighEvent)) error
}

// NeighTable is what a NeighSync reads and changes.
type NeighTable interface {
	Neighs(link int, family nl.Family) ([]nl.Neigh, error)
	FDB(link int) ([]nl.Neigh, error)
	NeighBatch(ops []nl.NeighOp) []error
}

// RuleTable is what a RuleSync reads and changes.
type RuleTable interface {
	Rules(family nl.Family) ([]nl.Rule, error)
	RuleAdd(r nl.Rule) error
	RuleDel(r nl.Rule) error
}

// Kernel is the netlink seam a backend is given (Options.Netlink): the
// union of the views above with the links and addresses a backend sets up.
// twilld passes its *nl.Handle; unit tests pass internal/kernelfake's
// model. Watching is optional: a backend that follows events asserts
// RouteWatcher (or WatchLinks) on it, and does without when it is absent.
type Kernel interface {
	RouteTable
	NeighTable
	RuleTable
	RouteDel(r nl.Route) error
	Links() ([]nl.Link, error)
	LinkByName(name string) (nl.Link, error)
	LinkByIndex(index int) (nl.Link, error)
	LinkSetUp(index int) error
	LinkDel(index int) error
	VXLANByName(name string) (nl.Link, nl.VXLAN, bool, error)
	VXLANAdd(v nl.VXLAN) (nl.Link, error)
	Addrs(link int, family nl.Family) ([]nl.Addr, error)
	AddrAdd(link int, p netip.Prefix) error
}

var (
	_ Kernel       = (*nl.Handle)(nil)
	_ RouteTable   = (*nl.Handle)(nil)
	_ RouteWatcher = (*nl.Handle)(nil)
	_ NeighWatcher = (*nl.Handle)(nil)
	_ NeighTable   = (*nl.Handle)(nil)
	_ RuleTable    = (*nl.Handle)(nil)
)
