// Package eni is the eni backend: cloud-VPC style networking where each node
// has a secondary NIC (the "ENI") in the VPC subnet, pods get addresses the
// VPC routes to that ENI, and packets leave the node by policy routing, not
// through an overlay.
//
// Per node it keeps a route table for the ENI (RouteTable, 100 by default):
//
//	<VPC subnet> dev <eni> scope link table 100 proto 167
//	default via <VPC gateway> dev <eni> table 100 proto 167
//
// removes the VPC subnet's route from main (so pod traffic cannot leave by
// the ENI without the table), adds `from <ENI primary IP> lookup 100`, and
// sets loose rp_filter on the ENI. The CNI plugin adds, per pod,
// `to <pod> lookup main pref 512` and `from <pod> lookup 100 pref 1536`.
//
// Two modes. In prefix mode the node's lease subnet is delegated to its ENI
// by the provider, and for each peer lease the table gets
// `<peer prefix> via <peer ENI IP> dev <eni>`. In secondary-ip mode each pod
// takes one of the ENI's secondary IPs from a warm pool the daemon keeps
// filled through the provider (see pool.go).
//
// Cloud calls sit behind Provider; "static" (declared ENIs) is built in, and
// the lab/eni/sim package registers "sim", the simulated VPC of the
// tests and the lab.
package eni

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"path/filepath"
	"slices"
	"strconv"

	"github.com/twill-net/twill/backend"
	enicni "github.com/twill-net/twill/backend/eni/cni"
	"github.com/twill-net/twill/backend/kernelsync"
	"github.com/twill-net/twill/internal/sysctl"
	"github.com/twill-net/twill/nl"
	"github.com/twill-net/twill/subnet"
)

// Type is the name under which the backend registers.
const Type = "eni"

func init() { backend.Register(Type, New) }

// Modes.
const (
	ModePrefix      = enicni.ModePrefix
	ModeSecondaryIP = enicni.ModeSecondaryIP
)

// Kernel is what the eni backend reads and changes: the ENI's link and
// address, routes, policy rules. *nl.Handle has it all; nl/nlfake
// models it.
type Kernel interface {
	backend.RouteTable
	backend.RouteWatcher
	backend.RuleTable
	LinkByName(name string) (nl.Link, error)
	LinkSetUp(index int) error
	Addrs(link int, family nl.Family) ([]nl.Addr, error)
	AddrAdd(link int, p netip.Prefix) error
	RouteDel(r nl.Route) error
}

var _ Kernel = (*nl.Handle)(nil)

// Backend is eni on one node.
type Backend struct {
	opts backend.Options
	set  Settings
	prov Provider
	log  *slog.Logger
	k    Kernel
	// sysctl writes a sysctl of the node's namespace (sysctl.Set; tests
	// record them instead).
	sysctl func(name, value string) error

	link nl.Link
	eni  ENI
}

// New is the eni Factory.
func New(opts backend.Options) (backend.Backend, error) {
	set, err := ParseConfig(opts.Config.Backend)
	if err != nil {
		return nil, err
	}
	if opts.Config.EnableIPv6 {
		return nil, errors.New("eni: IPv6 is not supported by this backend yet (set EnableIPv6 false)")
	}
	if opts.CheckOnly {
		// The provider may be one only the node's twilld links, and may
		// look for files of the node: leave it to twilld.
		return &Backend{opts: opts, set: set}, nil
	}
	prov, err := newProvider(set.Provider, set.ProviderConfig)
	if err != nil {
		return nil, err
	}
	b := &Backend{opts: opts, set: set, prov: prov, log: opts.Logger.With("backend", Type, "mode", set.Mode), k: opts.Netlink, sysctl: sysctl.Set}
	return b, nil
}

