package network

import (
	"net/netip"

	"github.com/twill-net/twill/nl"
)

// Rule is one of twill's netfilter rules, in terms both modes render: the
// iptables mode as a rule spec in one of twill's chains (Spec), the
// nftables mode as expressions in its own table (package nftables).
type Rule struct {
	// Table and Chain are the iptables table and twill chain; Table also
	// says which of the nftables table's chains holds the rule (nat:
	// postrouting, filter: forward).
	Table, Chain string
	Src, Dst     Match // an invalid Prefix matches any address
	Verdict      Verdict
	Comment      string
}

// Match is an address match: inside Prefix, or outside it when Not.
type Match struct {
	Prefix netip.Prefix
	Not    bool
}

// Verdict is what a matching rule does.
type Verdict int

const (
	Return     Verdict = iota // leave twill's chain (no NAT)
	Masquerade                // source NAT to the outgoing interface's address, fully random ports
	Accept                    // accept the forwarded packet
)

// Spec is the rule as iptables arguments after "-A chain".
func (r Rule) Spec() []string {
	var s []string
	for _, m := range []struct {
		flag string
		m    Match
	}{{"-s", r.Src}, {"-d", r.Dst}} {
		if !m.m.Prefix.IsValid() {
			continue
		}
		if m.m.Not {
			s = append(s, "!")
		}
		s = append(s, m.flag, m.m.Prefix.String())
	}
	s = append(s, "-m", "comment", "--comment", r.Comment)
	switch r.Verdict {
	case Return:
		s = append(s, "-j", "RETURN")
	case Masquerade:
		s = append(s, "-j", "MASQUERADE", "--random-fully")
	case Accept:
		s = append(s, "-j", "ACCEPT")
	}
	return s
}

// Jump is the rule in a built-in chain that sends traffic to twill's chain.
type Jump struct {
	Table, From, To string
}

// Jumps are the entry points into twill's chains.
var Jumps = []Jump{
	{Table: "nat", From: "POSTROUTING", To: nl.ChainMasquerade},
	{Table: "filter", From: "FORWARD", To: nl.ChainForward},
}

// MasqRules are the NAT rules for traffic leaving the cluster Network:
// pod-to-pod traffic keeps its addresses, traffic from pods to the outside
// is masqueraded, and so is traffic from outside the Network to pods on
// other nodes (so replies come back through this node).
func MasqRules(cluster, local netip.Prefix) []Rule {
	multicast := netip.MustParsePrefix("224.0.0.0/4")
	if cluster.Addr().Is6() {
		multicast = netip.MustParsePrefix("ff00::/8")
	}
	in, out := Match{Prefix: cluster}, Match{Prefix: cluster, Not: true}
	nat := func(src, dst Match, v Verdict, comment string) Rule {
		return Rule{Table: "nat", Chain: nl.ChainMasquerade, Src: src, Dst: dst, Verdict: v, Comment: comment}
	}
	return []Rule{
		nat(in, in, Return, "twill: pod to pod"),
		nat(in, Match{Prefix: multicast, Not: true}, Masquerade, "twill: pod to outside"),
		nat(out, Match{Prefix: local}, Return, "twill: outside to local pods"),
		nat(out, in, Masquerade, "twill: outside to remote pods"),
	}
}

// ForwardRules accept forwarded traffic from and to the cluster Network,
// for hosts whose FORWARD policy is DROP.
func ForwardRules(cluster netip.Prefix) []Rule {
	fwd := func(src, dst Match, comment string) Rule {
		return Rule{Table: "filter", Chain: nl.ChainForward, Src: src, Dst: dst, Verdict: Accept, Comment: comment}
	}
	return []Rule{
		fwd(Match{Prefix: cluster}, Match{}, "twill: from pods"),
		fwd(Match{}, Match{Prefix: cluster}, "twill: to pods"),
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

// RuleDrift is how the kernel's rules differ from the desired ones, each
// entry a line an operator can read.
type RuleDrift struct {
	Missing, Extra, Wrong []string
}

// Clean reports whether the kernel holds exactly the desired rules.
func (d RuleDrift) Clean() bool { return len(d.Missing)+len(d.Extra)+len(d.Wrong) == 0 }
