// Package nl is twill's only door to netlink, and the one backends use. Every route, neighbour, rule and
// link twill reads or writes passes through a Handle bound to one network
// namespace, so that a test can point the whole daemon at a namespace it made,
// and so that the kernel's "dump interrupted" answer is retried in one place.
//
// The types here are plain values built on net/netip; conversion to the
// vishvananda/netlink types happens only in the _linux.go files.
package nl

import (
	"errors"
	"fmt"
	"net/netip"
)

// Route is the part of a kernel route twill reasons about.
type Route struct {
	Dst       netip.Prefix
	Gw        netip.Addr // invalid for a link-scope route
	LinkIndex int
	Table     int // 0 means main
	Protocol  int
	OnLink    bool
	Scope     Scope
	Src       netip.Addr
	Priority  int // the metric (RTA_PRIORITY); part of the route's identity
	Type      RouteType
}

// RouteType is a route's type (RTN_*) among those twill programs; the zero
// value is unicast.
type RouteType uint8

const (
	// RouteUnicast forwards to a gateway or out of a link.
	RouteUnicast RouteType = 0
	// RouteBlackhole drops silently: no link, no gateway.
	RouteBlackhole RouteType = 6 // RTN_BLACKHOLE
)

// Scope is a route scope (RT_SCOPE_*).
type Scope uint8

// Route scopes used by twill.
const (
	ScopeUniverse Scope = 0
	ScopeLink     Scope = 253
	ScopeHost     Scope = 254
)

// Key identifies a route in a table the way the kernel does for replace:
// destination, metric and table. It is plain bytes, so maps of thousands
// of routes hash and compare it quickly.
type Key struct {
	Addr     [16]byte
	Bits     uint8
	V4       bool
	Table    uint32
	Priority uint32
}

// Key returns the identity of r.
func (r Route) Key() Key {
	return Key{Addr: r.Dst.Addr().As16(), Bits: uint8(r.Dst.Bits()), V4: r.Dst.Addr().Is4(), Table: uint32(r.table()), Priority: uint32(r.Priority)}
}

// rtnType is r's RTN_* type.
func (r Route) rtnType() uint8 {
	if r.Type == RouteUnicast {
		return 1 // RTN_UNICAST
	}
	return uint8(r.Type)
}

func (r Route) table() int {
	if r.Table == 0 {
		return 254
	}
	return r.Table
}

// Equal reports whether two routes would be programmed identically.
func (r Route) Equal(o Route) bool {
	return r.Dst == o.Dst && r.Gw == o.Gw && r.LinkIndex == o.LinkIndex &&
		r.table() == o.table() && r.Protocol == o.Protocol && r.OnLink == o.OnLink &&
		r.Scope == o.Scope && r.Src == o.Src && r.Priority == o.Priority && r.Type == o.Type
}

func (r Route) String() string {
	s := r.Dst.String()
	if r.Type == RouteBlackhole {
		s = "blackhole " + s
	}
	if r.Gw.IsValid() {
		s += " via " + r.Gw.String()
	}
	s += fmt.Sprintf(" dev#%d", r.LinkIndex)
	if r.table() != 254 {
		s += fmt.Sprintf(" table %d", r.table())
	}
	if r.OnLink {
		s += " onlink"
	}
	return s
}

// Link is the part of a network interface twill reasons about.
type Link struct {
	Index        int
	Name         string
	MTU          int
	Up           bool
	HardwareAddr []byte
	Type         string
	Alias        string
	// PeerIndex is a veth's peer link index (in the peer's namespace).
	PeerIndex int
	// MasterIndex is the bridge (or other master) the link is a port of.
	MasterIndex int
}

// Neigh is a neighbour (ARP/NDP) entry.
type Neigh struct {
	LinkIndex    int
	IP           netip.Addr
	HardwareAddr []byte
	Permanent    bool
}

