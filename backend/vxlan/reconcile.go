package vxlan

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"

	"github.com/twill-net/twill/backend"
	"github.com/twill-net/twill/backend/nl"
	"github.com/twill-net/twill/subnet"
)

// Network programs one node's overlay.
type Network struct {
	b       *Backend
	local   subnet.Lease
	vtepIP  netip.Prefix
	routes  *backend.RouteSync
	neighs  *backend.NeighSync
	fdb     *backend.NeighSync
	metrics *backend.Metrics

	// The rest is used only by Reconcile (and BackendData, ExternalChanged,
	// called from the same goroutine), which the daemon never runs
	// concurrently.
	devIdx     int                 // the device index the records are for
	parsed     map[string]parsed   // BackendData by raw JSON: parsed once
	gen        uint64              // this reconcile's stamp
	recs       map[nl.Key]*peerRec // by peer subnet; nil forces a full reconcile
	refused    []string            // last refused peers, for change-only logging
	macRefused []string            // last peers refused for a shared MAC
	pending    json.RawMessage     // BackendData to publish (a new VTEP MAC)
}

var (
	_ backend.KernelWatcher   = (*Network)(nil)
	_ backend.DriftReporter   = (*Network)(nil)
	_ backend.ExternalChanger = (*Network)(nil)
	_ backend.DataPublisher   = (*Network)(nil)
)

// parsed is a peer's BackendData, parsed, with the reconcile that last
// used it.
type parsed struct {
	mac net.HardwareAddr
	err error
	gen uint64
}

// macOf parses raw BackendData once per distinct value.
func (n *Network) macOf(raw []byte) (net.HardwareAddr, error) {
	e, ok := n.parsed[string(raw)]
	if !ok {
		e.mac, e.err = ParseData(n.b.cfg.VNI, raw)
	}
	e.gen = n.gen
	n.parsed[string(raw)] = e
	return e.mac, e.err
}

// peerRec is what Reconcile last computed for one peer.
type peerRec struct {
	raw     string // BackendData as published
	pub     netip.Addr
	objects PeerObjects
	err     error
	name    string
	gen     uint64
}

// compute is a peer's desired objects on the device with index dev.
func (n *Network) compute(dev int, p subnet.Lease) *peerRec {
	cfg, ext := n.b.cfg, n.b.opts.ExtIface
	var (
		mac    net.HardwareAddr
		macErr error
	)
	if !isDirect(cfg, ext, p) {
		mac, macErr = n.macOf(p.Attrs.BackendData)
	}
	o, err := ObjectsFor(cfg, ext, dev, p, mac, macErr)
	return &peerRec{raw: string(p.Attrs.BackendData), pub: p.Attrs.PublicIP, objects: o, err: err, name: p.String(), gen: n.gen}
}

// changes are the three sets' planned changes.
type changes struct {
	routes    *backend.RouteChange
	neigh     *backend.NeighChange
	fdb       *backend.NeighChange
	refused   []string
	refusedOK bool // refused is the whole current list
}

// Reconcile makes the device, neighbours, FDB and routes match peers.
func (n *Network) Reconcile(ctx context.Context, peers []subnet.Lease) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	n.gen++
	peers, newMAC := n.screen(peers)
	link, created, err := ensureDevice(n.b.k, n.b.dev, n.vtepIP)
	if err != nil {
		return fmt.Errorf("vxlan: %w", err)
	}
	if created || n.devIdx != link.Index {
		if created && !newMAC {
			n.b.log.Warn("VTEP device was missing or altered; re-created it and replaying every peer", "device", n.b.dev.Name)
			n.metrics.AddDriftRepairs(1)
		}
		n.devIdx = link.Index
		n.invalidate()
	}
	n.neighs.SetLink(link.Index)
	n.fdb.SetLink(link.Index)
	var ch changes
	if n.recs == nil {
		ch, err = n.planAll(link.Index, peers)
	} else {
		ch, err = n.planChanges(link.Index, peers)
	}
	n.prune()
	if err != nil {
		n.recs = nil
		return fmt.Errorf("vxlan: %w", err)
	}
	if ch.refusedOK {
		n.reportRefused(ch.refused)
	}
	if err := n.apply(ch, len(peers)); err != nil {
		n.recs = nil // start from the whole state next time
		return fmt.Errorf("vxlan: %w", err)
	}
	return nil
}

