package daemon

import (
	"log/slog"
	"slices"
	"sort"
	"sync"

	"github.com/twill-net/twill/subnet"
)

// peerSet folds the subnet manager's Changes into the records it holds,
// and gives the reconcile loop either the whole peer set (start, resync,
// repair) or what changed since the last time: a lease event costs what
// changed, not the size of the cluster.
type peerSet struct {
	log *slog.Logger

	mu sync.Mutex
	// entries is every record by key (guarded by mu). Records are shared
	// with the Change that brought them, never copied: at start-up a full
	// set is tens of thousands of them.
	entries map[string]*subnet.Entry
	// dirty holds the keys changed since the last take, each with the
	// record it had then (absent: none).
	dirty map[string]prior // guarded by mu
	full  bool             // guarded by mu; a full set arrived since the last take
	have  bool             // guarded by mu; the first full set arrived

	// Owned by the reconcile loop.
	programmed map[string]struct{} // keys of the records last handed to the backend as peers
	refused    map[string]refusal  // key -> why it is not a peer
	buf        []subnet.Lease
}

// prior is a record as it was at the last take (nil: none).
type prior struct{ entry *subnet.Entry }

// refusal is a record that is not a peer: name is how logs call it (the
// lease, or the record's key when it is not even a lease).
type refusal struct{ name, why string }

func newPeerSet(log *slog.Logger) *peerSet {
	return &peerSet{log: log, entries: map[string]*subnet.Entry{}, dirty: map[string]prior{},
		programmed: map[string]struct{}{}, refused: map[string]refusal{}}
}

// apply folds a Change in; it never blocks on the loop.
func (s *peerSet) apply(c subnet.Change) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c.Full {
		// The next take is all(), which needs no priors.
		s.entries = make(map[string]*subnet.Entry, len(c.Set))
		clear(s.dirty)
		s.full, s.have = true, true
		for i := range c.Set {
			s.entries[c.Set[i].Key] = &c.Set[i]
		}
	} else {
		for i := range c.Set {
			s.touch(c.Set[i].Key)
			s.entries[c.Set[i].Key] = &c.Set[i]
		}
	}
	for _, k := range c.Deleted {
		s.touch(k)
		delete(s.entries, k)
	}
}

// touch records a key's record before its first change since the last
// take. s.mu is held.
func (s *peerSet) touch(k string) {
	if _, ok := s.dirty[k]; !ok {
		s.dirty[k] = prior{s.entries[k]}
	}
}

// ready reports whether the first full set arrived (reconciling before it
// would delete every route), and fullDue whether a full set arrived since
// the last take.
func (s *peerSet) ready() (ready, fullDue bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.have, s.full
}

// classify says whether a record is a peer the backend may program, or
// why not.
func classify(cfg *subnet.Config, local subnet.Lease, e subnet.Entry) (peer bool, r refusal, self bool) {
	l := e.Lease
	switch {
	case e.Err != nil:
		return false, refusal{e.Key, e.Err.Error()}, false
	case l.Subnet == local.Subnet && l.IPv6Subnet == local.IPv6Subnet:
		return false, refusal{}, true
	}
	if err := subnet.CheckPeer(cfg, local, l); err != nil {
		return false, refusal{l.String(), err.Error()}, false
	}
	if l.Attrs.BackendType != cfg.BackendType {
		return false, refusal{l.String(), "backend type " + quote(l.Attrs.BackendType) + ", but this cluster runs " + quote(cfg.BackendType)}, false
	}
	return true, refusal{}, false
}

func quote(s string) string { return `"` + s + `"` }

// all is every peer, for a full reconcile; what it returns becomes what
// was handed to the backend.
func (s *peerSet) all(cfg *subnet.Config, local subnet.Lease) []subnet.Lease {
	s.mu.Lock()
	clear(s.dirty)
	s.full = false
	entries := make([]*subnet.Entry, 0, len(s.entries))
	for _, e := range s.entries {
		entries = append(entries, e)
	}
	s.mu.Unlock()
	peers := slices.Grow(s.buf[:0], len(entries))
	programmed := make(map[string]struct{}, len(entries))
	refused := map[string]refusal{}
	for _, e := range entries {
		peer, r, self := classify(cfg, local, *e)
		switch {
		case peer:
			peers = append(peers, e.Lease)
			programmed[e.Key] = struct{}{}
		case !self:
			refused[e.Key] = r
		}
	}
	s.report(refused, programmed)
	s.buf, s.programmed, s.refused = peers, programmed, refused
	return peers
}

// delta is what changed since the last take: peers added or changed
// (upserted) and peers gone or no longer valid (removed, as they were
// handed to the backend).
func (s *peerSet) delta(cfg *subnet.Config, local subnet.Lease) (upserted, removed []subnet.Lease) {
	type change struct {
		key string
		was prior
		now *subnet.Entry // nil: gone
	}
	s.mu.Lock()
	changes := make([]change, 0, len(s.dirty))
	for k, p := range s.dirty {
		changes = append(changes, change{k, p, s.entries[k]})
	}
	clear(s.dirty)
	s.mu.Unlock()
	refused := map[string]refusal{}
	for k, r := range s.refused {
		refused[k] = r
	}
	for _, c := range changes {
		_, had := s.programmed[c.key]
		delete(refused, c.key)
		peer, r, self := false, refusal{}, false
		if c.now != nil {
			peer, r, self = classify(cfg, local, *c.now)
		}
		switch {
		case peer:
			if !had || c.was.entry == nil || !c.was.entry.Lease.Same(c.now.Lease) {
				upserted = append(upserted, c.now.Lease)
			}
			s.programmed[c.key] = struct{}{}
		default:
			if had {
				removed = append(removed, c.was.entry.Lease)
				delete(s.programmed, c.key)
			}
			if c.now != nil && !self {
				refused[c.key] = r
			}
		}
	}
	s.report(refused, s.programmed)
	s.refused = refused
	return upserted, removed
}

// count is the number of peers handed to the backend, and of records
// refused.
func (s *peerSet) count() (peers, refused int) { return len(s.programmed), len(s.refused) }

// report logs records newly refused (one line each: a refusal is an
// anomaly the operator must see, and it is not repeated at every resync)
// and refused ones that became peers.
func (s *peerSet) report(refused map[string]refusal, peers map[string]struct{}) {
	var fresh []string
	for k, r := range refused {
		if s.refused[k] != r {
			fresh = append(fresh, k)
		}
	}
	sort.Strings(fresh)
	for _, k := range fresh {
		s.log.Warn("refusing lease; no route will be programmed from it", "lease", refused[k].name, "reason", refused[k].why)
	}
	for k, r := range s.refused {
		if _, still := refused[k]; still {
			continue
		}
		// Only a record that is now a peer was mended; one that went away
		// was not.
		if _, ok := peers[k]; ok {
			s.log.Info("lease no longer refused", "lease", r.name)
		}
	}
}
