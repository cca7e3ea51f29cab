// Package vxlan is the vxlan backend: an overlay that carries pod traffic
// between nodes in UDP, so nodes only need IP reachability between them.
//
// How it works. Each node has one VTEP device per VNI, twill.<VNI>, with
// learning off, bound to the external interface and its address, MTU the
// underlay's minus 50 (70 over IPv6), and the network address of the node's
// subnet as a /32. Its MAC is published in the lease as
// BackendData {"VNI":1,"VtepMAC":"…"} and stays the same across restarts
// and reboots. For every peer the node keeps three kernel objects:
//
//	neighbour  <peer VTEP IP> lladdr <peer VTEP MAC> dev twill.1 PERMANENT
//	fdb        <peer VTEP MAC> dev twill.1 dst <peer public IP> self permanent
//	route      <peer subnet> via <peer VTEP IP> dev twill.1 onlink proto 167
//
// where the peer's VTEP IP is the network address of its subnet. The
// kernel resolves the route's gateway through the static neighbour to the
// peer's VTEP MAC, and the FDB entry sends frames for that MAC to the peer's
// public IP over UDP (port 8472 by default).
//
// Reconcile is level-triggered over all three sets: a peer whose MAC or
// public IP changed has its entries replaced (the old FDB entry is removed,
// so exactly one remains), a removed peer loses all three, and entries no
// lease backs are deleted. If the device is deleted or altered (VNI, port,
// MTU, MAC, state), it is re-created and every peer replayed; a link watch
// makes that happen within moments. With DirectRouting, peers whose public
// IP is on-link get a host-gw route instead and no overlay entries.
package vxlan

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sync/errgroup"

	"github.com/twill-net/twill/backend"
	"github.com/twill-net/twill/backend/nl"
	"github.com/twill-net/twill/backend/owned"
	"github.com/twill-net/twill/subnet"
)

// Type is the name under which the backend registers.
const Type = "vxlan"

func init() { backend.Register(Type, New) }

// Defaults.
const (
	DefaultVNI  = 1
	DefaultPort = 8472
	// Overheads of the encapsulation: outer IP + UDP + VXLAN + inner Ethernet.
	overheadV4 = 50
	overheadV6 = 70
)

// Config is the backend's net-conf.json Backend object.
type Config struct {
	VNI           int
	Port          int
	MTU           int
	DirectRouting bool
}

// Data is what a node publishes as BackendData (flannel's field names).
type Data struct {
	VNI     int    `json:"VNI"`
	VtepMAC string `json:"VtepMAC"`
}

// Backend is vxlan on one node.
type Backend struct {
	opts backend.Options
	cfg  Config
	log  *slog.Logger
	dev  nl.VXLAN // the device as it must be
}

// New is the vxlan Factory.
func New(opts backend.Options) (backend.Backend, error) {
	cfg := Config{VNI: DefaultVNI, Port: DefaultPort}
	if err := backend.DecodeConfig(opts.Config.Backend, &cfg); err != nil {
		return nil, err
	}
	if cfg.VNI < 1 || cfg.VNI > 1<<24-1 {
		return nil, fmt.Errorf("net-conf.json: Backend.VNI %d: must be between 1 and 16777215", cfg.VNI)
	}
	if cfg.Port < 1 || cfg.Port > 65535 {
		return nil, fmt.Errorf("net-conf.json: Backend.Port %d: must be between 1 and 65535", cfg.Port)
	}
	ext := opts.ExtIface
	local, overhead := ext.Addr, overheadV4
	if !local.IsValid() {
		local, overhead = ext.AddrV6, overheadV6
	}
	mtu := ext.Link.MTU - overhead
	if opts.CheckOnly {
		mtu = 65535 - overhead // the interface is not known here
	}
	if cfg.MTU != 0 {
		if cfg.MTU < 576 || cfg.MTU > mtu {
			return nil, fmt.Errorf("net-conf.json: Backend.MTU %d: must be between 576 and %d (%s's MTU %d minus %d of encapsulation)",
				cfg.MTU, mtu, ext.Link.Name, ext.Link.MTU, overhead)
		}
		mtu = cfg.MTU
	}
	b := &Backend{opts: opts, cfg: cfg, log: opts.Logger.With("backend", Type)}
	b.dev = nl.VXLAN{Name: DeviceName(cfg.VNI), VNI: cfg.VNI, Port: cfg.Port, SrcAddr: local, VtepDevIndex: ext.Link.Index, MTU: mtu}
	return b, nil
}

