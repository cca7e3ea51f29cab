package policy

import (
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strings"
)

// The Admin tier's chains, shared. Every local pod that the same
// ClusterNetworkPolicies select in the Admin tier, in one direction,
// walks the same rules: they name sets, not the pod. Written into each
// pod's chain, they made the table grow with pods times policies (100
// ClusterNetworkPolicies at 10,000 pods: 436,808 rules, more than one
// transaction holds). Those pods share one chain instead:
//
//	in:ns/pod
//	  <selected by: its NetworkPolicies and Baseline policies>
//	  goto cnp-in:<hash of the Admin policies' names>
//	cnp-in:<hash>
//	  <selected by: the Admin policies>
//	  <their rules>  Accept: return (to the base chain: allowed in this
//	                 direction), Deny: drop,
//	                 Pass: ip daddr vmap @rest-in-4 (goto in+:ns/pod)
//	  ip daddr vmap @rest-in-4       (the tier's end: goto in+:ns/pod)
//	in+:ns/pod
//	  <NetworkPolicy allow rules; drop>   when a NetworkPolicy isolates it
//	  <Baseline tier rules>               otherwise
//
// The rest maps (RestMap) send each such pod's addresses to its own rest
// chain; egress looks up the source address. A pod whose Admin rules are
// its own (a rule's named port, resolved against the pod) keeps them in
// its chain, as before (podChains).

// sharedPrefix opens the name of a shared Admin chain: no pod chain's
// name opens so ("in:", "eg:", "in+:", "eg+:").
const sharedPrefix = "cnp-"

// AdminTier opens the comment of a pod chain's goto to its shared Admin
// chain, which it names: twillctl status reads the chain's policies
// from there.
const AdminTier = "admin tier "

// IsShared says whether a chain of the table is a shared Admin chain.
func IsShared(name string) bool { return strings.HasPrefix(name, sharedPrefix) }

// RestMap is the verdict map that sends the packets of a local pod in a
// shared Admin chain on to its rest chain: dir "in" by destination
// address, "eg" by source. Its elements go to the chain (goto): the rest
// chain's return is the pod chain's.
func RestMap(dir string, v6 bool) string {
	if v6 {
		return "rest-" + dir + "-6"
	}
	return "rest-" + dir + "-4"
}

// sharedChain is a shared Admin chain and the number of local pod
// directions that go to it.
type sharedChain struct {
	chain Chain
	refs  int
}

// sharedName names the shared Admin chain of the policies, in order.
func sharedName(dir string, policies []string) string {
	h := sha256.Sum256([]byte(strings.Join(policies, "\x00")))
	return sharedPrefix + dir + ":" + hex.EncodeToString(h[:8])
}

// sharedAdmin returns the name of the shared chain of p's Admin tier in
// dir, made from admin (its rules) if no local pod had it yet, and counts
// p in it.
func (c *compiler) sharedAdmin(dir string, p *pod, admin []tierRule) string {
	by := c.adminBy[p.key+" "+dir]
	name := sharedName(dir, by)
	sc := c.shared[name]
	if sc == nil {
		rules := make([]Rule, 0, len(by)+len(admin)+2)
		for _, pol := range by {
			rules = append(rules, Rule{Counter: true, Verdict: Continue, Comment: SelectedBy + pol})
		}
		v4, v6 := c.families()
		rules = append(rules, sharedTierRules(admin, dir, v4, v6)...)
		for _, fam := range []struct{ on, v6 bool }{{v4, false}, {v6, true}} {
			if fam.on {
				rules = append(rules, restLookup(Rule{V6: fam.v6, Verdict: Continue}, dir))
			}
		}
		sc = &sharedChain{chain: Chain{Name: name, Rules: rules}}
		c.shared[name] = sc
	}
	sc.refs++
	return name
}

