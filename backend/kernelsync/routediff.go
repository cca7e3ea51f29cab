package kernelsync

import (
	"bytes"
	"sort"

	"github.com/twill-net/twill/nl"
)

// RoutePlan is what must change for the kernel's owned routes to match the
// desired ones. It is a pure function of its inputs (see DiffRoutes).
type RoutePlan struct {
	Add     []nl.Route // no route with this key exists
	Replace []nl.Route // an owned route with this key exists but differs
	Delete  []nl.Route // owned routes no desired route backs
}

// Empty reports whether nothing needs to change.
func (p RoutePlan) Empty() bool { return len(p.Add)+len(p.Replace)+len(p.Delete) == 0 }

// DiffRoutes compares desired routes with the owned routes the kernel holds.
// Output slices are sorted by destination so plans are deterministic.
func DiffRoutes(desired, actual map[nl.Key]nl.Route) RoutePlan {
	return diffRoutes(desired, func(r nl.Route) nl.Route { return r }, actual)
}

// diffRoutes is DiffRoutes over any map of desired entries.
func diffRoutes[V any](desired map[nl.Key]V, route func(V) nl.Route, actual map[nl.Key]nl.Route) RoutePlan {
	var p RoutePlan
	present := 0 // desired keys the kernel has
	for k, v := range desired {
		want := route(v)
		have, ok := actual[k]
		switch {
		case !ok:
			p.Add = append(p.Add, want)
		case !have.Equal(want):
			present++
			p.Replace = append(p.Replace, want)
		default:
			present++
		}
	}
	// When every kernel route has a desired key, nothing is stale: skip
	// the scan (the common case on a lease event).
	if present < len(actual) {
		for k, have := range actual {
			if _, ok := desired[k]; !ok {
				p.Delete = append(p.Delete, have)
			}
		}
	}
	for _, s := range [][]nl.Route{p.Add, p.Replace, p.Delete} {
		sort.Slice(s, func(i, j int) bool { return lessKey(s[i].Key(), s[j].Key()) })
	}
	return p
}

func lessKey(a, b nl.Key) bool {
	if a.Table != b.Table {
		return a.Table < b.Table
	}
	if c := bytes.Compare(a.Addr[:], b.Addr[:]); c != 0 {
		return c < 0
	}
	return a.Bits < b.Bits
}

// RouteMap indexes routes by key.
func RouteMap(rs []nl.Route) map[nl.Key]nl.Route {
	m := make(map[nl.Key]nl.Route, len(rs))
	for _, r := range rs {
		m[r.Key()] = r
	}
	return m
}