// describe finds the ENI's link and asks the provider what the ENI is: a
// read, with no side effect in the cloud or the kernel.
func (b *Backend) describe(ctx context.Context) error {
	link, err := b.k.LinkByName(b.set.Interface)
	if err != nil {
		return fmt.Errorf("eni: Backend.Interface %q: %w", b.set.Interface, err)
	}
	mac := net.HardwareAddr(link.HardwareAddr).String()
	eni, err := b.prov.DescribeENI(ctx, mac)
	if err != nil {
		return fmt.Errorf("eni: describing the ENI of %s (%s): %w", link.Name, mac, err)
	}
	b.link, b.eni = link, eni
	return nil
}

// Prepare finds the ENI, asks the provider what it is, and publishes its
// primary IP for the peers' routes.
func (b *Backend) Prepare(ctx context.Context) (subnet.LeaseAttrs, error) {
	if !b.opts.ExtIface.PublicIP.IsValid() {
		return subnet.LeaseAttrs{}, fmt.Errorf("eni: interface %s has no IPv4 address to publish", b.opts.ExtIface.Link.Name)
	}
	if err := b.describe(ctx); err != nil {
		return subnet.LeaseAttrs{}, err
	}
	h, link, eni := b.k, b.link, b.eni
	addrs, err := h.Addrs(link.Index, nl.FamilyV4)
	if err != nil {
		return subnet.LeaseAttrs{}, fmt.Errorf("eni: %w", err)
	}
	has := false
	for _, a := range addrs {
		has = has || a.Prefix == eni.PrimaryIP
	}
	if !has {
		// What the cloud's DHCP would have done.
		if err := h.AddrAdd(link.Index, eni.PrimaryIP); err != nil {
			return subnet.LeaseAttrs{}, fmt.Errorf("eni: %w", err)
		}
	}
	if !link.Up {
		if err := h.LinkSetUp(link.Index); err != nil {
			return subnet.LeaseAttrs{}, fmt.Errorf("eni: %w", err)
		}
	}
	data, _ := json.Marshal(Data{ENI: eni.ID, ENIIP: eni.PrimaryIP.Addr()})
	ext := b.opts.ExtIface
	b.log.Info("using ENI", "eni", eni.ID, "iface", link.Name, "primary_ip", eni.PrimaryIP, "gateway", eni.Gateway, "provider", b.set.Provider)
	return subnet.LeaseAttrs{PublicIP: ext.PublicIP, BackendType: Type, BackendData: data}, nil
}

// Attach returns the Network that keeps the node's policy routing in
// place. It changes nothing in the cloud or the kernel (twillctl status
// attaches to compare): delegating the lease prefix is Reconcile's first
// step.
func (b *Backend) Attach(ctx context.Context, lease subnet.Lease) (backend.Attached, error) {
	if b.eni.ID == "" {
		if err := b.describe(ctx); err != nil {
			return backend.Attached{}, err
		}
	}
	n := &Network{
		b: b, set: b.set, link: b.link, eni: b.eni, log: b.log, metrics: b.opts.Metrics, lease: lease,
		routes:  &kernelsync.RouteSync{NL: b.k, Table: b.set.Table, FullSyncEvery: b.opts.FullSyncEvery, WatchedSyncEvery: b.opts.WatchedSyncEvery, Log: b.log},
		rules:   &kernelsync.RuleSync{NL: b.k, FullSyncEvery: b.opts.FullSyncEvery},
		refused: &kernelsync.RefusedPeers{Log: b.log, Message: "refusing peers whose ENI data cannot be routed"},
	}
	if b.set.Mode == ModeSecondaryIP {
		n.pool = &Pool{Dir: filepath.Join(b.opts.StateDir, "eni-pool"), Provider: b.prov, ENI: b.eni, Log: b.log,
			LowWater: b.set.LowWater, HighWater: b.set.HighWater, Cooldown: b.set.Cooldown}
		if err := n.pool.Init(); err != nil {
			return backend.Attached{}, err
		}
	}
	return backend.Attached{Network: n, Watcher: n, Runner: n, Env: n, Drift: n}, nil
}