// DeviceName is the VTEP device for a VNI.
func DeviceName(vni int) string { return owned.VXLANDevicePrefix + strconv.Itoa(vni) }

// Prepare creates (or repairs) the VTEP device and publishes its MAC.
func (b *Backend) Prepare(context.Context) (subnet.LeaseAttrs, error) {
	mac, err := b.vtepMAC()
	if err != nil {
		return subnet.LeaseAttrs{}, err
	}
	b.dev.HardwareAddr = mac
	if _, _, err := ensureDevice(b.opts.Netlink, b.dev, netip.Prefix{}); err != nil {
		return subnet.LeaseAttrs{}, err
	}
	data, err := json.Marshal(Data{VNI: b.cfg.VNI, VtepMAC: mac.String()})
	if err != nil {
		return subnet.LeaseAttrs{}, err
	}
	ext := b.opts.ExtIface
	return subnet.LeaseAttrs{PublicIP: ext.PublicIP, PublicIPv6: ext.PublicIPv6, BackendType: Type, BackendData: data}, nil
}

// ensureDevice makes the VTEP device match want (re-creating it when its
// identity is wrong), up, with addr assigned. It reports the link and
// whether it was (re)created.
func ensureDevice(h *nl.Handle, want nl.VXLAN, addr netip.Prefix) (nl.Link, bool, error) {
	link, have, isVXLAN, err := h.VXLANByName(want.Name)
	created := false
	switch {
	case errors.Is(err, nl.ErrLinkNotFound):
		link, err = h.VXLANAdd(want)
		if err != nil {
			return nl.Link{}, false, err
		}
		created = true
	case err != nil:
		return nl.Link{}, false, err
	case !isVXLAN || have.VNI != want.VNI || have.Port != want.Port || have.Learning || have.VtepDevIndex != want.VtepDevIndex ||
		have.SrcAddr != want.SrcAddr || have.MTU != want.MTU || !bytes.Equal(have.HardwareAddr, want.HardwareAddr):
		if err := h.LinkDel(link.Index); err != nil {
			return nl.Link{}, false, err
		}
		link, err = h.VXLANAdd(want)
		if err != nil {
			return nl.Link{}, false, err
		}
		created = true
	}
	if !link.Up {
		if err := h.LinkSetUp(link.Index); err != nil {
			return nl.Link{}, false, err
		}
	}
	if addr.IsValid() {
		addrs, err := h.Addrs(link.Index, nl.FamilyV4)
		if err != nil {
			return nl.Link{}, false, err
		}
		if !slices.ContainsFunc(addrs, func(a nl.Addr) bool { return a.Prefix == addr }) {
			if err := h.AddrAdd(link.Index, addr); err != nil {
				return nl.Link{}, false, err
			}
		}
	}
	return link, created, nil
}

// Attach returns the Network that programs the peers.
func (b *Backend) Attach(_ context.Context, lease subnet.Lease) (backend.Network, error) {
	h := b.opts.Netlink
	return &Network{
		b:       b,
		local:   lease,
		vtepIP:  netip.PrefixFrom(lease.Subnet.Addr(), 32),
		routes:  &backend.RouteSync{NL: h, FullSyncEvery: b.opts.FullSyncEvery},
		neighs:  &backend.NeighSync{NL: h, FullSyncEvery: b.opts.FullSyncEvery},
		fdb:     &backend.NeighSync{NL: h, FDB: true, FullSyncEvery: b.opts.FullSyncEvery},
		metrics: b.opts.Metrics,
	}, nil
}

