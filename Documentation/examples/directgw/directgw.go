// Package directgw is the example backend of Documentation/writing-a-backend.md:
// a complete backend in one file, kept in the repository, built into a
// custom twilld (../twilld-directgw) and exercised by a lab test. It routes
// each peer's subnet straight to the peer's public IP, in a route table it
// can be told to use (main by default).
//
// Kernel objects it programs:
//
//	ip route <peer subnet> via <peer public IP> dev <ext> [table <Table>] proto 167
//
// It uses only twill's public packages, so it could live in any module.
package directgw

import (
	"context"
	"fmt"

	"github.com/twill-net/twill/backend"
	"github.com/twill-net/twill/backend/kernelsync"
	"github.com/twill-net/twill/nl"
	"github.com/twill-net/twill/subnet"
)

// Type is the name users put in net-conf.json.
const Type = "directgw"

func init() { backend.Register(Type, New) }

// Config is the backend's section of net-conf.json.
type Config struct {
	Table int // route table for peer routes; 0 means main
}

// Backend is directgw on one node.
type Backend struct {
	opts backend.Options
	cfg  Config
}

// New decodes the configuration strictly and checks its values; it does
// not touch the kernel.
func New(opts backend.Options) (backend.Backend, error) {
	var cfg Config
	if err := backend.DecodeConfig(opts.Config.Backend, &cfg); err != nil {
		return nil, err
	}
	if cfg.Table < 0 || cfg.Table > 252 {
		return nil, fmt.Errorf("net-conf.json: Backend.Table %d: must be between 0 (main) and 252", cfg.Table)
	}
	return &Backend{opts: opts, cfg: cfg}, nil
}

// Prepare publishes the node's address; there is nothing to set up.
func (b *Backend) Prepare(context.Context) (subnet.LeaseAttrs, error) {
	return subnet.LeaseAttrs{PublicIP: b.opts.ExtIface.PublicIP, BackendType: Type}, nil
}

// Attach returns the Network; RouteSync does the level-triggered work.
func (b *Backend) Attach(context.Context, subnet.Lease) (backend.Attached, error) {
	n := &network{b: b, routes: &kernelsync.RouteSync{NL: b.opts.Netlink, Table: b.cfg.Table, FullSyncEvery: b.opts.FullSyncEvery, WatchedSyncEvery: b.opts.WatchedSyncEvery, Log: b.opts.Logger}}
	// It can tell twillctl status what differs; every other capability
	// (incremental updates, a kernel watch...) it goes without.
	return backend.Attached{Network: n, Drift: n}, nil
}

type network struct {
	b      *Backend
	routes *kernelsync.RouteSync
}

func (n *network) MTU() int { return n.b.opts.ExtIface.Link.MTU }

// desired emits one route per reachable peer: the whole desired state.
func (n *network) desired(peers []subnet.Lease, emit func(nl.Route)) {
	ext := n.b.opts.ExtIface
	for _, p := range peers {
		if ext.Reachable(p.Attrs.PublicIP) {
			emit(nl.Route{Dst: p.Subnet, Gw: p.Attrs.PublicIP, LinkIndex: ext.Link.Index})
		}
	}
}

// Reconcile hands the desired routes to RouteSync, which compares them with
// the kernel's protocol-167 routes and adds, replaces and deletes the rest.
func (n *network) Reconcile(_ context.Context, peers []subnet.Lease) error {
	st, err := n.routes.Sync(func(emit func(nl.Route)) { n.desired(peers, emit) })
	n.b.opts.Metrics.AddDriftRepairs(st.Repaired)
	return err
}

// Drift lets twillctl status (a custom one that links this package) show
// how the kernel differs from the desired routes, changing nothing.
func (n *network) Drift(_ context.Context, peers []subnet.Lease) (backend.Drift, error) {
	var routes []nl.Route
	n.desired(peers, func(r nl.Route) { routes = append(routes, r) })
	return kernelsync.RouteDrift(n.routes.NL, n.b.cfg.Table, routes)
}
