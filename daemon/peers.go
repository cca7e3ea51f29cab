package daemon

import (
	"log/slog"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

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
	// dirty holds the keys changed since the last take.
	dirty map[string]struct{} // guarded by mu
	full  bool                // guarded by mu; a full set arrived since the last take
	have  bool                // guarded by mu; the first full set arrived

	// Owned by the reconcile loop.
	programmed map[string]*subnet.Entry // key -> the record last handed to the backend as a peer
	refused    map[string]refusal       // key -> why it is not a peer
	// claims are the public IPs of the programmed peers, by record key
	// (subnet.PublicIPClaims: one lease per public IP). A record claiming
	// one held by another is refused, the first holder keeps it, and a
	// peer that was programmed stays as it was meanwhile.
	claims *subnet.PublicIPClaims
	// conflicts counts records refused for claiming another's public IP.
	conflicts atomic.Uint64 // read by the metrics
	buf       []subnet.Lease
	// quiet bounds the refusals logged one by one (see report).
	quiet refusalBudget
}

// refusalBudget lets report log maxRefusalsLogged refusals one by one per
// refusalWindow, and counts the rest in one line at most every
// refusalSummaryEvery. Owned by the reconcile loop.
type refusalBudget struct {
	window      time.Time // when the current window began
	logged      int       // refusals logged one by one in it
	suppressed  int       // refusals not logged since the last summary
	lastSummary time.Time
}

// refusal is a record that is not a peer: name is how logs call it (the
// lease, or the record's key when it is not even a lease).
type refusal struct {
	name, why string
	conflict  bool // it claims a public IP another lease holds
}

func newPeerSet(log *slog.Logger) *peerSet {
	return &peerSet{log: log, entries: map[string]*subnet.Entry{}, dirty: map[string]struct{}{},
		programmed: map[string]*subnet.Entry{}, refused: map[string]refusal{}, claims: subnet.NewPublicIPClaims(subnet.Lease{}, 0)}
}

// apply folds a Change in; it never blocks on the loop.
func (s *peerSet) apply(c subnet.Change) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c.Full {
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

// touch marks a key changed since the last take. s.mu is held.
func (s *peerSet) touch(k string) { s.dirty[k] = struct{}{} }

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
		return false, refusal{name: e.Key, why: e.Err.Error()}, false
	case l.Subnet == local.Subnet && l.IPv6Subnet == local.IPv6Subnet:
		return false, refusal{}, true
	}
	if err := subnet.CheckProgrammable(cfg, local, l); err != nil {
		return false, refusal{name: l.String(), why: err.Error()}, false
	}
	return true, refusal{}, false
}

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
	// Each public IP goes to one lease. When two claim one, the peer that
	// held it before keeps it, or else the first in subnet.ClaimOrder (as
	// twillctl status names it): the entries are then assigned again in
	// that order, so who holds an address does not depend on the map's.
	a := s.assign(cfg, local, entries)
	if a.contested {
		slices.SortFunc(entries, func(x, y *subnet.Entry) int {
			if px, py := s.holds(x), s.holds(y); px != py {
				if px {
					return -1
				}
				return 1
			}
			if c := subnet.ClaimOrder(x.Lease, y.Lease); c != 0 {
				return c
			}
			return strings.Compare(x.Key, y.Key)
		})
		a = s.assign(cfg, local, entries)
	}
	s.report(a.refused, a.programmed)
	s.buf, s.programmed, s.refused, s.claims = a.peers, a.programmed, a.refused, a.claims
	return a.peers
}

// assignment is a full set of records split into peers and refusals.
type assignment struct {
	peers      []subnet.Lease
	programmed map[string]*subnet.Entry
	claims     *subnet.PublicIPClaims
	refused    map[string]refusal
	contested  bool // some record claimed an address another held
}

// assign splits entries, in their order, into peers and refusals; the
// first to claim a public IP holds it.
func (s *peerSet) assign(cfg *subnet.Config, local subnet.Lease, entries []*subnet.Entry) assignment {
	a := assignment{peers: slices.Grow(s.buf[:0], len(entries)), programmed: make(map[string]*subnet.Entry, len(entries)),
		claims: subnet.NewPublicIPClaims(local, len(entries)), refused: map[string]refusal{}}
	for _, e := range entries {
		peer, r, self := classify(cfg, local, *e)
		if peer {
			if err := a.claims.Conflict(e.Key, e.Lease); err != nil {
				peer, r, a.contested = false, conflict(e, err), true
				// A peer programmed before keeps its last record, if that
				// claims nobody else's address.
				if was := s.programmed[e.Key]; was != nil && was != e && a.claims.Conflict(e.Key, was.Lease) == nil {
					a.peers = append(a.peers, was.Lease)
					a.programmed[e.Key] = was
					a.claims.Hold(e.Key, &was.Lease)
				}
			}
		}
		switch {
		case peer:
			a.peers = append(a.peers, e.Lease)
			a.programmed[e.Key] = e
			a.claims.Hold(e.Key, &e.Lease)
		case !self:
			a.refused[e.Key] = r
		}
	}
	return a
}

// holds reports whether e is the record programmed for its key.
func (s *peerSet) holds(e *subnet.Entry) bool { return s.programmed[e.Key] == e }