// planAll computes every peer's objects once and plans each set against
// the whole of them. It runs first, after the device was re-created, and
// after any failure.
func (n *Network) planAll(dev int, peers []subnet.Lease) (changes, error) {
	recs := make(map[nl.Key]*peerRec, len(peers))
	var (
		routes       []nl.Route
		neighs, fdbs []nl.Neigh
		refused      []string
	)
	for _, p := range peers {
		if !p.Subnet.IsValid() {
			continue
		}
		rec := n.compute(dev, p)
		recs[(nl.Route{Dst: p.Subnet}).Key()] = rec
		switch o := rec.objects; {
		case rec.err != nil:
			refused = append(refused, rec.name+": "+rec.err.Error())
		case o.Overlay:
			neighs, fdbs = append(neighs, o.Neigh), append(fdbs, o.FDB)
			routes = append(routes, o.Route)
		case o.OK:
			routes = append(routes, o.Route)
		}
	}
	slices.Sort(refused)
	ch := changes{refused: refused, refusedOK: true}
	var err error
	if ch.fdb, err = n.fdb.Prepare(emitAll(fdbs)); err != nil {
		return ch, err
	}
	if ch.neigh, err = n.neighs.Prepare(emitAll(neighs)); err != nil {
		return ch, err
	}
	if ch.routes, err = n.routes.Prepare(emitAll(routes)); err != nil {
		return ch, err
	}
	n.recs = recs
	return ch, nil
}

func emitAll[V any](vs []V) func(emit func(V)) {
	return func(emit func(V)) {
		for _, v := range vs {
			emit(v)
		}
	}
}

// planChanges finds the peers that changed since the last reconcile (one
// map lookup per peer) and plans only their objects. The sets keep the
// whole desired state, so the result is planAll's.
func (n *Network) planChanges(dev int, peers []subnet.Lease) (changes, error) {
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
		old := n.recs[k]
		if old != nil && old.pub == p.Attrs.PublicIP && old.raw == string(p.Attrs.BackendData) {
			old.gen = n.gen
			continue
		}
		rec := n.compute(dev, p)
		o := rec.objects
		if old != nil {
			// What the peer had and no longer has goes; what it keeps is
			// replaced by the upserts below.
			was := old.objects
			if was.Overlay && (!o.Overlay || !slices.Equal(was.FDB.HardwareAddr, o.FDB.HardwareAddr)) {
				fdbRm = append(fdbRm, was.FDB)
			}
			if was.Overlay && !o.Overlay {
				neighRm = append(neighRm, was.Neigh)
			}
			if was.OK && !o.OK {
				routeRm = append(routeRm, was.Route.Key())
			}
			refusedChanged = refusedChanged || (old.err != nil) != (rec.err != nil)
		} else {
			refusedChanged = refusedChanged || rec.err != nil
		}
		if o.OK {
			routeUp = append(routeUp, o.Route)
		}
		if o.Overlay {
			neighUp, fdbUp = append(neighUp, o.Neigh), append(fdbUp, o.FDB)
		}
		n.recs[k] = rec
	}
	for k, rec := range n.recs {
		if rec.gen == n.gen {
			continue
		}
		if rec.objects.OK {
			routeRm = append(routeRm, rec.objects.Route.Key())
		}
		if rec.objects.Overlay {
			neighRm, fdbRm = append(neighRm, rec.objects.Neigh), append(fdbRm, rec.objects.FDB)
		}
		refusedChanged = refusedChanged || rec.err != nil
		delete(n.recs, k)
	}
	var ch changes
	if refusedChanged {
		for _, rec := range n.recs {
			if rec.err != nil {
				ch.refused = append(ch.refused, rec.name+": "+rec.err.Error())
			}
		}
		slices.Sort(ch.refused)
		ch.refusedOK = true
	}
	var err error
	if ch.fdb, err = n.fdb.PrepareUpdate(fdbUp, fdbRm); err != nil {
		return ch, err
	}
	if ch.neigh, err = n.neighs.PrepareUpdate(neighUp, neighRm); err != nil {
		return ch, err
	}
	if ch.routes, err = n.routes.PrepareUpdate(routeUp, routeRm); err != nil {
		return ch, err
	}
	return ch, nil
}

