package kube

import (
	corev1 "k8s.io/api/core/v1"

	"github.com/twill-net/twill/subnet"
)

// nodeSet follows the peers' entries between full computations, so that a
// change to one Node is published as a change to one entry: its lease is
// parsed, and only its pod subnets are compared with the others'. Overlaps
// tie nodes together (the older keeps its routes), so a change that
// touches one is published as the full set, computed again.
type nodeSet struct {
	ann  Annotations
	self string
	// leases holds every other node's usable lease by name (overlap losers
	// included); overlapping, the nodes in an overlapping group.
	leases      map[string]subnet.Lease
	overlapping map[string]bool
}

func newNodeSet(ann Annotations, self string) *nodeSet {
	return &nodeSet{ann: ann, self: self, leases: map[string]subnet.Lease{}, overlapping: map[string]bool{}}
}

// full computes every entry again from all the nodes.
func (s *nodeSet) full(nodes []*corev1.Node) subnet.Change {
	entries, overlapping := s.ann.Entries(nodes, s.self)
	s.overlapping = overlapping
	clear(s.leases)
	for _, e := range entries {
		if e.Lease.Subnet.IsValid() || e.Lease.IPv6Subnet.IsValid() {
			s.leases[e.Key[len("node/"):]] = e.Lease
		}
	}
	return subnet.Change{Full: true, Set: entries}
}

// update is the Change for the named nodes: get returns a node's current
// object (false when it is gone), all every node, for a full computation.
func (s *nodeSet) update(names []string, get func(string) (*corev1.Node, bool), all func() []*corev1.Node) subnet.Change {
	var c subnet.Change
	for _, name := range names {
		if name == s.self {
			continue
		}
		if s.overlapping[name] {
			return s.full(all())
		}
		n, ok := get(name)
		if !ok {
			delete(s.leases, name)
			c.Deleted = append(c.Deleted, EntryKey(name))
			continue
		}
		l, peer, err := s.ann.NodeLease(n)
		switch {
		case err != nil:
			delete(s.leases, name)
			c.Set = append(c.Set, subnet.Entry{Key: EntryKey(name), Err: err})
		case !peer:
			delete(s.leases, name)
			c.Deleted = append(c.Deleted, EntryKey(name))
		case s.overlapsAny(name, l):
			return s.full(all())
		default:
			s.leases[name] = l
			c.Set = append(c.Set, subnet.Entry{Key: EntryKey(name), Lease: l})
		}
	}
	return c
}

// overlapsAny reports whether l overlaps the lease of a node other than
// name.
func (s *nodeSet) overlapsAny(name string, l subnet.Lease) bool {
	for other, o := range s.leases {
		if other == name {
			continue
		}
		if (l.Subnet.IsValid() && o.Subnet.IsValid() && l.Subnet.Overlaps(o.Subnet)) ||
			(l.IPv6Subnet.IsValid() && o.IPv6Subnet.IsValid() && l.IPv6Subnet.Overlaps(o.IPv6Subnet)) {
			return true
		}
	}
	return false
}
