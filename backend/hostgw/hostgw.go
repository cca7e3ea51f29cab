// Package hostgw is the host-gw backend: it routes each peer's subnet via
// that peer's public IP on the external interface. It needs every node on
// one L2 segment, and in exchange adds no encapsulation at all.
//
// How it works. For each peer lease it keeps one route in the main table:
//
//	<peer subnet> via <peer PublicIP> dev <ext iface> proto 167
//
// (and the IPv6 counterpart when the lease has one). Routes carry twill's
// protocol number, so Reconcile finds and removes its own stale routes, for
// example those of nodes deleted while the daemon was down, and never touches
// anyone else's. A peer whose public IP is not on a prefix connected to the
// external interface cannot be reached this way; it is refused, counted and
// logged, rather than given a route that would blackhole its traffic.
package hostgw

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"

	"github.com/twill-net/twill/backend"
	"github.com/twill-net/twill/backend/kernelsync"
	"github.com/twill-net/twill/nl"
	"github.com/twill-net/twill/subnet"
)

// Type is the name under which the backend registers.
const Type = "host-gw"

func init() { backend.Register(Type, New) }

// Config is the backend's net-conf.json Backend object. host-gw takes no
// options beyond Type.
type Config struct{}

// Backend is host-gw on one node.
type Backend struct {
	opts backend.Options
	log  *slog.Logger
}

// New is the host-gw Factory.
func New(opts backend.Options) (backend.Backend, error) {
	var c Config
	if err := backend.DecodeConfig(opts.Config.Backend, &c); err != nil {
		return nil, err
	}
	return &Backend{opts: opts, log: opts.Logger.With("backend", Type)}, nil
}

// Prepare publishes the external interface's public address; host-gw has
// no backend data.
func (b *Backend) Prepare(context.Context) (subnet.LeaseAttrs, error) {
	ext := b.opts.ExtIface
	if b.opts.Config.EnableIPv4 && !ext.PublicIP.IsValid() {
		return subnet.LeaseAttrs{}, &backend.NoAddressError{Backend: Type, Iface: ext.Link.Name,
			Hint: "host-gw routes IPv4 pods via each node's IPv4 address (give it one, pass --public-ip, or use vxlan)"}
	}
	if b.opts.Config.EnableIPv6 && !ext.PublicIPv6.IsValid() {
		return subnet.LeaseAttrs{}, &backend.NoAddressError{Backend: Type, Iface: ext.Link.Name, IPv6: true,
			Hint: "host-gw routes IPv6 pods via each node's IPv6 address (give it one, pass --public-ipv6, or use vxlan)"}
	}
	return subnet.LeaseAttrs{PublicIP: ext.PublicIP, PublicIPv6: ext.PublicIPv6, BackendType: Type}, nil
}

// Attach returns the Network that programs peer routes.
func (b *Backend) Attach(_ context.Context, lease subnet.Lease) (backend.Attached, error) {
	n := &Network{
		ext:         b.opts.ExtIface,
		log:         b.log,
		metrics:     b.opts.Metrics,
		routes:      &kernelsync.RouteSync{NL: b.opts.Netlink, FullSyncEvery: b.opts.FullSyncEvery, WatchedSyncEvery: b.opts.WatchedSyncEvery, Log: b.log},
		unreachable: map[string]string{},
		refused:     &kernelsync.RefusedPeers{Log: b.log, Message: "refusing peers whose public IP is not on-link: host-gw needs all nodes on one L2 segment; use vxlan (or DirectRouting) across routers"},
	}
	return backend.Attached{Network: n, Updater: n, Watcher: n, External: n, Drift: n}, nil
}

// Network programs host-gw routes for one lease.
type Network struct {
	ext     backend.ExternalInterface
	log     *slog.Logger
	metrics *backend.Metrics
	routes  *kernelsync.RouteSync
	refused *kernelsync.RefusedPeers
	// unreachable holds the peers refused for not being on-link, by lease
	// key (Reconcile's goroutine only).
	unreachable map[string]string
}

var (
	_ backend.Updater         = (*Network)(nil)
	_ backend.KernelWatcher   = (*Network)(nil)
	_ backend.DriftReporter   = (*Network)(nil)
	_ backend.ExternalChanger = (*Network)(nil)
)

// ExternalChanged takes the external interface as it is now: the routes
// through it were flushed with the link, or it has a new index.
func (n *Network) ExternalChanged(ext backend.ExternalInterface) {
	n.ext = ext
	n.routes.Invalidate()
}

// Drift compares the kernel with what peers call for, changing nothing.
func (n *Network) Drift(_ context.Context, peers []subnet.Lease) (backend.Drift, error) {
	var routes []nl.Route
	unreachable := DesiredRoutes(n.ext, peers, func(r nl.Route) { routes = append(routes, r) })
	d, err := kernelsync.RouteDrift(n.routes.NL, 0, routes)
	for _, u := range unreachable {
		d.Refused = append(d.Refused, u+": not on-link on "+n.ext.Link.Name+" (host-gw needs every node on one L2 segment)")
	}
	return d, err
}

