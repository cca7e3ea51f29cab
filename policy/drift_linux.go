package policy

import (
	"bytes"
	"fmt"
	"slices"
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
	if !ks.exists {
		return []string{"table inet " + TableName}, nil
	}
	var out []string
	for _, c := range sub.Chains {
		i := slices.IndexFunc(full.Chains, func(f Chain) bool { return f.Name == c.Name })
		if i < 0 {
			continue
		}
		want, err := wantRules(full.Chains[i])
		if err != nil {
			return nil, err
		}
		got, ok := ks.chains[c.Name]
		if !ok || len(got) != len(want) {
			out = append(out, "chain "+c.Name)
			continue
		}
		for j := range want {
			if !bytes.Equal(want[j].fp, got[j].fp) || want[j].cmt != got[j].comment {
				out = append(out, fmt.Sprintf("chain %s (rule %d)", c.Name, j))
				break
			}
		}
	}
	for _, s := range sub.Sets {
		i := slices.IndexFunc(full.Sets, func(f Set) bool { return f.Name == s.Name })
		k, ok := ks.sets[s.Name]
		if i < 0 || !ok {
			out = append(out, "set "+s.Name)
			continue
		}
		whole := len(full.Sets[i].Elems) == len(s.Elems)
		if whole && len(k.elems) != len(s.Elems) {
			out = append(out, "set "+s.Name)
			continue
		}
		for j, a := range s.Elems {
			if jump, in := k.elems[a]; !in || jump != s.jump(j) {
				out = append(out, fmt.Sprintf("set %s (%s)", s.Name, a))
				break
			}
		}
	}
	return out, nil
}
