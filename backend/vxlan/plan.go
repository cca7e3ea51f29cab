package vxlan

import (
	"net/netip"
	"slices"

	"github.com/twill-net/twill/backend/kernelsync"
	"github.com/twill-net/twill/nl"
	"github.com/twill-net/twill/subnet"
)

// changes are the three sets' planned changes.
type changes struct {
	routes    *kernelsync.RouteChange
	neigh     *kernelsync.NeighChange
	fdb       *kernelsync.NeighChange
	refused   []string
	refusedOK bool // refused is the whole current list
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
	out := Emitters{
		Route: func(r nl.Route) { routes = append(routes, r) },
		Neigh: func(e nl.Neigh) { neighs = append(neighs, e) },
		FDB:   func(e nl.Neigh) { fdbs = append(fdbs, e) },
	}
	l := n.view(dev)
	for _, p := range peers {
		if !n.programs(p) {
			continue
		}
		rec := n.compute(l, p)
		recs[recKey(p)] = rec
		if rec.err != nil {
			refused = append(refused, rec.name+": "+rec.err.Error())
			continue
		}
		rec.objects.emit(out)
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
	n.macs = make(map[[6]byte]int, len(recs))
	for _, rec := range recs {
		n.countMAC(rec, 1)
	}
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
	var d delta
	l := n.view(dev)
	for _, p := range peers {
		if !n.programs(p) {
			continue
		}
		old := n.recs[recKey(p)]
		if old != nil && old.same(p) {
			old.gen = n.gen
			continue
		}
		n.planPeer(l, p, &d)
	}
	for k, rec := range n.recs {
		if rec.gen != n.gen {
			n.planGone(k, rec, &d)
		}
	}
	return n.prepare(&d)
}

// planDelta plans the objects of the peers Update was handed.
func (n *Network) planDelta(dev int, upserted, removed []subnet.Lease) (changes, error) {
	var d delta
	l := n.view(dev)
	for _, p := range removed {
		if rec := n.recs[recKey(p)]; rec != nil {
			n.planGone(recKey(p), rec, &d)
		}
	}
	for _, p := range upserted {
		if n.programs(p) {
			n.planPeer(l, p, &d)
		} else if rec := n.recs[recKey(p)]; rec != nil {
			n.planGone(recKey(p), rec, &d) // it lost the subnets this node programs
		}
	}
	return n.prepare(&d)
}

// delta gathers the sets' changes for some peers.
type delta struct {
	routeUp          []nl.Route
	routeRm          []netip.Prefix
	neighUp, neighRm []nl.Neigh
	fdbUp, fdbRm     []nl.Neigh
	refusedChanged   bool
}

// planPeer computes a new or changed peer's objects, and plans the
// upserts and what the peer had and no longer has.
func (n *Network) planPeer(l Local, p subnet.Lease, d *delta) {
	k := recKey(p)
	old := n.recs[k]
	rec := n.compute(l, p)
	o := rec.objects
	if old != nil {
		// What the peer had and no longer has goes; what it keeps is
		// replaced by the upserts below.
		was := old.objects
		if was.Overlay && (!o.Overlay || !slices.Equal(was.FDB.HardwareAddr, o.FDB.HardwareAddr)) {
			d.fdbRm = append(d.fdbRm, was.FDB)
		}
		for _, pair := range [][2]nl.Neigh{{was.Neigh, o.Neigh}, {was.v6().Neigh, o.v6().Neigh}} {
			if pair[0].IP.IsValid() && pair[0].IP != pair[1].IP {
				d.neighRm = append(d.neighRm, pair[0])
			}
		}
		for _, pair := range [][2]nl.Route{{was.Route, o.Route}, {was.v6().Route, o.v6().Route}} {
			if pair[0].Dst.IsValid() && pair[0].Dst != pair[1].Dst {
				d.routeRm = append(d.routeRm, pair[0].Dst)
			}
		}
		d.refusedChanged = d.refusedChanged || (old.err != nil) != (rec.err != nil)
		n.countMAC(old, -1)
	} else {
		d.refusedChanged = d.refusedChanged || rec.err != nil
	}
	o.emit(Emitters{
		Route: func(r nl.Route) { d.routeUp = append(d.routeUp, r) },
		Neigh: func(e nl.Neigh) { d.neighUp = append(d.neighUp, e) },
		FDB:   func(e nl.Neigh) { d.fdbUp = append(d.fdbUp, e) },
	})
	n.recs[k] = rec
	n.countMAC(rec, 1)
}

// planGone plans the removal of a peer's objects.
func (n *Network) planGone(k nl.Key, rec *peerRec, d *delta) {
	rec.objects.emit(Emitters{
		Route: func(r nl.Route) { d.routeRm = append(d.routeRm, r.Dst) },
		Neigh: func(e nl.Neigh) { d.neighRm = append(d.neighRm, e) },
		FDB:   func(e nl.Neigh) { d.fdbRm = append(d.fdbRm, e) },
	})
	d.refusedChanged = d.refusedChanged || rec.err != nil
	n.countMAC(rec, -1)
	delete(n.recs, k)
}

// prepare plans the sets' changes, and the refused list when it changed.
func (n *Network) prepare(d *delta) (changes, error) {
	var ch changes
	if d.refusedChanged {
		for _, rec := range n.recs {
			if rec.err != nil {
				ch.refused = append(ch.refused, rec.name+": "+rec.err.Error())
			}
		}
		slices.Sort(ch.refused)
		ch.refusedOK = true
	}
	var err error
	if ch.fdb, err = n.fdb.PrepareUpdate(d.fdbUp, d.fdbRm); err != nil {
		return ch, err
	}
	if ch.neigh, err = n.neighs.PrepareUpdate(d.neighUp, d.neighRm); err != nil {
		return ch, err
	}
	if ch.routes, err = n.routes.PrepareUpdate(d.routeUp, d.routeRm); err != nil {
		return ch, err
	}
	return ch, nil
}