// Network programs one node's overlay.
type Network struct {
	b       *Backend
	local   subnet.Lease
	vtepIP  netip.Prefix
	routes  *backend.RouteSync
	neighs  *backend.NeighSync
	fdb     *backend.NeighSync
	metrics *backend.Metrics

	mu      sync.Mutex
	refused []string // guarded by mu; peers with unusable backend data, for change-only logging
	devIdx  int      // guarded by mu; the device index the records are for

	// Used only by Reconcile (and BackendData, called after it), which the
	// daemon never runs concurrently.
	macCache   map[string]macEntry // parsed BackendData by raw JSON, for screenMACs
	macGen     uint64
	macRefused []string        // last refusals for a shared MAC, for change-only logging
	pending    json.RawMessage // BackendData to publish (a new VTEP MAC)
	dataCache  map[string]peerData
	gen        uint64
	macs       []net.HardwareAddr // per peer, reused between calls
	macErrs    []error
	recs       map[nl.Key]*peerRec // by peer subnet; nil forces reconcileAll
}

var (
	_ backend.KernelWatcher   = (*Network)(nil)
	_ backend.DriftReporter   = (*Network)(nil)
	_ backend.ExternalChanger = (*Network)(nil)
	_ backend.DataPublisher   = (*Network)(nil)
)

// macEntry is a peer's parsed BackendData.
type macEntry struct {
	mac net.HardwareAddr
	err error
	gen uint64
}

func (n *Network) macOf(raw []byte) (net.HardwareAddr, error) {
	e, ok := n.macCache[string(raw)]
	if !ok {
		e.mac, e.err = ParseData(n.b.cfg.VNI, raw)
	}
	e.gen = n.macGen
	n.macCache[string(raw)] = e
	return e.mac, e.err
}

// screen drops the peers whose VTEP MAC is not theirs alone, and takes a
// new MAC when a peer that keeps it publishes this node's. It reports
// whether this node's MAC changed.
func (n *Network) screen(peers []subnet.Lease) ([]subnet.Lease, bool) {
	if n.macCache == nil {
		n.macCache = map[string]macEntry{}
	}
	n.macGen++
	cfg, ext := n.b.cfg, n.b.opts.ExtIface
	own := n.b.dev.HardwareAddr
	peers, sc := screenMACs(n.local, own, peers, func(p subnet.Lease) bool { return isDirect(cfg, ext, p) }, n.macOf)
	if len(n.macCache) > 2*len(peers)+16 {
		for k, e := range n.macCache {
			if e.gen != n.macGen {
				delete(n.macCache, k)
			}
		}
	}
	if !slices.Equal(sc.refused, n.macRefused) && len(sc.refused) > 0 {
		shown := sc.refused[:min(5, len(sc.refused))]
		n.b.log.Warn("refusing peers whose VTEP MAC is not theirs alone", "count", len(sc.refused), "peers", strings.Join(shown, "; "))
	}
	n.macRefused = sc.refused
	if sc.takeNew == "" {
		return peers, false
	}
	inUse := map[string]bool{}
	for _, e := range n.macCache {
		if e.err == nil {
			inUse[e.mac.String()] = true
		}
	}
	mac := randomMAC(func(m net.HardwareAddr) bool { return inUse[m.String()] })
	n.b.log.Warn("this node's VTEP MAC is published by another node too (a cloned machine?); choosing a new one and publishing it",
		"mac", own, "peer", sc.takeNew, "new_mac", mac)
	n.b.dev.HardwareAddr = mac
	n.b.storeMAC(mac)
	n.pending, _ = json.Marshal(Data{VNI: n.b.cfg.VNI, VtepMAC: mac.String()})
	n.recs = nil
	return peers, true
}

// BackendData returns the backend data to publish when it changed since
// the lease was taken (a new VTEP MAC), once.
func (n *Network) BackendData() (json.RawMessage, bool) {
	d := n.pending
	n.pending = nil
	return d, d != nil
}

