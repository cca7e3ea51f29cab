// Package takeover retires what flannel left on a node that twill now
// runs, once twill has taken its place, and never before.
//
// A node switched from flannel (flanneld stopped, twilld started on the
// same lease) keeps what flanneld and flannel's CNI plugin made:
//
//	cni0                 the bridge the running pods hang off, gateway .1
//	flannel.<VNI>        the VTEP (the vxlan backend replaces it at once)
//	<peer subnet> via <peer IP> dev eth0           host-gw routes, metric 0
//	FLANNEL-POSTRTG, FLANNEL-FWD (iptables), flannel-ipv4/-ipv6 (nftables)
//	/run/flannel/subnet.env
//
// Each pass reads that state, plans, and applies (level-triggered like
// the backends; plan is pure). While pods still hang off cni0 the bridge
// stays and proxy ARP is on on it, so that those pods, which see the
// node's whole subnet as on-link, reach the pods twill wires (each behind
// its own veth and /32 route) through the node. flannel's routes to peers
// go as soon as twill routes the same subnets (add before delete: twill's
// routes are already in place behind them, at a higher metric), so that
// a peer that leaves is not routed for good by a route nobody owns.
// flannel's iptables jumps are removed once twill's rules are in place.
// When the last pod has left cni0 (its DEL, through whichever plugin),
// the bridge, flannel's devices, chains and tables and its subnet.env are
// removed, and the takeover ends: a node with nothing of flannel's costs
// one look at start.
package takeover

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/twill-net/twill/nl"
)

// Defaults: where flannel keeps what it made.
const (
	DefaultSubnetFile = "/run/flannel/subnet.env"
	DefaultBridge     = "cni0"
	// DevicePrefix starts the name of flannel's VTEP devices.
	DevicePrefix = "flannel."
	// protoBoot is the rtnetlink protocol of a route added with none
	// given, as flanneld adds its host-gw routes.
	protoBoot = 3
)

// Kernel is what a takeover reads and changes: *nl.Handle has it.
type Kernel interface {
	Links() ([]nl.Link, error)
	Addrs(link int, family nl.Family) ([]nl.Addr, error)
	LinkDel(index int) error
	Routes(family nl.Family, f nl.RouteFilter) ([]nl.Route, error)
	RouteDel(r nl.Route) error
}

// Netfilter is flannel's rules: its iptables chains and nftables tables.
type Netfilter interface {
	// Present reports whether any of them is there.
	Present() (bool, error)
	// Unhook stops them applying (the jumps to the chains go).
	Unhook() error
	// Remove deletes them.
	Remove() error
}

// Options configure a takeover. Logger, Kernel and Netfilter are required.
type Options struct {
	Logger    *slog.Logger
	Kernel    Kernel
	Netfilter Netfilter
	// SetProxyARP turns proxy ARP on on a link (a sysctl).
	SetProxyARP func(link string) error
	// Networks are the cluster's pod networks.
	Networks   []netip.Prefix
	SubnetFile string // flannel's subnet.env
	// Every is the period of the passes while something of flannel's is
	// left (1 s when zero).
	Every time.Duration
}

// Takeover retires flannel's state on one node.
type Takeover struct {
	o Options
	// Only the loop goroutine uses these. flanneld is stopped, so what
	// it made does not come back: its routes and jumps, once gone, are not
	// looked for again (a route dump and iptables execs a second while
	// pods stay on the bridge would cost a large node dearly).
	unhooked   bool // flannel's jumps are gone
	routesDone bool // flannel's routes to peers twill routes are gone
}

// New returns a takeover; Run runs it.
func New(o Options) *Takeover {
	if o.SubnetFile == "" {
		o.SubnetFile = DefaultSubnetFile
	}
	if o.Every <= 0 {
		o.Every = time.Second
	}
	return &Takeover{o: o}
}

// State is what flannel left on the node.
type State struct {
	SubnetFile bool
	Bridge     *nl.Link
	// BridgePorts counts the links on the bridge: flannel's pods.
	BridgePorts int
	Devices     []nl.Link
	// Shadowing are flannel's routes to subnets twill routes too.
	Shadowing []nl.Route
	Netfilter bool
}

