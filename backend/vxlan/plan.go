package vxlan

import (
	"slices"

	"github.com/twill-net/twill/backend"
	"github.com/twill-net/twill/backend/nl"
	"github.com/twill-net/twill/subnet"
)

// changes are the three sets' planned changes.
type changes struct {
	routes    *backend.RouteChange
	neigh     *backend.NeighChange
	fdb       *backend.NeighChange
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