// MTU is the external interface's: host-gw adds no header.
func (n *Network) MTU() int { return n.ext.Link.MTU }

// DesiredRoutes is the pure part of Reconcile: it emits the routes peers
// call for, and returns the keys of peers that cannot be reached directly.
func DesiredRoutes(ext backend.ExternalInterface, peers []subnet.Lease, emit func(nl.Route)) (unreachable []string) {
	for _, p := range peers {
		if !peerRoutes(ext, p, emit) {
			unreachable = append(unreachable, unreachableName(p))
		}
	}
	slices.Sort(unreachable)
	return unreachable
}

// peerRoutes emits one peer's routes and reports whether the peer can be
// reached directly in every family it has.
func peerRoutes(ext backend.ExternalInterface, p subnet.Lease, emit func(nl.Route)) bool {
	ok := true
	if p.Subnet.IsValid() {
		// The daemon refuses such leases already; never route to an
		// address that is no node's, even if it looks on-link.
		if subnet.CheckPublicIP(p.Attrs.PublicIP) == nil && ext.Reachable(p.Attrs.PublicIP) {
			emit(nl.Route{Dst: p.Subnet, Gw: p.Attrs.PublicIP, LinkIndex: ext.Link.Index})
		} else {
			ok = false
		}
	}
	if p.IPv6Subnet.IsValid() && p.Attrs.PublicIPv6.IsValid() {
		if subnet.CheckPublicIP(p.Attrs.PublicIPv6) == nil && ext.Reachable(p.Attrs.PublicIPv6) {
			emit(nl.Route{Dst: p.IPv6Subnet, Gw: p.Attrs.PublicIPv6, LinkIndex: ext.Link.Index})
		} else {
			ok = false
		}
	}
	return ok
}

func unreachableName(p subnet.Lease) string { return p.String() + " via " + p.Attrs.PublicIP.String() }

// Reconcile makes the main table's twill routes match peers.
func (n *Network) Reconcile(ctx context.Context, peers []subnet.Lease) error {
	clear(n.unreachable)
	st, err := n.routes.Sync(func(emit func(nl.Route)) {
		for _, p := range peers {
			if !peerRoutes(n.ext, p, emit) {
				n.unreachable[p.Key()] = unreachableName(p)
			}
		}
	})
	n.reportUnreachable()
	n.metrics.AddDriftRepairs(st.Repaired)
	if st.Repaired > 0 {
		n.log.Info("repaired routes that had drifted", "count", st.Repaired)
	}
	n.log.Debug("reconciled", "peers", len(peers), "added", st.Added, "replaced", st.Replaced, "deleted", st.Deleted, "dumped", st.Dumped)
	if err != nil {
		return fmt.Errorf("host-gw: %w", err)
	}
	return nil
}

// Update programs what changed: the routes of upserted peers, and no route
// of removed ones (a peer's route per family is keyed by its subnet, so a
// family a peer no longer has is removed too).
func (n *Network) Update(ctx context.Context, upserted, removed []subnet.Lease) error {
	var (
		routes []nl.Route
		gone   []netip.Prefix
	)
	for _, p := range removed {
		gone = append(gone, routeDsts(p)...)
		delete(n.unreachable, p.Key())
	}
	for _, p := range upserted {
		before := len(routes)
		if peerRoutes(n.ext, p, func(r nl.Route) { routes = append(routes, r) }) {
			delete(n.unreachable, p.Key())
		} else {
			n.unreachable[p.Key()] = unreachableName(p)
		}
		for _, dst := range routeDsts(p) {
			if !slices.ContainsFunc(routes[before:], func(r nl.Route) bool { return r.Dst == dst }) {
				gone = append(gone, dst) // a family it no longer reaches
			}
		}
	}
	_, err := n.routes.Update(routes, gone)
	n.reportUnreachable()
	if err != nil {
		return fmt.Errorf("host-gw: %w", err)
	}
	return nil
}

// routeDsts are the destinations of the routes a peer may have.
func routeDsts(p subnet.Lease) []netip.Prefix {
	var dsts []netip.Prefix
	for _, dst := range []netip.Prefix{p.Subnet, p.IPv6Subnet} {
		if dst.IsValid() {
			dsts = append(dsts, dst)
		}
	}
	return dsts
}

// reportUnreachable counts the refused peers and logs them once per change
// of the set.
func (n *Network) reportUnreachable() {
	keys := make([]string, 0, len(n.unreachable))
	for _, name := range n.unreachable {
		keys = append(keys, name)
	}
	n.metrics.SetPeersUnroutable(len(keys))
	n.refused.Report(keys, "iface", n.ext.Link.Name, "on_link", prefixes(n.ext.OnLink))
}

func prefixes(ps []netip.Prefix) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return strings.Join(s, ",")
}

// WatchKernel pokes when one of twill's routes changes behind its back.
// Every (re)subscription checks the kernel for changes made before it, then
// calls watching (RouteSync.Watch).
func (n *Network) WatchKernel(ctx context.Context, poke, watching func()) error {
	return n.routes.Watch(ctx, n.log, poke, watching)
}