// restLookup makes r look up the pod's rest chain in its direction's
// rest map, as its verdict.
func restLookup(r Rule, dir string) Rule {
	if dir == "in" {
		r.Dst.VMap = RestMap(dir, r.V6)
	} else {
		r.Src.VMap = RestMap(dir, r.V6)
	}
	return r
}

// sharedTierRules lays out the Admin tier's rules in a shared chain, as
// tierRules does in a pod's: a Pass goes on to the pod's rest chain by
// the rest map, once for each family in use when it matches any address.
func sharedTierRules(trs []tierRule, dir string, v4, v6 bool) []Rule {
	var out []Rule
	for _, r := range tierRules(trs, "") {
		name, _, _ := strings.Cut(r.Comment, " ")
		if name != "pass" {
			out = append(out, r)
			continue
		}
		r.Verdict = Continue
		if !r.Src.empty() || !r.Dst.empty() {
			out = append(out, restLookup(r, dir))
			continue
		}
		for _, fam := range []struct{ on, v6 bool }{{v4, false}, {v6, true}} {
			if fam.on {
				r.V6 = fam.v6
				out = append(out, restLookup(r, dir))
			}
		}
	}
	return out
}

// sharesAdmin says whether local pod key goes to a shared Admin chain
// in egress and in ingress, once compiled (podChains).
func (c *compiler) sharesAdmin(key string) [2]bool {
	var out [2]bool
	for _, dir := range []string{"eg", "in"} {
		k := key + " " + dir
		out[dirIndex(dir)] = len(c.admin[k]) > 0 && !c.adminOwn[k]
	}
	return out
}

// unshare uncounts local pod key from the shared chains it went to.
func (c *compiler) unshare(key string) {
	for _, name := range c.sharedOf[key] {
		if sc := c.shared[name]; sc != nil {
			sc.refs--
		}
	}
	delete(c.sharedOf, key)
}

// sharedChains are the shared chains some local pod goes to; the others
// are forgotten.
func (c *compiler) sharedChains() []Chain {
	out := make([]Chain, 0, len(c.shared))
	for name, sc := range c.shared {
		if sc.refs <= 0 {
			delete(c.shared, name)
			continue
		}
		out = append(out, sc.chain)
	}
	slices.SortFunc(out, func(a, b Chain) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// fillRest sends each local pod in a shared Admin chain to its rest
// chain, in each direction it is in one.
func (c *compiler) fillRest(restMaps map[string]*Set) {
	for i, dir := range []string{"eg", "in"} {
		for _, p := range c.local {
			if c.sharedOf[p.key][i] == "" {
				continue
			}
			name := RestChainName(dir, p.key)
			for _, ip := range p.ips {
				if m := restMaps[RestMap(dir, ip.Is6())]; m != nil {
					m.Elems, m.Jumps = append(m.Elems, ip), append(m.Jumps, name)
				}
			}
		}
	}
}

// dirIndex is a direction's place in sharedOf's pairs.
func dirIndex(dir string) int {
	if dir == "eg" {
		return 0
	}
	return 1
}

// notIn is names without those in drop, in order.
func notIn(names, drop []string) []string {
	out := make([]string, 0, len(names))
	for _, n := range names {
		if !slices.Contains(drop, n) {
			out = append(out, n)
		}
	}
	return out
}

// restMapsOf are the rest maps, empty, of the directions and families
// in use, when a shared chain is.
func restMapsOf(shared []Chain, v4, v6 bool) map[string]*Set {
	out := map[string]*Set{}
	for _, sc := range shared {
		dir := strings.TrimPrefix(sc.Name[:strings.Index(sc.Name, ":")], sharedPrefix)
		for _, fam := range []struct{ on, v6 bool }{{v4, false}, {v6, true}} {
			if name := RestMap(dir, fam.v6); fam.on && out[name] == nil {
				out[name] = &Set{Name: name, V6: fam.v6, VMap: true, Goto: true}
			}
		}
	}
	return out
}
