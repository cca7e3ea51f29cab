package network

import (
	"net/netip"

	"github.com/twill-net/twill/backend/owned"
)

// Rule is one iptables rule in one of twill's chains.
type Rule struct {
	Table string
	Chain string
	Spec  []string
}

// Jump is the rule in a built-in chain that sends traffic to twill's chain.
type Jump struct {
	Table, From, To string
}

// Jumps are the entry points into twill's chains.
var Jumps = []Jump{
	{Table: "nat", From: "POSTROUTING", To: owned.ChainMasquerade},
	{Table: "filter", From: "FORWARD", To: owned.ChainForward},
}

// MasqRules are the NAT rules for traffic leaving the cluster Network:
// pod-to-pod traffic keeps its addresses, traffic from pods to the outside
// is masqueraded, and so is traffic from outside the Network to pods on
// other nodes (so replies come back through this node).
func MasqRules(cluster, local netip.Prefix) []Rule {
	c, l := cluster.String(), local.String()
	multicast := "224.0.0.0/4"
	if cluster.Addr().Is6() {
		multicast = "ff00::/8"
	}
	ch := owned.ChainMasquerade
	return []Rule{
		{"nat", ch, []string{"-s", c, "-d", c, "-m", "comment", "--comment", "twill: pod to pod", "-j", "RETURN"}},
		{"nat", ch, []string{"-s", c, "!", "-d", multicast, "-m", "comment", "--comment", "twill: pod to outside", "-j", "MASQUERADE", "--random-fully"}},
		{"nat", ch, []string{"!", "-s", c, "-d", l, "-m", "comment", "--comment", "twill: outside to local pods", "-j", "RETURN"}},
		{"nat", ch, []string{"!", "-s", c, "-d", c, "-m", "comment", "--comment", "twill: outside to remote pods", "-j", "MASQUERADE", "--random-fully"}},
	}
}

// ForwardRules accept forwarded traffic from and to the cluster Network,
// for hosts whose FORWARD policy is DROP.
func ForwardRules(cluster netip.Prefix) []Rule {
	c := cluster.String()
	ch := owned.ChainForward
	return []Rule{
		{"filter", ch, []string{"-s", c, "-m", "comment", "--comment", "twill: from pods", "-j", "ACCEPT"}},
		{"filter", ch, []string{"-d", c, "-m", "comment", "--comment", "twill: to pods", "-j", "ACCEPT"}},
	}
}

// DesiredRules is every rule twill wants for one address family.
func DesiredRules(cluster, local netip.Prefix, ipMasq bool) []Rule {
	var rs []Rule
	if ipMasq {
		rs = append(rs, MasqRules(cluster, local)...)
	}
	return append(rs, ForwardRules(cluster)...)
}