// ExternalChanged takes the external interface as it is now. A VTEP bound
// to a deleted link went with it; one bound to an old index is re-created
// on the new one, and every peer replayed.
func (n *Network) ExternalChanged(ext backend.ExternalInterface) {
	b := n.b
	b.opts.ExtIface = ext
	b.dev.VtepDevIndex = ext.Link.Index
	if ext.Addr.IsValid() {
		b.dev.SrcAddr = ext.Addr
	} else if ext.AddrV6.IsValid() {
		b.dev.SrcAddr = ext.AddrV6
	}
	n.routes.Invalidate()
	n.neighs.Invalidate()
	n.fdb.Invalidate()
	n.recs = nil
}

// Drift compares the device, neighbours, FDB entries and routes with what
// peers call for, changing nothing.
func (n *Network) Drift(_ context.Context, peers []subnet.Lease) (backend.Drift, error) {
	h := n.b.opts.Netlink
	link, have, ok, err := h.VXLANByName(n.b.dev.Name)
	if errors.Is(err, nl.ErrLinkNotFound) {
		return backend.Drift{Missing: []string{"device " + n.b.dev.Name}}, nil
	}
	if err != nil {
		return backend.Drift{}, err
	}
	var d backend.Drift
	cfg, ext := n.b.cfg, n.b.opts.ExtIface
	peers, sc := screenMACs(n.local, have.HardwareAddr, slices.Clone(peers), func(p subnet.Lease) bool { return isDirect(cfg, ext, p) },
		func(raw []byte) (net.HardwareAddr, error) { return ParseData(cfg.VNI, raw) })
	d.Refused = append(d.Refused, sc.refused...)
	if !ok || have.VNI != n.b.dev.VNI || have.Port != n.b.dev.Port || have.Learning || have.MTU != n.b.dev.MTU {
		d.Wrong = append(d.Wrong, fmt.Sprintf("device %s (want VNI %d, port %d, MTU %d, learning off)", n.b.dev.Name, n.b.dev.VNI, n.b.dev.Port, n.b.dev.MTU))
	}
	var (
		routes     []nl.Route
		neigh, fdb = map[string]nl.Neigh{}, map[string]nl.Neigh{}
	)
	refused := DesiredState(n.b.cfg, n.b.opts.ExtIface, link.Index, peers, func(i int) (net.HardwareAddr, error) {
		return ParseData(n.b.cfg.VNI, peers[i].Attrs.BackendData)
	}, Emitters{
		Route: func(r nl.Route) { routes = append(routes, r) },
		Neigh: func(e nl.Neigh) { neigh[e.IP.String()] = e },
		FDB:   func(e nl.Neigh) { fdb[net.HardwareAddr(e.HardwareAddr).String()] = e },
	})
	d.Refused = append(d.Refused, refused...)
	rd, err := backend.RouteDrift(h, 0, routes)
	if err != nil {
		return backend.Drift{}, err
	}
	d.Missing, d.Extra, d.Wrong = append(d.Missing, rd.Missing...), append(d.Extra, rd.Extra...), append(d.Wrong, rd.Wrong...)
	d.Objects = rd.Objects + len(neigh) + len(fdb)
	kernelNeigh, err := h.Neighs(link.Index, nl.FamilyAll)
	if err != nil {
		return backend.Drift{}, err
	}
	kernelFDB, err := h.FDB(link.Index)
	if err != nil {
		return backend.Drift{}, err
	}
	compare := func(kind string, want map[string]nl.Neigh, have []nl.Neigh, key func(nl.Neigh) string) {
		seen := map[string]bool{}
		for _, k := range have {
			if !k.Permanent {
				continue
			}
			w, ok := want[key(k)]
			desc := fmt.Sprintf("%s %s %s", kind, k.IP, net.HardwareAddr(k.HardwareAddr))
			switch {
			case !ok:
				d.Extra = append(d.Extra, desc)
			case w.IP != k.IP || !bytes.Equal(w.HardwareAddr, k.HardwareAddr):
				d.Wrong = append(d.Wrong, desc)
			default:
				seen[key(k)] = true
			}
		}
		for k, w := range want {
			if !seen[k] {
				d.Missing = append(d.Missing, fmt.Sprintf("%s %s %s", kind, w.IP, net.HardwareAddr(w.HardwareAddr)))
			}
		}
	}
	compare("neighbour", neigh, kernelNeigh, func(e nl.Neigh) string { return e.IP.String() })
	compare("fdb", fdb, kernelFDB, func(e nl.Neigh) string { return net.HardwareAddr(e.HardwareAddr).String() })
	slices.Sort(d.Missing)
	slices.Sort(d.Extra)
	slices.Sort(d.Wrong)
	return d, nil
}

