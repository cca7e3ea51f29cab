package nftables

import (
	"fmt"
	"slices"

	"github.com/twill-net/twill/network"
	"github.com/twill-net/twill/nl/nftsync"
)

// desired renders the rules of every family into twill's chains.
func desired(networks []network.NetworkPair, ipMasq bool) (nftsync.Table, error) {
	var want nftsync.Table
	rules := map[string][]nftsync.Rule{}
	for _, c := range baseChains() {
		want.Chains = append(want.Chains, nftsync.Chain{Name: c.Name, Hook: c})
	}
	for _, np := range networks {
		for _, r := range network.DesiredRules(np.Cluster, np.Local, ipMasq) {
			chain := chainFor(r.Table)
			if !slices.ContainsFunc(want.Chains, func(c nftsync.Chain) bool { return c.Name == chain }) {
				return nftsync.Table{}, fmt.Errorf("rule %q: no nftables chain for iptables table %q", r.Comment, r.Table)
			}
			// Each family has its own rule under the same comment.
			rules[chain] = append(rules[chain], nftsync.Rule{Comment: r.Comment + " (" + family(np) + ")", Exprs: ruleExprs(r)})
		}
	}
	for i, c := range want.Chains {
		want.Chains[i].Rules = nftsync.Static(rules[c.Name])
	}
	return want, nil
}

func family(np network.NetworkPair) string {
	if np.Cluster.Addr().Is6() {
		return "ipv6"
	}
	return "ipv4"
}
