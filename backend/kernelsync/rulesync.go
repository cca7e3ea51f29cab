package kernelsync

import (
	"net/netip"
	"sync"
	"time"

	"github.com/twill-net/twill/nl"
)

// RuleSync keeps the policy rules twill's daemon owns (those with twill's
// protocol) equal to a desired set: the rule face of the one sync engine
// (see ownedSet). The kernel cannot replace a rule; a changed rule is a
// deleted one and a new one.
type RuleSync struct {
	NL            nl.RuleTable
	FullSyncEvery time.Duration

	once sync.Once
	set  ownedSet[ruleKey, nl.Rule]
}

type ruleKey struct {
	priority, table int
	src, dst        netip.Prefix
}

func (s *RuleSync) engine() *ownedSet[ruleKey, nl.Rule] {
	s.once.Do(func() {
		s.set.kind = ruleKind{nl: s.NL}
		s.set.fullSyncEvery = s.FullSyncEvery
	})
	return &s.set
}

// Sync makes the owned rules match the whole desired set.
func (s *RuleSync) Sync(desired func(emit func(nl.Rule))) (SyncStats, error) {
	c, err := s.engine().plan(desired)
	if err != nil {
		return SyncStats{}, err
	}
	return c.both()
}

// Invalidate forces the next Sync to read the kernel.
func (s *RuleSync) Invalidate() { s.engine().Invalidate() }

type ruleKind struct{ nl nl.RuleTable }

func (ruleKind) key(r nl.Rule) ruleKey {
	return ruleKey{priority: r.Priority, table: r.Table, src: r.Src, dst: r.Dst}
}
func (ruleKind) same(a, b nl.Rule) bool        { return a.Same(b) && a.Protocol == b.Protocol }
func (ruleKind) inPlace(nl.Rule, nl.Rule) bool { return false }
func (ruleKind) normalize(r nl.Rule) nl.Rule   { r.Protocol = nl.RouteProtocol; return r }
func (k ruleKind) list() ([]nl.Rule, error) {
	all, err := k.nl.Rules(nl.FamilyAll)
	if err != nil {
		return nil, err
	}
	var mine []nl.Rule
	for _, r := range all {
		if r.Protocol == nl.RouteProtocol {
			mine = append(mine, r)
		}
	}
	return mine, nil
}

func (k ruleKind) apply(op nl.Op, rs []nl.Rule) []error {
	errs := make([]error, len(rs))
	for i, r := range rs {
		if op == nl.OpDel {
			errs[i] = k.nl.RuleDel(r)
		} else {
			errs[i] = k.nl.RuleAdd(r)
		}
	}
	return errs
}
