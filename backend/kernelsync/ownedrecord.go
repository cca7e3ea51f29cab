package kernelsync

// The record: what an ownedSet believes the kernel holds, kept in step with
// its own changes (record) and with the kernel's events (observe,
// observeGone), and checked against a fresh read when a watch subscribes
// again (verify).

// record records vs as present or gone, under the lock, before the kernel
// call, so that the event the kernel sends about our own change agrees
// with the record. A failure invalidates the record (see run).
func (s *ownedSet[K, V]) record(vs []V, present bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.known == nil {
		return
	}
	for _, v := range vs {
		k := s.kind.key(v)
		if s.touched != nil {
			s.touched[k] = struct{}{}
		}
		if present {
			s.known[k] = v
		} else if have, ok := s.known[k]; ok && s.kind.same(have, v) {
			delete(s.known, k)
		}
	}
}

// observe checks a kernel event about one object against the record and
// reports whether it contradicts it; the record is then dropped and the
// next sync reads the kernel.
func (s *ownedSet[K, V]) observe(v V, deleted bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.known == nil {
		return true
	}
	have, ok := s.known[s.kind.key(v)]
	contradicts := ok == deleted || (!deleted && !s.kind.same(have, v))
	if contradicts {
		s.known = nil
	}
	return contradicts
}

// observeGone checks an event saying v is gone against the record: it
// contradicts it only when the record holds v itself. (An object the
// record has replaced under the same key by another, as an FDB entry
// whose remote changed is, going agrees with it.)
func (s *ownedSet[K, V]) observeGone(v V) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.known == nil {
		return true
	}
	have, ok := s.known[s.kind.key(v)]
	if ok && s.kind.same(have, v) {
		s.known = nil
		return true
	}
	return false
}

// verify reads the kernel, off the goroutine that syncs, and reports
// whether it differs from the record (which is then dropped) or there is
// no record to trust. Objects a sync changes while the kernel is read are
// left out of the comparison: the record has them as written, and any
// later change to them comes as an event.
func (s *ownedSet[K, V]) verify() bool {
	s.mu.Lock()
	s.touched = map[K]struct{}{}
	s.mu.Unlock()
	vs, err := s.kind.list()
	defer func() {
		s.mu.Lock()
		s.touched = nil
		s.mu.Unlock()
	}()
	if err != nil {
		s.Invalidate()
		return true
	}
	// Compared a chunk at a time, so that a sync waits for the lock no
	// longer than one chunk takes (tens of thousands of objects take
	// milliseconds).
	for range verifyRestarts {
		differs, replaced := s.compareRecord(vs)
		if !replaced {
			if differs {
				s.Invalidate()
			}
			return differs
		}
		// A sync read the kernel meanwhile and replaced the record: compare
		// with the new one.
	}
	s.Invalidate()
	return true
}

// compareRecord compares vs, read from the kernel, with the record, leaving
// out the keys touched since the read began. replaced reports that the
// record was replaced (by a sync's dump) while it compared.
func (s *ownedSet[K, V]) compareRecord(vs []V) (differs, replaced bool) {
	s.mu.Lock()
	epoch := s.epoch
	s.mu.Unlock()
	matched := 0 // objects read that the record has, untouched
	// A dump the kernel resumes by position sends an object twice when
	// objects are added while it runs (the vxlan FDB does, by the
	// thousand): count each key once.
	seen := make(map[K]struct{}, len(vs))
	for i := 0; i < len(vs); i += verifyChunk {
		s.mu.Lock()
		if s.known == nil {
			s.mu.Unlock()
			return true, false
		}
		if s.epoch != epoch {
			s.mu.Unlock()
			return false, true
		}
		for _, v := range vs[i:min(i+verifyChunk, len(vs))] {
			k := s.kind.key(v)
			if _, ok := s.touched[k]; ok {
				continue
			}
			if _, dup := seen[k]; dup {
				continue
			}
			seen[k] = struct{}{}
			if have, ok := s.known[k]; !ok || !s.kind.same(have, v) {
				s.mu.Unlock()
				return true, false
			}
			matched++
		}
		s.mu.Unlock()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.known == nil {
		return true, false
	}
	if s.epoch != epoch {
		return false, true
	}
	// Every object read is in the record; the record holds more (an
	// object the kernel lost) unless its untouched keys number as many.
	untouched := len(s.known)
	for k := range s.touched {
		if _, ok := s.known[k]; ok {
			untouched--
		}
	}
	return matched != untouched, false
}

// Invalidate forces the next sync to read the kernel.
func (s *ownedSet[K, V]) Invalidate() {
	s.mu.Lock()
	s.known = nil
	s.mu.Unlock()
}