// Network keeps one node's ENI policy routing.
type Network struct {
	b       *Backend
	set     Settings
	link    nl.Link
	eni     ENI
	log     *slog.Logger
	metrics *backend.Metrics
	routes  *kernelsync.RouteSync
	rules   *kernelsync.RuleSync
	pool    *Pool
	lease   subnet.Lease
	// delegated is set once the lease prefix is the ENI's in the cloud
	// (prefix mode); only Reconcile's goroutine touches it.
	delegated bool
	refused   *kernelsync.RefusedPeers
}

var (
	_ backend.KernelWatcher = (*Network)(nil)
	_ backend.DriftReporter = (*Network)(nil)
	_ backend.EnvProvider   = (*Network)(nil)
	_ backend.Runner        = (*Network)(nil)
)

// MTU is the ENI's: nothing is encapsulated.
func (n *Network) MTU() int { return n.link.MTU }

// Env tells the CNI plugin the table, the rule priorities and, in
// secondary-ip mode, where the warm pool is.
func (n *Network) Env() map[string]string {
	m := map[string]string{
		enicni.EnvMode: n.set.Mode, enicni.EnvTable: strconv.Itoa(n.set.Table), enicni.EnvENIInterface: n.link.Name,
		enicni.EnvRuleToPod: strconv.Itoa(n.set.RuleToPod), enicni.EnvRuleFromPod: strconv.Itoa(n.set.RuleFromPod),
	}
	if n.pool != nil {
		m[enicni.EnvPoolDir] = n.pool.Dir
	}
	return m
}

// Run keeps the warm pool (secondary-ip mode); in prefix mode it has
// nothing to do.
func (n *Network) Run(ctx context.Context) error {
	if n.pool == nil {
		return nil
	}
	return n.pool.Run(ctx)
}

// DesiredRoutes is the ENI table twill wants for these peers.
func (n *Network) DesiredRoutes(peers []subnet.Lease, emit func(nl.Route)) (bad map[string]string) {
	idx := n.link.Index
	emit(nl.Route{Dst: n.eni.Subnet(), LinkIndex: idx, Scope: nl.ScopeLink, Src: n.eni.PrimaryIP.Addr()})
	emit(nl.Route{Dst: netip.PrefixFrom(netip.IPv4Unspecified(), 0), Gw: n.eni.Gateway, LinkIndex: idx})
	if n.set.Mode != ModePrefix {
		return nil
	}
	for _, p := range peers {
		if !p.Subnet.IsValid() {
			continue
		}
		d, err := ParseData(p.Attrs.BackendData)
		if err == nil {
			if perr := subnet.CheckPublicIP(d.ENIIP); perr != nil {
				err = fmt.Errorf("ENIIP %w", perr)
			}
		}
		if err == nil && !n.eni.Subnet().Contains(d.ENIIP) {
			err = fmt.Errorf("ENIIP %s is not in this VPC subnet %s", d.ENIIP, n.eni.Subnet())
		}
		if err != nil {
			if bad == nil {
				bad = map[string]string{}
			}
			bad[p.String()] = err.Error()
			continue
		}
		emit(nl.Route{Dst: p.Subnet, Gw: d.ENIIP, LinkIndex: idx})
	}
	return bad
}

// Reconcile makes the node's ENI policy routing match: the table's routes,
// no VPC subnet route in main, the rule for the ENI's own address, and
// loose reverse-path filtering on the ENI.
func (n *Network) Reconcile(ctx context.Context, peers []subnet.Lease) error {
	if err := n.delegate(ctx); err != nil {
		return err
	}
	if err := n.nodeSetup(); err != nil {
		return fmt.Errorf("eni: %w", err)
	}
	var bad map[string]string
	st, err := n.routes.Sync(func(emit func(nl.Route)) { bad = n.DesiredRoutes(peers, emit) })
	n.reportBad(bad)
	n.metrics.AddDriftRepairs(st.Repaired)
	if st.Repaired > 0 {
		n.log.Info("repaired routes that had drifted", "count", st.Repaired)
	}
	if err != nil {
		return fmt.Errorf("eni: %w", err)
	}
	return nil
}

