package policy

import (
	"net/netip"
)

// TableName is the policy table, in the inet family, apart from twill's
// masquerade table so that each is rewritten on its own.
const TableName = "twill-policy"

// ChainForward is the base chain on the forward hook: pod to pod, and
// pod to anywhere off the node.
const ChainForward = "forward"

// ChainInput is the base chain on the input hook: a local pod's packets to
// the node itself (its addresses, its hostPorts and hostNetwork pods),
// which never cross the forward hook. It sends them to the pod's egress
// chain, as ChainForward does. Every other chain is a pod's.
const ChainInput = "input"

// BaseChains are the base chains, in the order a Ruleset holds them.
var BaseChains = []string{ChainForward, ChainInput}

// IsBase says whether a chain of the table is a base chain.
func IsBase(name string) bool { return name == ChainForward || name == ChainInput }

// Ruleset is the desired content of the policy table.
type Ruleset struct {
	Sets []Set // sorted by name
	// Chains are the base chains (BaseChains), the shared Admin chains
	// by name, then each local pod's, by pod.
	Chains []Chain
}

// Set is a named set of addresses of one family. A verdict map (VMap)
// sends an address in Elems[i] to chain Jumps[i]: a jump, or with Goto a
// goto (the chain's return is the caller's).
type Set struct {
	Name  string
	V6    bool
	Elems []netip.Addr // sorted, unique
	VMap  bool
	Goto  bool
	Jumps []string
}

// Verdict ends a rule.
type Verdict int

// Verdicts.
const (
	Accept Verdict = iota
	Drop
	Return // back to the base chain: allowed by this chain
	Jump
	Continue // no verdict: the next rule decides
	// Goto goes on in chain Target and does not come back: its return
	// is this chain's (a ClusterNetworkPolicy's Pass, to the tiers after
	// the Admin tier).
	Goto
)

// Addr matches a packet's source or destination address. At most one of
// Set and Prefix is set; NotSet excludes a set's members after Prefix.
type Addr struct {
	Set     string       // in this named set
	Prefix  netip.Prefix // in this prefix
	Except  []netip.Prefix
	NotSet  string // and not in this named set
	NotSetV bool   // (NotSet's family: true for IPv6)
	// VMap jumps to the chain this verdict map gives the address, if it
	// gives one; the rule goes on otherwise, and after the chain returns.
	VMap string
}

func (a Addr) empty() bool {
	return a.Set == "" && !a.Prefix.IsValid() && a.NotSet == "" && a.VMap == ""
}

// jump is the chain element i of a verdict map jumps to ("" in a set).
func (s Set) jump(i int) string {
	if !s.VMap || i >= len(s.Jumps) {
		return ""
	}
	return s.Jumps[i]
}

// target is element i's verdict as nft.Elem.Target gives it.
func (s Set) target(i int) string {
	if j := s.jump(i); j != "" && s.Goto {
		return "goto " + j
	}
	return s.jump(i)
}

// JumpMap is the verdict map that sends a local pod's packets to its
// chains: dir "eg" by source address, "in" by destination.
func JumpMap(dir string, v6 bool) string {
	if v6 {
		return "jump-" + dir + "-6"
	}
	return "jump-" + dir + "-4"
}

// Rule is one rule of a chain.
type Rule struct {
	V6          bool // the family it matches (a rule matches one)
	Established bool // ct state established,related
	Src, Dst    Addr
	Proto       uint8 // IPPROTO_TCP, UDP, SCTP; 0 is any
	// NeighbourDiscovery matches IPv6 neighbour discovery (ICMPv6 types
	// 133–137), which the input hook sees from a pod with the pod's
	// address as source; conntrack never calls it established.
	NeighbourDiscovery bool
	PortLo             uint16 // destination port range; 0 is any
	PortHi             uint16
	Counter            bool
	Verdict            Verdict
	Target             string // Jump's or Goto's chain
	Comment            string // shown by nft list; names the policy for metrics
	// Why names the part of the policy the rule comes from
	// ("ns/name spec.ingress[0]"). It is not written to the kernel: the
	// verdict log and `twillctl policy explain` read it from Compile's
	// output.
	Why string `json:",omitempty"`
	// Sample, above 1, matches one packet in Sample, at random.
	Sample uint32
	// Limit, when set, matches at most Limit packets a second (bursts of
	// Limit); with LimitOver, only the packets over that rate. Two rules
	// with the same Limit, one Over, see the same packets and split them.
	Limit     uint32
	LimitOver bool
	// Log, when set, sends the packet's headers to NFLOG group LogGroup
	// with this prefix: twilld's verdict log reads them.
	Log string
}

// LogGroup is the NFLOG group of the policy table's log rules, read by
// twilld in each node's network namespace.
const LogGroup = 7163

// LogSnaplen is how much of a logged packet the kernel copies: its
// network and transport headers.
const LogSnaplen = 128

// LogRate bounds the denied packets logged, per pod and direction; the
// packets over it are counted by a rule of their own (UnloggedPrefix).
const LogRate = 10

// AllowedLogRate bounds the allowed connections logged, per direction,
// on the node.
const AllowedLogRate = 100

// UnloggedPrefix opens the comment of the rule that counts the denied
// packets over LogRate, which are not logged.
const UnloggedPrefix = "unlogged "

// Chain is a chain: a base chain (BaseChains) or a pod's.
type Chain struct {
	Name  string
	Rules []Rule
}