// Addr is an address assigned to a link.
type Addr struct {
	Prefix    netip.Prefix // address with its on-link prefix length
	LinkIndex int
}

// VXLAN is a VXLAN device's configuration.
type VXLAN struct {
	Name         string
	VNI          int
	Port         int
	Learning     bool
	SrcAddr      netip.Addr
	VtepDevIndex int
	MTU          int
	HardwareAddr []byte
}

// Rule is a policy-routing rule: packets matching Src and/or Dst look up
// Table, at Priority.
type Rule struct {
	Priority int
	Src      netip.Prefix // invalid: any source
	Dst      netip.Prefix // invalid: any destination
	Table    int
	Protocol int // FRA_PROTOCOL: who installed the rule (twill's 167/168)
}

// Same reports whether two rules match and act alike (the protocol aside).
func (r Rule) Same(o Rule) bool {
	return r.Priority == o.Priority && r.Src == o.Src && r.Dst == o.Dst && r.Table == o.Table
}

func (r Rule) String() string {
	s := fmt.Sprintf("pref %d", r.Priority)
	if r.Src.IsValid() {
		s += " from " + r.Src.String()
	}
	if r.Dst.IsValid() {
		s += " to " + r.Dst.String()
	}
	return s + fmt.Sprintf(" lookup %d", r.Table)
}

// Family selects an address family for listings.
type Family int

// Address families.
const (
	FamilyAll Family = 0  // AF_UNSPEC
	FamilyV4  Family = 2  // AF_INET
	FamilyV6  Family = 10 // AF_INET6
)

// RouteFilter narrows a route listing. Zero fields match anything, except
// Table, where 0 means the main table.
type RouteFilter struct {
	AllTables bool // every table; Table is ignored
	Table     int
	Protocol  int
	LinkIndex int
}

// ErrNotSupported is returned (wrapped) when the kernel lacks what a call
// needs (a link type whose module is absent).
var ErrNotSupported = errors.New("not supported by this kernel")

// ErrLinkNotFound is returned (wrapped) when a named or indexed link is absent.
var ErrLinkNotFound = errors.New("link not found")

// RouteEvent is a change the kernel announced to one of its routes.
type RouteEvent struct {
	Deleted bool
	Route   Route
	// NonUnicast marks a blackhole, unreachable, prohibit or other
	// non-unicast route (which dumps leave out): added, it takes the place
	// of any unicast route with its key.
	NonUnicast bool
}

// NeighEvent is a change to a neighbour entry, or with FDB an FDB entry,
// as a neighbour subscription sees it.
type NeighEvent struct {
	Deleted bool
	FDB     bool
	Neigh   Neigh
}

// watchReceiveBuffer is the receive buffer of event subscriptions. A burst
// of thousands of route changes (a start-up, a mass lease change) overflows
// the kernel's default and loses the subscription (ENOBUFS); 8 MiB holds
// about 50,000 route messages. The kernel allocates it only as it fills.
const watchReceiveBuffer = 8 << 20

// LinkEvent is a change the kernel announced to a link.
type LinkEvent struct {
	Deleted bool
	Link    Link
}

// AddrEvent is a change the kernel announced to an address.
type AddrEvent struct {
	Deleted   bool
	LinkIndex int
	Prefix    netip.Prefix
}

// Op is a kind of route change.
type Op int

// Route changes.
const (
	OpAdd     Op = iota // fail with EEXIST if the key is taken
	OpReplace           // add or replace the route with the same key
	OpDel               // a missing route is not an error
)

// RouteOp is one change in a batch.
type RouteOp struct {
	Op    Op
	Route Route
}

// NeighOp is one neighbour or FDB change in a batch.
type NeighOp struct {
	Op    Op // OpReplace or OpDel
	Neigh Neigh
	// FDB makes it a bridge forwarding entry (MAC -> remote IP, on the
	// device itself) rather than an ARP/NDP entry.
	FDB bool
}