// Flannel reports whether anything of flannel's is there.
func (s State) Flannel() bool {
	return s.SubnetFile || s.Bridge != nil || len(s.Devices) > 0 || len(s.Shadowing) > 0 || s.Netfilter
}

// Plan is what one pass does.
type Plan struct {
	DelRoutes []nl.Route
	ProxyARP  string // the bridge to answer ARP on for twill's pods
	Unhook    bool
	// Retire removes the bridge, the devices, the rules and subnet.env:
	// no pod is left on the bridge.
	Retire bool
}

// PlanFor is the pass for state s: pure.
func PlanFor(s State, unhooked bool) Plan {
	p := Plan{DelRoutes: s.Shadowing, Unhook: s.Netfilter && !unhooked}
	if s.Bridge != nil && s.BridgePorts > 0 {
		p.ProxyARP = s.Bridge.Name
	} else if s.Flannel() {
		p.Retire = true
	}
	return p
}

// Run passes every Every until nothing of flannel's is left, then returns.
func (t *Takeover) Run(ctx context.Context) error {
	logged := ""
	for {
		done, err := t.Pass()
		if err != nil && err.Error() != logged {
			t.o.Logger.Warn("taking over from flannel: retrying", "err", err, "every", t.o.Every)
			logged = err.Error()
		}
		if done {
			return nil
		}
		timer := time.NewTimer(t.o.Every)
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil
		case <-timer.C:
		}
	}
}

// Pass reads, plans and applies once; done means nothing of flannel's is
// left.
func (t *Takeover) Pass() (done bool, err error) {
	s, err := t.read()
	if err != nil {
		return false, err
	}
	if !s.Flannel() {
		return true, nil
	}
	p := PlanFor(s, t.unhooked)
	if err := t.apply(p); err != nil {
		return false, err
	}
	return p.Retire, nil
}

// read looks at the links and flannel's subnet.env first: the routes and
// netfilter are read only on a node flannel ran on.
func (t *Takeover) read() (State, error) {
	var s State
	if _, err := os.Stat(t.o.SubnetFile); err == nil {
		s.SubnetFile = true
	} else if !errors.Is(err, os.ErrNotExist) {
		return s, fmt.Errorf("reading flannel's %s: %w", t.o.SubnetFile, err)
	}
	links, err := t.o.Kernel.Links()
	if err != nil {
		return s, fmt.Errorf("listing links: %w", err)
	}
	for i, l := range links {
		switch {
		case l.Name == DefaultBridge:
			// Only flannel's: a bridge of that name that holds no
			// address of the cluster's networks is someone else's.
			ours, err := t.podBridge(l)
			if err != nil {
				return s, err
			}
			if ours {
				s.Bridge = &links[i]
			}
		case strings.HasPrefix(l.Name, DevicePrefix) && l.Type == "vxlan":
			s.Devices = append(s.Devices, l)
		}
	}
	if s.Bridge != nil {
		for _, l := range links {
			if l.MasterIndex == s.Bridge.Index {
				s.BridgePorts++
			}
		}
	}
	if !s.Flannel() {
		// Chains alone are looked for once, at start, by Present below
		// only when flannel left something else: a node that never ran
		// flannel pays no iptables exec.
		return s, nil
	}
	if !t.routesDone {
		if s.Shadowing, err = t.shadowing(); err != nil {
			return s, err
		}
	}
	s.Netfilter = true // unhooked, but there until retired
	if !t.unhooked {
		if s.Netfilter, err = t.o.Netfilter.Present(); err != nil {
			return s, fmt.Errorf("looking for flannel's rules: %w", err)
		}
		// None there: none to unhook, and none will come (iptables is
		// not asked again each second while pods stay on the bridge).
		t.unhooked = !s.Netfilter
	}
	return s, nil
}

// podBridge reports whether bridge l holds an address in one of the
// cluster's networks: flannel's gateway for this node's pods.
func (t *Takeover) podBridge(l nl.Link) (bool, error) {
	return IsFlannelBridge(t.o.Kernel, l, func(p netip.Prefix) bool {
		for _, n := range t.o.Networks {
			if n.Contains(p.Addr()) {
				return true
			}
		}
		return false
	})
}

// AddrReader reads a link's addresses (*nl.Handle has it).
type AddrReader interface {
	Addrs(link int, family nl.Family) ([]nl.Addr, error)
}