// MTU is the VTEP device's.
func (n *Network) MTU() int { return n.b.dev.MTU }

// Emitters receive the desired kernel objects.
type Emitters struct {
	Route func(nl.Route)
	Neigh func(nl.Neigh)
	FDB   func(nl.Neigh)
}

// peerData is a peer's parsed backend data.
type peerData struct {
	mac net.HardwareAddr
	err error
	gen uint64
}

// ParseData reads a peer's BackendData for the configured VNI.
func ParseData(vni int, raw []byte) (net.HardwareAddr, error) {
	var data Data
	if err := json.Unmarshal(raw, &data); err != nil {
		return nil, fmt.Errorf("BackendData %s: %w", raw, err)
	}
	if data.VNI != vni {
		return nil, fmt.Errorf("BackendData VNI %d: this node uses VNI %d", data.VNI, vni)
	}
	mac, err := net.ParseMAC(data.VtepMAC)
	if err != nil || len(mac) != 6 {
		return nil, fmt.Errorf("BackendData VtepMAC %q: not a MAC address", data.VtepMAC)
	}
	return mac, nil
}

// PeerObjects is what one peer calls for: a route, and for overlay peers a
// neighbour and an FDB entry.
type PeerObjects struct {
	Route       nl.Route
	Neigh, FDB  nl.Neigh
	Overlay, OK bool
}

// ObjectsFor computes one peer's objects on the VTEP with index dev; mac
// and macErr are the peer's parsed BackendData (ignored for direct peers).
func ObjectsFor(cfg Config, ext backend.ExternalInterface, dev int, p subnet.Lease, mac net.HardwareAddr, macErr error) (PeerObjects, error) {
	if !p.Subnet.IsValid() {
		return PeerObjects{}, nil
	}
	// The daemon refuses such leases already; a backend never programs an
	// FDB entry or a route towards an address that is no node's.
	if err := subnet.CheckPublicIP(p.Attrs.PublicIP); err != nil {
		return PeerObjects{}, fmt.Errorf("PublicIP %w", err)
	}
	if isDirect(cfg, ext, p) {
		return PeerObjects{Route: nl.Route{Dst: p.Subnet, Gw: p.Attrs.PublicIP, LinkIndex: ext.Link.Index}, OK: true}, nil
	}
	if macErr != nil {
		return PeerObjects{}, macErr
	}
	vtep := p.Subnet.Addr()
	return PeerObjects{
		Route:   nl.Route{Dst: p.Subnet, Gw: vtep, LinkIndex: dev, OnLink: true},
		Neigh:   nl.Neigh{LinkIndex: dev, IP: vtep, HardwareAddr: mac, Permanent: true},
		FDB:     nl.Neigh{LinkIndex: dev, IP: p.Attrs.PublicIP, HardwareAddr: mac, Permanent: true},
		Overlay: true, OK: true,
	}, nil
}

func isDirect(cfg Config, ext backend.ExternalInterface, p subnet.Lease) bool {
	return cfg.DirectRouting && ext.Reachable(p.Attrs.PublicIP)
}