// apply carries out the plans in the safe order: neighbours and FDB
// entries first, so a new route is usable the moment it appears; then
// routes; stale neighbours and FDB entries last, after their routes.
func (n *Network) apply(ch changes, peers int) error {
	var errs []error
	var st backend.SyncStats
	for _, step := range []func() (backend.SyncStats, error){
		ch.fdb.Upserts, ch.neigh.Upserts, ch.routes.Upserts, ch.routes.Deletes, ch.neigh.Deletes, ch.fdb.Deletes,
	} {
		s, err := step()
		st.Added, st.Replaced, st.Deleted, st.Repaired = st.Added+s.Added, st.Replaced+s.Replaced, st.Deleted+s.Deleted, st.Repaired+s.Repaired
		if err != nil {
			errs = append(errs, err)
		}
	}
	n.metrics.AddDriftRepairs(st.Repaired)
	n.b.log.Debug("reconciled", "peers", peers, "added", st.Added, "replaced", st.Replaced, "deleted", st.Deleted, "repaired", st.Repaired)
	return errors.Join(errs...)
}

// prune forgets parsed data no peer used this time.
func (n *Network) prune() {
	if len(n.parsed) <= 2*len(n.recs)+16 {
		return
	}
	for k, e := range n.parsed {
		if e.gen != n.gen {
			delete(n.parsed, k)
		}
	}
}

func (n *Network) invalidate() {
	n.routes.Invalidate()
	n.neighs.Invalidate()
	n.fdb.Invalidate()
	n.recs = nil
}

// reportRefused logs the refused peers once per change of the set.
func (n *Network) reportRefused(refused []string) {
	if slices.Equal(refused, n.refused) {
		return
	}
	n.refused = refused
	if len(refused) > 0 {
		shown := refused[:min(5, len(refused))]
		n.b.log.Warn("refusing peers with unusable vxlan backend data (wrong VNI or VTEP MAC)", "count", len(refused), "peers", strings.Join(shown, ", "))
	}
}

// screen drops the peers whose VTEP MAC is not theirs alone, and takes a
// new MAC when a peer that keeps it publishes this node's. It reports
// whether this node's MAC changed.
func (n *Network) screen(peers []subnet.Lease) ([]subnet.Lease, bool) {
	cfg, ext := n.b.cfg, n.b.opts.ExtIface
	own := n.b.dev.HardwareAddr
	peers, sc := screenMACs(n.local, own, peers, func(p subnet.Lease) bool { return isDirect(cfg, ext, p) }, n.macOf)
	if !slices.Equal(sc.refused, n.macRefused) && len(sc.refused) > 0 {
		shown := sc.refused[:min(5, len(sc.refused))]
		n.b.log.Warn("refusing peers whose VTEP MAC is not theirs alone", "count", len(sc.refused), "peers", strings.Join(shown, "; "))
	}
	n.macRefused = sc.refused
	if sc.takeNew == "" {
		return peers, false
	}
	inUse := map[string]bool{}
	for _, e := range n.parsed {
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
	n.invalidate()
}
