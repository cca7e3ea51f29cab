package policy

import (
	"fmt"
	"slices"

	"github.com/twill-net/twill/nl/nftsync"
)

// Drifted names the chains and sets of sub (a Subset of full, the table as
// last written) that the kernel's table does not hold as written: drift
// that twilld has not repaired yet, or cannot. A set sub holds in part
// (a verdict map or known set cut to some addresses) is checked for those
// elements alone.
func (t *Table) Drifted(full, sub Ruleset) ([]string, error) {
	ks, err := t.readKernel()
	if err != nil {
		return nil, err
	}
	if !ks.Exists {
		return []string{"table inet " + TableName}, nil
	}
	var out []string
	for _, c := range sub.Chains {
		i := slices.IndexFunc(full.Chains, func(f Chain) bool { return f.Name == c.Name })
		if i < 0 {
			continue
		}
		want, err := ruleStates(full.Chains[i])
		if err != nil {
			return nil, err
		}
		got, ok := ks.Chains[c.Name]
		if !ok || len(got.Rules) != len(want) {
			out = append(out, "chain "+c.Name)
			continue
		}
		if j := nftsync.FirstDifference(got.Rules, want); j >= 0 {
			out = append(out, fmt.Sprintf("chain %s (rule %d)", c.Name, j))
		}
	}
	for _, s := range sub.Sets {
		i := slices.IndexFunc(full.Sets, func(f Set) bool { return f.Name == s.Name })
		k, ok := ks.Sets[s.Name]
		if i < 0 || !ok {
			out = append(out, "set "+s.Name)
			continue
		}
		whole := len(full.Sets[i].Elems) == len(s.Elems)
		if whole && len(k.Elems) != len(s.Elems) {
			out = append(out, "set "+s.Name)
			continue
		}
		for j, a := range s.Elems {
			if jump, in := k.Elems[string(a.AsSlice())]; !in || jump != s.target(j) {
				out = append(out, fmt.Sprintf("set %s (%s)", s.Name, a))
				break
			}
		}
	}
	return out, nil
}

// ruleStates is a chain's rules as the kernel would hold them.
func ruleStates(c Chain) ([]nftsync.RuleState, error) {
	out := make([]nftsync.RuleState, len(c.Rules))
	for i, r := range renderRules(c) {
		fp, err := nftsync.Fingerprint(r.Exprs)
		if err != nil {
			return nil, fmt.Errorf("rendering chain %s rule %d: %w", c.Name, i, err)
		}
		out[i] = nftsync.RuleState{Comment: r.Comment, FP: fp}
	}
	return out, nil
}