// conflict is the refusal of a record claiming another's public IP.
func conflict(e *subnet.Entry, err error) refusal {
	return refusal{e.Lease.String(), err.Error(), true}
}

// delta is what changed since the last take: peers added or changed
// (upserted) and peers gone or no longer valid (removed, as they were
// handed to the backend).
func (s *peerSet) delta(cfg *subnet.Config, local subnet.Lease) (upserted, removed []subnet.Lease) {
	type change struct {
		key string
		now *subnet.Entry // nil: gone
	}
	s.mu.Lock()
	changes := make([]change, 0, len(s.dirty))
	for k := range s.dirty {
		changes = append(changes, change{k, s.entries[k]})
	}
	clear(s.dirty)
	s.mu.Unlock()
	// Departures first: an address a leaving peer held is free for a
	// newcomer of the same batch.
	slices.SortFunc(changes, func(a, b change) int {
		if (a.now == nil) != (b.now == nil) {
			if a.now == nil {
				return -1
			}
			return 1
		}
		return strings.Compare(a.key, b.key)
	})
	refused := map[string]refusal{}
	for k, r := range s.refused {
		refused[k] = r
	}
	for _, c := range changes {
		was := s.programmed[c.key]
		delete(refused, c.key)
		peer, r, self := false, refusal{}, false
		if c.now != nil {
			peer, r, self = classify(cfg, local, *c.now)
		}
		if peer {
			if err := s.claims.Conflict(c.key, c.now.Lease); err != nil {
				// The peer as programmed stays; the claim is refused.
				refused[c.key] = conflict(c.now, err)
				continue
			}
		}
		switch {
		case peer:
			if was == nil || !was.Lease.Same(c.now.Lease) {
				upserted = append(upserted, c.now.Lease)
			}
			if was != nil {
				s.claims.Release(c.key, was.Lease)
			}
			s.programmed[c.key] = c.now
			s.claims.Hold(c.key, &c.now.Lease)
		default:
			if was != nil {
				removed = append(removed, was.Lease)
				delete(s.programmed, c.key)
				s.claims.Release(c.key, was.Lease)
			}
			if c.now != nil && !self {
				refused[c.key] = r
			}
		}
	}
	upserted = s.freed(refused, upserted)
	s.report(refused, s.programmed)
	s.refused = refused
	return upserted, removed
}

// conflicts is how many times a record was refused for claiming a
// public IP another lease held.
func (s *peerSet) conflictCount() uint64 { return s.conflicts.Load() }

// freed programs the records refused for claiming an address another
// lease held once that address is free (its holder gone or moved), rather
// than at the next full reconcile, and returns upserted with them.
func (s *peerSet) freed(refused map[string]refusal, upserted []subnet.Lease) []subnet.Lease {
	for k, r := range refused {
		if !r.conflict {
			continue
		}
		s.mu.Lock()
		e := s.entries[k]
		s.mu.Unlock()
		if e == nil || s.claims.Conflict(k, e.Lease) != nil {
			continue
		}
		delete(refused, k)
		if was := s.programmed[k]; was != nil {
			s.claims.Release(k, was.Lease)
			if was.Lease.Same(e.Lease) {
				s.programmed[k] = e
				s.claims.Hold(k, &e.Lease)
				continue
			}
		}
		upserted = append(upserted, e.Lease)
		s.programmed[k] = e
		s.claims.Hold(k, &e.Lease)
	}
	return upserted
}

// count is the number of peers handed to the backend, and of records
// refused.
func (s *peerSet) count() (peers, refused int) { return len(s.programmed), len(s.refused) }

// maxRefusalsLogged is how many leases newly refused are logged one by
// one in a refusalWindow; the rest are counted, in a line at most every
// refusalSummaryEvery. A client with a node's credentials can write any
// number of records, at any rate.
const (
	maxRefusalsLogged   = 20
	refusalWindow       = time.Minute
	refusalSummaryEvery = 10 * time.Second
)

// report logs records newly refused (one line each, up to
// maxRefusalsLogged a minute: a refusal is an anomaly the operator must
// see, and it is not repeated at every resync) and refused ones that
// became peers.
func (s *peerSet) report(refused map[string]refusal, peers map[string]*subnet.Entry) {
	var fresh []string
	for k, r := range refused {
		if s.refused[k] != r {
			fresh = append(fresh, k)
		}
	}
	sort.Strings(fresh)
	now := time.Now()
	q := &s.quiet
	if now.Sub(q.window) >= refusalWindow {
		q.window, q.logged = now, 0
	}
	for _, k := range fresh {
		if refused[k].conflict {
			s.conflicts.Add(1)
		}
		if q.logged < maxRefusalsLogged {
			q.logged++
			s.log.Warn("refusing lease; no route will be programmed from it", "lease", refused[k].name, "reason", refused[k].why)
			continue
		}
		q.suppressed++
	}
	if q.suppressed > 0 && now.Sub(q.lastSummary) >= refusalSummaryEvery {
		s.log.Warn("refusing more leases, not logged one by one; twillctl status lists every refusal", "more", q.suppressed, "refused", len(refused))
		q.suppressed, q.lastSummary = 0, now
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
