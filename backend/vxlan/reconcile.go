package vxlan

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"sync/atomic"

	"github.com/twill-net/twill/backend"
	"github.com/twill-net/twill/backend/kernelsync"
	"github.com/twill-net/twill/nl"
	"github.com/twill-net/twill/subnet"
)

// Network programs one node's overlay.
type Network struct {
	b       *Backend
	local   subnet.Lease
	vtepIPs []netip.Prefix
	routes  *kernelsync.RouteSync
	neighs  *kernelsync.NeighSync
	fdb     *kernelsync.NeighSync
	metrics *backend.Metrics

	// The rest is used only by Reconcile (and BackendData, ExternalChanged,
	// called from the same goroutine), which the daemon never runs
	// concurrently.
	devIdx     int                      // the device index the records are for
	devSeen    atomic.Int64             // devIdx, for the link watch to read
	parsed     map[string]parsed        // BackendData by raw JSON: parsed once
	gen        uint64                   // this reconcile's stamp
	recs       map[nl.Key]*peerRec      // by peer subnet; nil forces a full reconcile
	refused    *kernelsync.RefusedPeers // peers with unusable backend data
	macRefused *kernelsync.RefusedPeers // peers whose VTEP MAC is shared
	pending    json.RawMessage          // BackendData to publish (a new VTEP MAC)
	pending6   json.RawMessage          // BackendV6Data to publish with it
	hasPending bool
	macSeen    map[[6]byte]struct{} // screen's scratch space
	macs       map[[6]byte]int      // how many programmed peers have each VTEP MAC
	macShared  bool                 // some peer is refused for a MAC it shares
}

// vxlan's Network applies changes (Update) and follows the external
// interface (ExternalChanged); the other optional interfaces are asserted
// next to their methods.
var _ interface {
	backend.Updater
	backend.ExternalChanger
} = (*Network)(nil)

// Reconcile makes the device, neighbours, FDB and routes match peers.
func (n *Network) Reconcile(ctx context.Context, peers []subnet.Lease) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	n.gen++
	peers, newMAC := n.screen(peers)
	link, created, err := ensureDevice(n.b.k, n.b.dev, n.vtepIPs)
	if err != nil {
		return fmt.Errorf("vxlan: %w", err)
	}
	if err := n.keepTXChecksum(created); err != nil {
		return fmt.Errorf("vxlan: %w", err)
	}
	if created || n.devIdx != link.Index {
		if created && !newMAC {
			n.b.log.Warn("VTEP device was missing or altered; re-created it and replaying every peer", "device", n.b.dev.Name)
			n.metrics.AddDriftRepairs(1)
		}
		n.devIdx = link.Index
		n.devSeen.Store(int64(link.Index))
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
		n.refused.Report(ch.refused)
	}
	if err := n.apply(ch, len(peers)); err != nil {
		n.recs = nil // start from the whole state next time
		return fmt.Errorf("vxlan: %w", err)
	}
	return nil
}

// Update programs what changed since the last Reconcile or Update: the
// objects of the upserted and removed peers only. What spans peers is left
// to a full Reconcile (ErrFullReconcile): a VTEP MAC another peer or this
// node has, any change while a peer is refused for its MAC, and a device
// the records no longer describe.
func (n *Network) Update(ctx context.Context, upserted, removed []subnet.Lease) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if n.recs == nil || n.macShared || n.macClash(upserted) {
		return backend.ErrFullReconcile
	}
	n.gen++
	ch, err := n.planDelta(n.devIdx, upserted, removed)
	if err != nil {
		n.recs = nil
		return fmt.Errorf("vxlan: %w", err)
	}
	if ch.refusedOK {
		n.refused.Report(ch.refused)
	}
	if err := n.apply(ch, len(upserted)+len(removed)); err != nil {
		n.recs = nil
		return fmt.Errorf("vxlan: %w", err)
	}
	return nil
}

// apply carries out the plans in the safe order: neighbours and FDB
// entries first, so a new route is usable the moment it appears; then
// routes; stale neighbours and FDB entries last, after their routes.
func (n *Network) apply(ch changes, peers int) error {
	var errs []error
	var st kernelsync.SyncStats
	for _, step := range []func() (kernelsync.SyncStats, error){
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

// ExternalChanged takes the external interface as it is now. A VTEP bound
// to a deleted link went with it; one bound to an old index is re-created
// on the new one, and every peer replayed. The underlay family stays the
// one chosen at start: peers reach this node at the public address it
// published then, and the MTU pods were given counts that family's
// overhead. An interface that lost its address of that family leaves the
// VTEP bound to the old one until the address is back or twilld restarts.
func (n *Network) ExternalChanged(ext backend.ExternalInterface) {
	b := n.b
	b.opts.ExtIface = ext
	b.dev.VtepDevIndex = ext.Link.Index
	a := ext.Addr
	if b.dev.SrcAddr.Is6() {
		a = ext.AddrV6
	}
	if a.IsValid() {
		b.dev.SrcAddr = a
	} else {
		b.log.Warn("the external interface has lost the address the overlay runs over; the VTEP keeps the old one until it is back or twilld restarts",
			"interface", ext.Link.Name, "address", b.dev.SrcAddr)
	}
	n.invalidate()
}