// DesiredState is the pure part of Reconcile: it emits what peers call for
// on the VTEP with index dev, and returns the peers it had to refuse.
// mac gives peer i's VTEP MAC from its BackendData (see ParseData).
func DesiredState(cfg Config, ext backend.ExternalInterface, dev int, peers []subnet.Lease,
	mac func(i int) (net.HardwareAddr, error), out Emitters) (refused []string) {
	for i, p := range peers {
		var (
			hw  net.HardwareAddr
			err error
		)
		if !isDirect(cfg, ext, p) {
			hw, err = mac(i)
		}
		o, err := ObjectsFor(cfg, ext, dev, p, hw, err)
		if err != nil {
			refused = append(refused, p.String()+": "+err.Error())
			continue
		}
		if !o.OK {
			continue
		}
		if o.Overlay && out.Neigh != nil {
			out.Neigh(o.Neigh)
		}
		if o.Overlay && out.FDB != nil {
			out.FDB(o.FDB)
		}
		if out.Route != nil {
			out.Route(o.Route)
		}
	}
	slices.Sort(refused)
	return refused
}

// parseCached is ParseData with a cache keyed by the raw JSON, so a lease
// event does not parse thousands of unchanged BackendData blobs again.
// Entries not used in the current generation are dropped by pruneCache.
func (n *Network) parseCached(raw []byte) (net.HardwareAddr, error) {
	if e, ok := n.dataCache[string(raw)]; ok {
		e.gen = n.gen
		n.dataCache[string(raw)] = e
		return e.mac, e.err
	}
	mac, err := ParseData(n.b.cfg.VNI, raw)
	n.dataCache[string(raw)] = peerData{mac: mac, err: err, gen: n.gen}
	return mac, err
}

func (n *Network) pruneCache() {
	for k, e := range n.dataCache {
		if e.gen != n.gen {
			delete(n.dataCache, k)
		}
	}
}

// Reconcile makes the device, neighbours, FDB and routes match peers.
func (n *Network) Reconcile(ctx context.Context, peers []subnet.Lease) error {
	peers, newMAC := n.screen(peers)
	h := n.b.opts.Netlink
	link, created, err := ensureDevice(h, n.b.dev, n.vtepIP)
	if err != nil {
		return fmt.Errorf("vxlan: %w", err)
	}
	n.mu.Lock()
	moved := n.devIdx != link.Index
	n.devIdx = link.Index
	n.mu.Unlock()
	if created || moved {
		if created && !newMAC {
			n.b.log.Warn("VTEP device was missing or altered; re-created it and replaying every peer", "device", n.b.dev.Name)
			n.metrics.AddDriftRepairs(1)
		}
		n.routes.Invalidate()
		n.neighs.Invalidate()
		n.fdb.Invalidate()
	}
	if created || moved || n.recs == nil {
		return n.reconcileAll(link, peers)
	}
	return n.reconcileChanges(link, peers)
}

// peerRec is what Reconcile last computed for one peer.
type peerRec struct {
	raw     string // BackendData as published
	pub     netip.Addr
	objects PeerObjects
	err     error
	key     string
	gen     uint64
}