// reportBad counts the refused peers and logs them once per change of the
// set.
func (n *Network) reportBad(bad map[string]string) {
	n.metrics.SetPeersUnroutable(len(bad))
	refused := make([]string, 0, len(bad))
	for k, why := range bad {
		refused = append(refused, k+": "+why)
	}
	n.refused.Report(refused)
}

func (n *Network) nodeRule() nl.Rule {
	return nl.Rule{Priority: n.set.RuleFromPod, Src: netip.PrefixFrom(n.eni.PrimaryIP.Addr(), 32), Table: n.set.Table, Protocol: nl.RouteProtocol}
}

// delegate makes the lease prefix the ENI's in the cloud (prefix mode),
// and takes back the prefixes of earlier leases, once.
func (n *Network) delegate(ctx context.Context) error {
	if n.set.Mode != ModePrefix || n.delegated {
		return nil
	}
	b, lease := n.b, n.lease
	if err := b.prov.AssignPrefix(ctx, n.eni.ID, lease.Subnet); err != nil {
		return fmt.Errorf("eni: delegating the lease %s to ENI %s: %w", lease.Subnet, n.eni.ID, err)
	}
	// A prefix from an earlier lease of this node would stay routed to it
	// in the cloud, and blackhole whoever holds that subnet next.
	for _, p := range n.eni.Prefixes {
		if p == lease.Subnet {
			continue
		}
		if err := b.prov.UnassignPrefix(ctx, n.eni.ID, p); err != nil {
			return fmt.Errorf("eni: taking the old prefix %s back from ENI %s: %w", p, n.eni.ID, err)
		}
		n.log.Info("took back a prefix of an earlier lease from the ENI", "eni", n.eni.ID, "prefix", p, "lease", lease.Subnet)
	}
	n.delegated = true
	return nil
}

func (n *Network) nodeSetup() error {
	h := n.b.k
	if err := n.b.sysctl("net/ipv4/conf/"+n.link.Name+"/rp_filter", "2"); err != nil {
		return err
	}
	main, err := h.Routes(nl.FamilyV4, nl.RouteFilter{LinkIndex: n.link.Index})
	if err != nil {
		return err
	}
	for _, r := range main {
		if r.Dst == n.eni.Subnet() {
			if err := h.RouteDel(r); err != nil {
				return fmt.Errorf("removing the VPC subnet's route from main: %w", err)
			}
			n.log.Info("removed the VPC subnet's route from the main table; pods reach it only through table "+strconv.Itoa(n.set.Table), "route", r.String())
		}
	}
	_, err = n.rules.Sync(func(emit func(nl.Rule)) { emit(n.nodeRule()) })
	return err
}

// Drift compares the kernel with what peers call for, changing nothing.
func (n *Network) Drift(_ context.Context, peers []subnet.Lease) (backend.Drift, error) {
	var routes []nl.Route
	bad := n.DesiredRoutes(peers, func(r nl.Route) { routes = append(routes, r) })
	d, err := kernelsync.RouteDrift(n.b.k, n.set.Table, routes)
	if err != nil {
		return d, err
	}
	for k, why := range bad {
		d.Refused = append(d.Refused, k+": "+why)
	}
	slices.Sort(d.Refused)
	rules, err := n.b.k.Rules(nl.FamilyV4)
	if err != nil {
		return d, err
	}
	found := false
	for _, r := range rules {
		found = found || r.Same(n.nodeRule())
	}
	if !found {
		d.Missing = append(d.Missing, "rule "+n.nodeRule().String())
	}
	return d, nil
}

// WatchKernel pokes when one of twill's routes changes behind its back
// (see hostgw's).
func (n *Network) WatchKernel(ctx context.Context, poke, watching func()) error {
	return n.routes.Watch(ctx, n.log, poke, watching)
}