// IsFlannelBridge is the one test of whether link l is flannel's bridge:
// DefaultBridge, a bridge, holding an address (the pods' gateway) that
// ours accepts. A bridge of that name that is someone else's is never
// changed or removed.
func IsFlannelBridge(k AddrReader, l nl.Link, ours func(netip.Prefix) bool) (bool, error) {
	if l.Name != DefaultBridge || l.Type != "bridge" {
		return false, nil
	}
	addrs, err := k.Addrs(l.Index, nl.FamilyAll)
	if err != nil {
		return false, fmt.Errorf("reading %s's addresses: %w", l.Name, err)
	}
	for _, a := range addrs {
		if ours(a.Prefix) {
			return true, nil
		}
	}
	return false, nil
}

// shadowing lists flannel's routes to a subnet that twill routes too.
func (t *Takeover) shadowing() ([]nl.Route, error) {
	routes, err := t.o.Kernel.Routes(nl.FamilyAll, nl.RouteFilter{Table: nl.MainTable})
	if err != nil {
		return nil, fmt.Errorf("listing routes: %w", err)
	}
	twill := map[netip.Prefix]bool{}
	for _, r := range routes {
		if r.Protocol == nl.RouteProtocol {
			twill[r.Dst] = true
		}
	}
	var out []nl.Route
	for _, r := range routes {
		if r.Protocol == protoBoot && r.Gw.IsValid() && twill[r.Dst] && t.inNetworks(r.Dst) {
			out = append(out, r)
		}
	}
	return out, nil
}

func (t *Takeover) inNetworks(p netip.Prefix) bool {
	for _, n := range t.o.Networks {
		if n.Bits() <= p.Bits() && n.Contains(p.Addr()) {
			return true
		}
	}
	return false
}

func (t *Takeover) apply(p Plan) error {
	var errs []error
	log := t.o.Logger
	for _, r := range p.DelRoutes {
		if err := t.o.Kernel.RouteDel(r); err != nil {
			errs = append(errs, fmt.Errorf("deleting flannel's route %s: %w", r, err))
		}
	}
	if len(p.DelRoutes) > 0 {
		log.Info("deleted flannel's routes to peers that twill routes now", "routes", len(p.DelRoutes))
	}
	t.routesDone = len(errs) == 0
	if p.ProxyARP != "" && t.o.SetProxyARP != nil {
		if err := t.o.SetProxyARP(p.ProxyARP); err != nil {
			errs = append(errs, err)
		}
	}
	if p.Unhook {
		if err := t.o.Netfilter.Unhook(); err != nil {
			errs = append(errs, fmt.Errorf("unhooking flannel's chains: %w", err))
		} else {
			t.unhooked = true
			log.Info("flannel's masquerade and forward chains no longer apply: twill's rules are in place")
		}
	}
	if p.Retire {
		errs = append(errs, t.retire())
	}
	return errors.Join(errs...)
}

// retire removes what is left of flannel: no pod hangs off its bridge.
func (t *Takeover) retire() error {
	var errs []error
	links, err := t.o.Kernel.Links()
	if err != nil {
		return fmt.Errorf("listing links: %w", err)
	}
	for _, l := range links {
		bridge, err := t.podBridge(l)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if bridge || (strings.HasPrefix(l.Name, DevicePrefix) && l.Type == "vxlan") {
			if err := t.o.Kernel.LinkDel(l.Index); err != nil && !errors.Is(err, nl.ErrLinkNotFound) {
				errs = append(errs, fmt.Errorf("deleting flannel's %s: %w", l.Name, err))
			}
		}
	}
	if err := t.o.Netfilter.Remove(); err != nil {
		errs = append(errs, fmt.Errorf("removing flannel's rules: %w", err))
	}
	// subnet.env goes last, and only once the rest is gone: while it is
	// there the next pass sees flannel's node and retries what failed.
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if err := os.Remove(t.o.SubnetFile); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing flannel's %s: %w", t.o.SubnetFile, err)
	}
	t.o.Logger.Info("no pod is left on flannel's bridge: removed the bridge, flannel's devices, rules and subnet.env; the takeover from flannel is done",
		"bridge", DefaultBridge, "subnet_file", t.o.SubnetFile)
	return nil
}
