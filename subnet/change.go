package subnet

// Entry is one record of a subnet manager (an etcd key, a Node): the lease
// it holds, or why it cannot be one.
type Entry struct {
	Key   string
	Lease Lease
	Err   error
}

// Change is what a subnet manager publishes. With Full, Set is every
// record there is (after the first listing, a relisting, a resync);
// otherwise Set holds the records added or changed since the last Change,
// and Deleted the keys of the records gone. A consumer that folds Changes
// into a map by Key has the manager's current set at every step. Once
// published, a Change belongs to its consumer, which may keep pointers
// into Set: the manager never touches it again.
type Change struct {
	Full    bool
	Set     []Entry
	Deleted []string
}

// Snapshot is the set the entries make: the leases, and the records
// refused with their reasons.
func SnapshotOf(entries []Entry) Snapshot {
	s := Snapshot{Leases: make([]Lease, 0, len(entries))}
	for _, e := range entries {
		if e.Err != nil {
			s.Refused = append(s.Refused, Refusal{Key: e.Key, Err: e.Err})
			continue
		}
		s.Leases = append(s.Leases, e.Lease)
	}
	return s
}

// Fold applies c to entries, a set of records by key.
func Fold(entries map[string]Entry, c Change) {
	if c.Full {
		clear(entries)
	}
	for _, e := range c.Set {
		entries[e.Key] = e
	}
	for _, k := range c.Deleted {
		delete(entries, k)
	}
}

// Entries lists a set's records.
func Entries(entries map[string]Entry) []Entry {
	out := make([]Entry, 0, len(entries))
	for _, e := range entries {
		out = append(out, e)
	}
	return out
}