// reconcileAll computes the whole desired state from peers and converges
// every set against the kernel. It runs first, after the device was
// re-created, and after any failure.
func (n *Network) reconcileAll(link nl.Link, peers []subnet.Lease) error {
	n.recs = nil // until this succeeds, the next call starts from scratch too
	if n.dataCache == nil {
		n.dataCache = map[string]peerData{}
	}
	n.gen++
	defer n.pruneCache()
	cfg, ext := n.b.cfg, n.b.opts.ExtIface
	// Parse every peer's data once (through the cache); the passes below
	// look the result up by position.
	n.macs, n.macErrs = n.macs[:0], n.macErrs[:0]
	for _, p := range peers {
		mac, err := n.parseCached(p.Attrs.BackendData)
		n.macs, n.macErrs = append(n.macs, mac), append(n.macErrs, err)
	}
	byPosition := func(i int) (net.HardwareAddr, error) { return n.macs[i], n.macErrs[i] }
	recs := make(map[nl.Key]*peerRec, len(peers))
	for i, p := range peers {
		if !p.Subnet.IsValid() {
			continue
		}
		o, err := ObjectsFor(cfg, ext, link.Index, p, n.macs[i], n.macErrs[i])
		recs[(nl.Route{Dst: p.Subnet}).Key()] = &peerRec{raw: string(p.Attrs.BackendData), pub: p.Attrs.PublicIP, objects: o, err: err, key: p.String(), gen: n.gen}
	}
	var refused []string
	nPlan, err := n.neighs.Plan(link.Index, func(emit func(nl.Neigh)) {
		refused = DesiredState(cfg, ext, link.Index, peers, byPosition, Emitters{Neigh: emit})
	})
	if err != nil {
		return fmt.Errorf("vxlan: %w", err)
	}
	n.reportRefused(refused)
	fPlan, err := n.fdb.Plan(link.Index, func(emit func(nl.Neigh)) {
		DesiredState(cfg, ext, link.Index, peers, byPosition, Emitters{FDB: emit})
	})
	if err != nil {
		return fmt.Errorf("vxlan: %w", err)
	}
	n.recs = recs
	return n.apply(nPlan, fPlan, func() (backend.SyncStats, error) {
		return n.routes.Sync(func(emit func(nl.Route)) {
			DesiredState(cfg, ext, link.Index, peers, byPosition, Emitters{Route: emit})
		})
	}, len(peers))
}

// reconcileChanges finds the peers that changed since the last reconcile
// (one map lookup per peer) and hands only their objects to the sets. The
// sets keep the whole desired state and compare only the changed keys with
// their record of the kernel, or everything against a fresh dump when the
// record is not trusted, so the result is the same as reconcileAll's.
func (n *Network) reconcileChanges(link nl.Link, peers []subnet.Lease) error {
	cfg, ext := n.b.cfg, n.b.opts.ExtIface
	n.gen++
	gen := n.gen
	var (
		routeUp          []nl.Route
		routeRm          []nl.Key
		neighUp, neighRm []nl.Neigh
		fdbUp, fdbRm     []nl.Neigh
		refusedChanged   bool
	)
	for _, p := range peers {
		if !p.Subnet.IsValid() {
			continue
		}
		k := (nl.Route{Dst: p.Subnet}).Key()
		rec := n.recs[k]
		if rec != nil && rec.pub == p.Attrs.PublicIP && rec.raw == string(p.Attrs.BackendData) {
			rec.gen = gen
			continue
		}
		var (
			mac    net.HardwareAddr
			macErr error
		)
		if !isDirect(cfg, ext, p) {
			mac, macErr = ParseData(cfg.VNI, p.Attrs.BackendData)
		}
		o, err := ObjectsFor(cfg, ext, link.Index, p, mac, macErr)
		if rec != nil {
			// What the peer had and no longer has goes; what it keeps is
			// replaced by the upserts below.
			old := rec.objects
			if old.Overlay && (!o.Overlay || !bytes.Equal(old.FDB.HardwareAddr, o.FDB.HardwareAddr)) {
				fdbRm = append(fdbRm, old.FDB)
			}
			if old.Overlay && !o.Overlay {
				neighRm = append(neighRm, old.Neigh)
			}
			if old.OK && !o.OK {
				routeRm = append(routeRm, old.Route.Key())
			}
			refusedChanged = refusedChanged || (rec.err != nil) != (err != nil)
		} else {
			refusedChanged = refusedChanged || err != nil
		}
		if o.OK {
			routeUp = append(routeUp, o.Route)
		}
		if o.Overlay {
			neighUp = append(neighUp, o.Neigh)
			fdbUp = append(fdbUp, o.FDB)
		}
		n.recs[k] = &peerRec{raw: string(p.Attrs.BackendData), pub: p.Attrs.PublicIP, objects: o, err: err, key: p.String(), gen: gen}
	}
	for k, rec := range n.recs {
		if rec.gen == gen {
			continue
		}
		if rec.objects.OK {
			routeRm = append(routeRm, rec.objects.Route.Key())
		}
		if rec.objects.Overlay {
			neighRm = append(neighRm, rec.objects.Neigh)
			fdbRm = append(fdbRm, rec.objects.FDB)
		}
		refusedChanged = refusedChanged || rec.err != nil
		delete(n.recs, k)
	}
	if refusedChanged {
		var refused []string
		for _, rec := range n.recs {
			if rec.err != nil {
				refused = append(refused, rec.key+": "+rec.err.Error())
			}
		}
		slices.Sort(refused)
		n.reportRefused(refused)
	}
	nPlan, err := n.neighs.PlanUpdate(link.Index, neighUp, neighRm)
	if err != nil {
		n.recs = nil
		return fmt.Errorf("vxlan: %w", err)
	}
	fPlan, err := n.fdb.PlanUpdate(link.Index, fdbUp, fdbRm)
	if err != nil {
		n.recs = nil
		return fmt.Errorf("vxlan: %w", err)
	}
	return n.apply(nPlan, fPlan, func() (backend.SyncStats, error) { return n.routes.Update(routeUp, routeRm) }, len(peers))
}

