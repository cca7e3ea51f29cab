package policy

import (
	"encoding/json"
	"net/netip"
	"slices"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
)

// FuzzCompile: whatever a policy's JSON holds, Compile returns a table
// the kernel would take: every jump names a chain of the table, every set
// a rule reads exists in its family, and every port range is in order.
func FuzzCompile(f *testing.F) {
	for _, seed := range []string{
		`{"metadata":{"namespace":"x","name":"p"},"spec":{"podSelector":{},"ingress":[{"from":[{"ipBlock":{"cidr":"10.0.0.0/8","except":["10.1.0.0/16"]}}],"ports":[{"port":80,"endPort":90}]}]}}`,
		`{"metadata":{"namespace":"x","name":"p"},"spec":{"podSelector":{"matchExpressions":[{"key":"pod","operator":"In","values":["a"]}]},"policyTypes":["Egress"],"egress":[{"to":[{"namespaceSelector":{}}],"ports":[{"port":"serve-80-tcp","protocol":"UDP"}]}]}}`,
		`{"metadata":{"namespace":"y","name":"q"},"spec":{"podSelector":{"matchLabels":{"pod":"a"}},"ingress":[{"from":[{"podSelector":{"matchExpressions":[{"key":"x","operator":"Bogus"}]}}]}]}}`,
		`{"metadata":{"namespace":"x","name":"p"},"spec":{"podSelector":{},"ingress":[{"ports":[{"port":0},{"port":70000},{"port":5,"endPort":1}]}]}}`,
		`{"metadata":{"namespace":"x","name":"p"},"spec":{"podSelector":{},"ingress":[{"from":[{"ipBlock":{"cidr":"10.0.0.0/8","except":["fd00::/8"]}}]}]}}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var np networkingv1.NetworkPolicy
		if json.Unmarshal(data, &np) != nil {
			return
		}
		s := snapshot(&np)
		s.LocalCIDRs = append(s.LocalCIDRs, mustPrefix("fd00:10:1::/64"))
		r := Compile(s).Ruleset
		chains := map[string]bool{}
		for _, c := range r.Chains {
			chains[c.Name] = true
		}
		sets := map[string]bool{}
		for _, st := range r.Sets {
			sets[st.Name] = st.V6
			if !slices.IsSortedFunc(st.Elems, func(a, b netipAddr) int { return a.Compare(b) }) {
				t.Fatalf("set %s unsorted: %v", st.Name, st.Elems)
			}
			for _, a := range st.Elems {
				if a.Is6() != st.V6 {
					t.Fatalf("set %s (v6=%v) holds %s", st.Name, st.V6, a)
				}
			}
			if st.VMap && len(st.Jumps) != len(st.Elems) {
				t.Fatalf("verdict map %s: %d elements, %d jumps", st.Name, len(st.Elems), len(st.Jumps))
			}
			for _, j := range st.Jumps {
				if !chains[j] {
					t.Fatalf("verdict map %s jumps to missing %q", st.Name, j)
				}
			}
		}
		for _, c := range r.Chains {
			for _, rule := range c.Rules {
				if (rule.Verdict == Jump || rule.Verdict == Goto) && !chains[rule.Target] {
					t.Fatalf("chain %s jumps to missing %q", c.Name, rule.Target)
				}
				for _, a := range []Addr{rule.Src, rule.Dst} {
					for _, name := range []string{a.Set, a.NotSet, a.VMap} {
						if v6, ok := sets[name]; name != "" && (!ok || v6 != rule.V6) {
							t.Fatalf("chain %s reads set %q (exists %v, v6 %v) from a v6=%v rule", c.Name, name, ok, v6, rule.V6)
						}
					}
					for _, e := range a.Except {
						if e.Addr().Is6() != rule.V6 {
							t.Fatalf("chain %s: except %s in a v6=%v rule", c.Name, e, rule.V6)
						}
					}
					if a.Prefix.IsValid() && a.Prefix.Addr().Is6() != rule.V6 {
						t.Fatalf("chain %s: prefix %s in a v6=%v rule", c.Name, a.Prefix, rule.V6)
					}
				}
				if rule.PortHi < rule.PortLo || rule.PortLo != 0 && rule.Proto == 0 {
					t.Fatalf("chain %s: ports %d-%d proto %d", c.Name, rule.PortLo, rule.PortHi, rule.Proto)
				}
			}
		}
	})
}

type netipAddr = netip.Addr

func mustPrefix(s string) netip.Prefix { return netip.MustParsePrefix(s) }