// apply carries out the plans in the safe order: neighbours and FDB
// entries first, so a new route is usable the moment it appears; then
// routes; stale neighbours and FDB entries last, after their routes.
func (n *Network) apply(nPlan, fPlan backend.NeighPlan, routes func() (backend.SyncStats, error), peers int) error {
	var errs []error
	if _, err := n.fdb.Apply(nl.OpReplace, fPlan.Set); err != nil {
		errs = append(errs, err)
	}
	if _, err := n.neighs.Apply(nl.OpReplace, nPlan.Set); err != nil {
		errs = append(errs, err)
	}
	st, err := routes()
	if err != nil {
		errs = append(errs, err)
	}
	if _, err := n.neighs.Apply(nl.OpDel, nPlan.Delete); err != nil {
		errs = append(errs, err)
	}
	if _, err := n.fdb.Apply(nl.OpDel, fPlan.Delete); err != nil {
		errs = append(errs, err)
	}
	n.metrics.AddDriftRepairs(st.Repaired)
	n.b.log.Debug("reconciled", "peers", peers, "routes_added", st.Added, "routes_deleted", st.Deleted,
		"neigh_set", len(nPlan.Set), "neigh_deleted", len(nPlan.Delete), "fdb_set", len(fPlan.Set), "fdb_deleted", len(fPlan.Delete))
	if err := errors.Join(errs...); err != nil {
		n.recs = nil // start from the whole state next time
		return fmt.Errorf("vxlan: %w", err)
	}
	return nil
}

func (n *Network) reportRefused(keys []string) {
	n.mu.Lock()
	changed := !slices.Equal(keys, n.refused)
	n.refused = keys
	n.mu.Unlock()
	if changed && len(keys) > 0 {
		shown := keys[:min(5, len(keys))]
		n.b.log.Warn("refusing peers with unusable vxlan backend data (wrong VNI or VTEP MAC)", "count", len(keys), "peers", strings.Join(shown, ", "))
	}
}

// WatchKernel pokes when the VTEP device changes or disappears, or when one
// of twill's routes changes behind its back. Every (re)subscription pokes,
// since events before it were not seen.
func (n *Network) WatchKernel(ctx context.Context, poke func()) error {
	h := n.b.opts.Netlink
	name := n.b.dev.Name
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		return backend.WatchLoop(ctx, n.b.log, "link", func() { n.routes.Invalidate(); poke() }, func(ctx context.Context, subscribed func()) error {
			return h.WatchLinks(ctx, subscribed, func(ev nl.LinkEvent) {
				if ev.Link.Name == name {
					poke()
				}
			})
		})
	})
	g.Go(func() error { return n.routes.Watch(ctx, n.b.log, poke) })
	return g.Wait()
}
